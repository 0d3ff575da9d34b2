#!/bin/bash
# CPU rehearsal of the evaluation command (lab/gpu/evaluate.sh) against the stand-in server
# (scripts/gpu/dryrun/fake_server.py): every staged chunk received into a store, assembled and
# unpacked by device_env.sh, the SmolLM2 weights rebuilt and checked, then evaluate.sh end to end
# (launch, health wait, interleaved flushed rounds, analysis, packing). It proves the scripts, not
# the server: no number from it means anything.
#   [PROFILES="none reference-kimi-tp8"] [EVAL_ARGS=...] [FAIL_ONCE="PORT ..."] \
#     bash lab/gpu/evaluate_dryrun.sh [WORKDIR]
# FAIL_ONCE: the stand-ins on those ports exit at their first start (rehearses the retry).
# FAKE_GPU_MIB: an nvidia-smi stand-in that reports one GPU of that many MiB (rehearses what
# evaluate.sh decides from the card, e.g. STAGGER's default under 100 GiB)
# Needs a python3 with torch, numpy, safetensors (and matplotlib for the PNG): PY=/path/python
# BUNDLE, STAGE: the bundle and its chunk folder (default .scratch/gpu-bundle; STAGE by default the
# bundle's sibling, gpu-bundle* -> gpu-stage*, as in lossless_dryrun.sh; the 0.5.23 build's needs a
# PY that is a CPython 3.12 like the machine's, since that site tree holds cp312 torch 2.14.1)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
D=${1:-$ROOT/.scratch/eval-dryrun}
PY=${PY:-$ROOT/.venv-0.5.16/bin/python}
BUNDLE=$(cd "${BUNDLE:-$ROOT/.scratch/gpu-bundle}" && pwd)
STAGE=${STAGE:-$(dirname "$BUNDLE")/$(basename "$BUNDLE" | sed 's/^gpu-bundle/gpu-stage/')}
rm -rf "$D"; mkdir -p "$D/home" "$D/out" "$D/store" "$D/bin"
printf '#!/bin/sh\nexec %s "$@"\n' "$PY" > "$D/bin/python3"; chmod +x "$D/bin/python3"
{ echo '#!/bin/bash'
  echo 'port=$(echo "$@" | sed -n "s/.*--port \([0-9]*\).*/\1/p")'
  echo "if [[ \" ${FAIL_ONCE:-} \" == *\" \$port \"* ]] && [ ! -f \"$D/failed-\$port\" ]; then"
  echo "  touch \"$D/failed-\$port\"; echo 'stand-in: failing its first start on purpose'; exit 3"
  echo "fi"
  # (named as SGLang's scheduler at TP=1: evaluate.sh's PYSPY_SERVERS finds the process by it)
  echo "exec python3 -X sglang::scheduler $ROOT/scripts/gpu/dryrun/fake_server.py \"\$@\""; } > "$D/bin/launch"
chmod +x "$D/bin/launch"
if [ -n "${FAKE_GPU_MIB:-}" ]; then
  { echo '#!/bin/bash'
    echo 'case "$*" in'
    echo '  *-L*) echo "GPU 0: stand-in (UUID: GPU-0)";;'
    echo "  *name*) echo \"stand-in, $FAKE_GPU_MIB MiB\";;"
    echo "  *nounits*) echo $FAKE_GPU_MIB;;"
    echo "  *) echo \"0, 0 MiB, $FAKE_GPU_MIB MiB\";;"
    echo 'esac'; } > "$D/bin/nvidia-smi"
  chmod +x "$D/bin/nvidia-smi"
fi
for c in "$STAGE"/chunk-*; do
  python3 "$ROOT/scripts/gpu/stage_chunks.py" receive "$c" "$D/store"
done
cd "$ROOT"
HOME=$D/home OUT=$D/out STORE=$D/store PATH="$D/bin:$PATH" DEADLINE_S=${DEADLINE_S:-300} \
  ANALYZE_S=${ANALYZE_S:-20} EVAL_ARGS=${EVAL_ARGS:-"--max-new-tokens 24 --per-set 3"} \
  PROFILES=${PROFILES:-"none reference-kimi-tp8"} SGLANG_LAUNCH="$D/bin/launch" \
  bash "$ROOT/lab/gpu/evaluate.sh" "$BUNDLE"
echo "--- rehearsal output in $D/out:"; ls -la "$D/out"
# the GPU machine hands back 8 files of $OUT at most (and none deeper than two folders): a rehearsal
# that leaves more fails here rather than on the machine, where the rest would be lost
n=$(find "$D/out" -type f | wc -l)
if [ "$n" -gt 8 ]; then echo "rehearsal FAILED: $n files in OUT, the GPU machine hands back 8" >&2; exit 1; fi
echo "--- in evaluate.tar.xz, eval/out:"; tar -tJf "$D/out/evaluate.tar.xz" | grep '^eval/out/.' || true
