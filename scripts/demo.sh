#!/usr/bin/env bash
# The main job on a fresh machine: the pinned SGLang in a local environment, patched, with its status and
# the flags this project adds.   scripts/demo.sh [VERSION]   (make demo VERSION=0.5.16)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VER=${1:-$(awk '!/^#/ && NF {v=$1} END {print v}' "$ROOT/pins.txt")}
VENV=$ROOT/.venv-$VER
bash "$ROOT/scripts/setup_test_env.sh" "$VER" "$VENV"
echo "== apply the $VER series (a second run is a no-op) =="
"$VENV/bin/python" -m fastverify patches apply
"$VENV/bin/python" -m fastverify patches apply
echo "== status =="
"$VENV/bin/python" -m fastverify patches status
echo "== the flags sglang-fastverify adds to python -m sglang.launch_server =="
"$VENV/bin/python" -m sglang.launch_server --help 2>/dev/null \
  | grep -E -A3 -- "--(nccl-|tp-allreduce|speculative-ngram-verify-mode|enable-verify-timing|verify-timing)" \
  | grep -v -- "^--$" || { echo "no fastverify flags found in --help" >&2; exit 1; }
