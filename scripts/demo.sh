#!/usr/bin/env bash
# The main job on a fresh machine: the pinned SGLang in a local environment, patched, with its status and
# the flags this project adds.   scripts/demo.sh [VERSION]   (make demo VERSION=0.5.16)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VER=${1:-$(awk '!/^#/ && NF {v=$1} END {print v}' "$ROOT/pins.txt")}
VENV=$ROOT/.venv-$VER
bash "$ROOT/scripts/setup_test_env.sh" "$VER" "$VENV"
echo "== apply the $VER series (a second run is a no-op; ~10 s each) =="
"$VENV/bin/python" -m fastverify patches apply
"$VENV/bin/python" -m fastverify patches apply
echo "== status =="
"$VENV/bin/python" -m fastverify patches status
echo "== the flags sglang-fastverify adds to python -m sglang.launch_server (reading SGLang's parser, ~20 s) =="
COLUMNS=${COLUMNS:-100} "$VENV/bin/python" "$ROOT/scripts/print_flags.py"
echo "== ready =="
echo "SGLang $VER patched in $VENV. The fastverify command: $VENV/bin/fastverify"
echo "(or: export PATH=\"$VENV/bin:\$PATH\"; then fastverify --help, make replay, make sim, make advise)"
