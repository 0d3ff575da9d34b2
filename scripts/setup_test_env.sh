#!/usr/bin/env bash
# Build the CPU test environment for one pinned SGLang release.
#
#   scripts/setup_test_env.sh VERSION [VENV]      (VENV defaults to .venv-VERSION)
#
# The environment has SGLang installed for real (--no-deps, from PyPI), the exact pins SGLang declares for
# the packages its imports need, torch from the local CPU wheel, and this project on sys.path. Two things
# PyPI cannot give a CPU machine are replaced by stand-ins from tests/stubs/ (see tests/stubs/README.md):
# torchvision (imported at SGLang's top level) and sgl_kernel (CUDA-only; put on sys.path by the tests).
# A stamp keyed by what the environment is built from (the package list, the constraint rules, the pins in
# pins.txt and the stand-ins) makes a second run a no-op. Every run puts a `fastverify` command into VENV/bin.
# Takes ~3 min with a warm pip cache on 2 cores (a cold one downloads ~1 GB more); ~2.5 GB of disk.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VER=${1:?usage: setup_test_env.sh VERSION [VENV]}
VENV=${2:-$ROOT/.venv-$VER}
PY=${PYTHON:-python3.11}
LINE=$(awk -v v="$VER" '$1==v' "$ROOT/pins.txt")
[ -n "$LINE" ] || { echo "error: SGLang $VER is not in pins.txt (supported: $(awk '!/^#/ && NF {print $1}' "$ROOT/pins.txt" | xargs))" >&2; exit 2; }
pin() { echo "$LINE" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
TORCH=$(pin torch_test)
# What the environment is made of (the stamp's key): the packages installed next to SGLang...
PKGS="numpy orjson psutil pybase64 requests packaging pillow starlette tqdm ipython pydantic aiohttp msgspec
  transformers pyzmq dill openai partial-json-parser xgrammar sentencepiece triton==3.8.0 apache-tvm-ffi ninja
  einops compressed-tensors gguf setproctitle uvicorn fastapi pytest prometheus-client matplotlib"
# ...and SGLang's own exact pins (Requires-Dist with ==), minus the torch family, read from its wheel.
CONSTRAINTS_PY=$(cat <<'PYEOF'
import re, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
for line in z.read(meta).decode().splitlines():
    if not line.startswith("Requires-Dist:") or "extra ==" in line:
        continue
    req = line.split(":", 1)[1].split(";")[0].strip()
    req = re.sub(r"\[[^\]]*\]", "", req).replace(" ", "")
    name = re.split(r"[=<>!~]", req)[0].lower()
    if "==" in req and name not in ("torch", "torchaudio", "torchvision", "torchcodec"):
        print(req)
PYEOF
)
# ...and the rest of the recipe below: bump RECIPE when a change to it changes what an environment holds.
RECIPE=1
KEY=$( { echo "$RECIPE"; echo "$PKGS"; echo "$CONSTRAINTS_PY"; grep -v '^#' "$ROOT/pins.txt"
  cat $(find "$ROOT/tests/stubs/torchvision" -type f -name "*.py" | sort); } | sha256sum | cut -c1-16)
PROGRESS_TAG="setup $VER"
. "$ROOT/scripts/progress.sh"  # say, heartbeat, pip_progress
trap heartbeat_end EXIT
# `fastverify ...` from this environment: a two-line wrapper (the package itself is on sys.path via
# fastverify-src.pth); `pip install -e .` gives the same command from pyproject's [project.scripts].
cli_wrapper() {
  printf '#!/bin/sh\nexec "%s" -m fastverify "$@"\n' "$VENV/bin/python" > "$VENV/bin/fastverify"
  chmod +x "$VENV/bin/fastverify"
}
DL=$ROOT/.downloads; mkdir -p "$DL"
WHL=$(ls "$DL"/sglang-"$VER"-*.whl 2>/dev/null | head -1 || true)
if [ -z "$WHL" ]; then
  say "downloading the SGLang $VER wheel"
  "$PY" -m pip download --progress-bar off --no-deps --only-binary=:all: -d "$DL" "sglang==$VER" | pip_progress
  WHL=$(ls "$DL"/sglang-"$VER"-*.whl | head -1)
fi
say "wheel $(basename "$WHL")"
# The pristine upstream sources, unpacked once: the drift guards and series tests read them (never imported).
PRISTINE=$ROOT/.scratch/pristine/$VER
if [ ! -d "$PRISTINE/sglang" ]; then
  rm -rf "$PRISTINE.tmp" && mkdir -p "$PRISTINE.tmp"
  "$PY" -m zipfile -e "$WHL" "$PRISTINE.tmp" && rm -rf "$PRISTINE" && mv "$PRISTINE.tmp" "$PRISTINE"
  say "pristine sources in $PRISTINE"
fi
if [ -f "$VENV/.fastverify-stamp" ] && [ "$(cat "$VENV/.fastverify-stamp")" = "$KEY" ]; then
  cli_wrapper
  echo "[setup $VER] environment up to date: $VENV"; exit 0
fi
rm -rf "$VENV"
say "creating $VENV"
"$PY" -m venv "$VENV"
CONS=$VENV/constraints.txt
# SGLang's own exact pins, plus the CPU torch.
"$PY" -c "$CONSTRAINTS_PY" "$WHL" > "$CONS"
echo "torch==$TORCH" >> "$CONS"
say "installing SGLang's dependencies and torch $TORCH: ~3 min with a warm pip cache, longer cold"
# (pip warns once per package about the local index folders it does not hold; those lines are dropped)
heartbeat "installing dependencies"
# shellcheck disable=SC2086  # PKGS is a list of words
"$VENV/bin/pip" install --progress-bar off -c "$CONS" "torch==$TORCH" $PKGS \
  2> >(grep -v "is ignored: it is neither a file nor a directory" >&2) | pip_progress
heartbeat_end
say "dependencies installed; installing the SGLang $VER wheel itself (~20 s)"
"$VENV/bin/pip" install -q --no-deps "$WHL"
SP=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
cp -r "$ROOT/tests/stubs/torchvision" "$SP/torchvision"
echo "$ROOT/python" > "$SP/fastverify-src.pth"
cli_wrapper
say "checking the imports (torch, SGLang, fastverify; ~20 s)"
"$VENV/bin/python" -c "import torch, sglang, fastverify; assert torch.__version__.startswith('$TORCH'), torch.__version__; print('sglang', sglang.__version__, 'torch', torch.__version__)"
echo "$KEY" > "$VENV/.fastverify-stamp"
say "ready: $VENV ($(du -sh "$VENV" | cut -f1))"
