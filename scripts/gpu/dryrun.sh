#!/bin/bash
# CPU rehearsal of the whole GPU-machine sequence, with a stand-in server (dryrun/fake_server.py):
# every staged chunk received into a store, assembled, checksummed and unpacked by device_env.sh, the SmolLM2
# weights dequantized and checked against the host checksum, then run_e2e.sh end to end (launch, health wait,
# client, stop, identity check, packing). It proves the scripts, not the server: no number from it means anything.
#   [PLAN="s_plain s_tree"] bash scripts/gpu/dryrun.sh [WORKDIR]     needs a python3 with torch, numpy and safetensors: PY=/path/python
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
D=${1:-$ROOT/.scratch/gpu-dryrun}
PY=${PY:-$ROOT/.scratch/convert-venv/bin/python}
rm -rf "$D"; mkdir -p "$D/home" "$D/out" "$D/store" "$D/bin"
printf '#!/bin/sh\nexec %s "$@"\n' "$PY" > "$D/bin/python3"; chmod +x "$D/bin/python3"   # (a venv python must not be symlinked)
for c in "$ROOT"/.scratch/gpu-stage/chunk-*; do python3 "$ROOT/scripts/gpu/stage_chunks.py" receive "$c" "$D/store"; done
HOME=$D/home OUT=$D/out STORE=$D/store DEADLINE_S=${DEADLINE_S:-400} PATH="$D/bin:$PATH" \
  SGLANG_LAUNCH="python3 $ROOT/scripts/gpu/dryrun/fake_server.py" bash "$ROOT/.scratch/gpu-bundle/run_e2e.sh" "${PLAN:-all}"
echo "--- rehearsal output in $D/out:"; ls -la "$D/out"
