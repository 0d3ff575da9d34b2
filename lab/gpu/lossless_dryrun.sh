#!/bin/bash
# CPU rehearsal of lossless.sh against lossless_stand_in.py: launch, health wait, both checks, the
# summaries and the packing, in the layout the GPU command writes (no staging: PREPARE=0; the
# staging is rehearsed by scripts/gpu/dryrun.sh). Proves the scripts, not the servers.
#   bash lab/gpu/lossless_dryrun.sh [WORKDIR]        PY=/path/python (default .venv-0.5.16's)
# BUNDLE=DIR [STAGE=DIR]: stage too, as on the machine: every chunk of STAGE (default the
# bundle's sibling, gpu-bundle* -> gpu-stage*) received into a store, then lossless.sh with the
# bundle (device_env.sh assembles, unpacks, rebuilds the weights). For the 0.5.23 bundle PY must
# be a CPython 3.12 like the machine's: its site tree holds cp312 torch 2.14.1.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
D=${1:-$ROOT/.scratch/lossless-dryrun}
PY=${PY:-$ROOT/.venv-0.5.16/bin/python}
rm -rf "$D"; mkdir -p "$D/home" "$D/out" "$D/bin"
printf '#!/bin/sh\nexec %s "$@"\n' "$PY" > "$D/bin/python3"; chmod +x "$D/bin/python3"
PREPARE=0
if [ -n "${BUNDLE:-}" ]; then
  BUNDLE=$(cd "$BUNDLE" && pwd)
  STAGE=${STAGE:-$(dirname "$BUNDLE")/$(basename "$BUNDLE" | sed 's/^gpu-bundle/gpu-stage/')}
  mkdir -p "$D/store"
  for c in "$STAGE"/chunk-*; do
    python3 "$ROOT/scripts/gpu/stage_chunks.py" receive "$c" "$D/store"
  done
  PREPARE=1
fi
cd "$ROOT"
HOME=$D/home OUT=$D/out PATH="$D/bin:$PATH" PREPARE=$PREPARE HEALTH_WAIT_S=60 STORE=$D/store \
  SGLANG_LAUNCH="python3 $ROOT/lab/gpu/lossless_stand_in.py" \
  GREEDY_ARGS=${GREEDY_ARGS:-"--max-new-tokens 16"} TOKENIZE=${TOKENIZE-} \
  SAMPLED_ARGS=${SAMPLED_ARGS:-"--sets grounded --per-set 2 --samples 100 --tokens 3"} \
  bash "$ROOT/lab/gpu/lossless.sh" ${BUNDLE:+"$BUNDLE"}
echo "--- rehearsal output in $D/out:"; ls "$D/out" "$D/out/greedy"
