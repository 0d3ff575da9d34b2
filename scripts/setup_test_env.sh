#!/usr/bin/env bash
# Build the CPU test environment for one pinned SGLang release.
#
#   scripts/setup_test_env.sh VERSION [VENV]      (VENV defaults to .venv-VERSION)
#
# The environment has SGLang installed for real (--no-deps, from PyPI), the exact pins SGLang declares for
# the packages its imports need, torch from the local CPU wheel, and this project on sys.path. Two things
# PyPI cannot give a CPU machine are replaced by stand-ins from tests/stubs/ (see tests/stubs/README.md):
# torchvision (imported at SGLang's top level) and sgl_kernel (CUDA-only; put on sys.path by the tests).
# A stamp keyed by this script, pins.txt and the stand-ins makes a second run a no-op.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VER=${1:?usage: setup_test_env.sh VERSION [VENV]}
VENV=${2:-$ROOT/.venv-$VER}
PY=${PYTHON:-python3.11}
LINE=$(awk -v v="$VER" '$1==v' "$ROOT/pins.txt")
[ -n "$LINE" ] || { echo "error: SGLang $VER is not in pins.txt (supported: $(awk '!/^#/ && NF {print $1}' "$ROOT/pins.txt" | xargs))" >&2; exit 2; }
pin() { echo "$LINE" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
TORCH=$(pin torch_test)
KEY=$(cat "$0" "$ROOT/pins.txt" $(find "$ROOT/tests/stubs/torchvision" -type f -name "*.py" | sort) | sha256sum | cut -c1-16)
t0=$(date +%s); say() { echo "[setup $VER] $(( $(date +%s) - t0 ))s: $*"; }
DL=$ROOT/.downloads; mkdir -p "$DL"
WHL=$(ls "$DL"/sglang-"$VER"-*.whl 2>/dev/null | head -1 || true)
if [ -z "$WHL" ]; then
  "$PY" -m pip download -q --no-deps --only-binary=:all: -d "$DL" "sglang==$VER"
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
  echo "[setup $VER] environment up to date: $VENV"; exit 0
fi
rm -rf "$VENV"
"$PY" -m venv "$VENV"
CONS=$VENV/constraints.txt
# SGLang's own exact pins (Requires-Dist with ==), minus the torch family, plus the CPU torch.
"$PY" - "$WHL" > "$CONS" <<'PYEOF'
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
echo "torch==$TORCH" >> "$CONS"
# (pip warns once per package about the local index folders it does not hold; those lines are dropped)
"$VENV/bin/pip" install -q -c "$CONS" "torch==$TORCH" \
  numpy orjson psutil pybase64 requests packaging pillow starlette tqdm ipython pydantic aiohttp msgspec \
  transformers pyzmq dill openai partial-json-parser xgrammar sentencepiece triton==3.8.0 apache-tvm-ffi ninja \
  einops compressed-tensors gguf setproctitle uvicorn fastapi pytest prometheus-client matplotlib \
  2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
say "dependencies installed"
"$VENV/bin/pip" install -q --no-deps "$WHL"
SP=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
cp -r "$ROOT/tests/stubs/torchvision" "$SP/torchvision"
echo "$ROOT/python" > "$SP/fastverify-src.pth"
"$VENV/bin/python" -c "import torch, sglang, fastverify; assert torch.__version__.startswith('$TORCH'), torch.__version__; print('sglang', sglang.__version__, 'torch', torch.__version__)"
echo "$KEY" > "$VENV/.fastverify-stamp"
say "ready: $VENV ($(du -sh "$VENV" | cut -f1))"
