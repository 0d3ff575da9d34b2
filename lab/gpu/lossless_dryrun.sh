#!/bin/bash
# CPU rehearsal of lossless.sh against lossless_stand_in.py: launch, health wait, both checks, the
# summaries and the packing, in the layout the GPU command writes (no staging: PREPARE=0; the
# staging is rehearsed by scripts/gpu/dryrun.sh). Proves the scripts, not the servers.
#   bash lab/gpu/lossless_dryrun.sh [WORKDIR]        PY=/path/python (default .venv-0.5.16's)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
D=${1:-$ROOT/.scratch/lossless-dryrun}
PY=${PY:-$ROOT/.venv-0.5.16/bin/python}
rm -rf "$D"; mkdir -p "$D/home" "$D/out" "$D/bin"
printf '#!/bin/sh\nexec %s "$@"\n' "$PY" > "$D/bin/python3"; chmod +x "$D/bin/python3"
cd "$ROOT"
HOME=$D/home OUT=$D/out PATH="$D/bin:$PATH" PREPARE=0 HEALTH_WAIT_S=60 \
  SGLANG_LAUNCH="python3 $ROOT/lab/gpu/lossless_stand_in.py" \
  GREEDY_ARGS=${GREEDY_ARGS:-"--max-new-tokens 16"} TOKENIZE=${TOKENIZE-} \
  SAMPLED_ARGS=${SAMPLED_ARGS:-"--sets grounded --per-set 2 --samples 100 --tokens 3"} \
  bash "$ROOT/lab/gpu/lossless.sh"
echo "--- rehearsal output in $D/out:"; ls "$D/out" "$D/out/greedy"
