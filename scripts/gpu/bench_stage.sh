#!/bin/bash
# Stage what the microbenchmarks need on the offline GPU machines into one ignored folder (default .whl/bench),
# to be carried by the run call and unpacked by scripts/gpu/bench_run.sh:
#   fi614.tar.xz   FlashInfer 0.6.14 (trtllm fused all-reduce + residual + RMSNorm), unzipped wheel tree, with
#                  the comm module pre-built for sm_90a when the local nvcc matches the GPU machine's (13.0.88)
#   fi072.tar.xz   FlashInfer 0.7.2 cut to what its PCIe IPC all-reduce needs: the 65 MB wheel carries
#                  ~330 MB of kernel sources and MoE/attention artifacts; the cut tree drops them (python kept)
#   apache_tvm_ffi-0.1.11-*.whl   the FFI runtime both import (the GPU machine has none)
# Usage: bash scripts/gpu/bench_stage.sh [DEST]     (CPU machine, needs pip, unzip, xz; nvcc optional)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DEST=${1:-$ROOT/.whl/bench}
W=${WORK:-$ROOT/.scratch/bench-stage}
PY=${PYTHON:-python3}
mkdir -p "$DEST" "$W/dl"
git -C "$ROOT" check-ignore -q "$DEST" || { echo "error: $DEST is not git-ignored" >&2; exit 2; }
PIPDL=(-m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
       --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d "$W/dl")
[ -f "$W"/dl/flashinfer_python-0.6.14-py3-none-any.whl ] || "$PY" "${PIPDL[@]}" flashinfer-python==0.6.14
[ -f "$W"/dl/flashinfer_python-0.7.2-py3-none-any.whl ] || "$PY" "${PIPDL[@]}" flashinfer-python==0.7.2
ls "$W"/dl/apache_tvm_ffi-0.1.11-*.whl >/dev/null 2>&1 || "$PY" "${PIPDL[@]}" apache-tvm-ffi==0.1.11

for v in 0.6.14 0.7.2; do
  t=$W/fi-$v; rm -rf "$t"; mkdir -p "$t"
  unzip -q "$W/dl/flashinfer_python-$v-py3-none-any.whl" -d "$t"
done
# 0.7.2: keep python, headers and the top-level kernel sources; drop kernel-source subtrees, CUTLASS and the
# MoE / experimental artifacts that the PCIe IPC all-reduce never touches.
C=$W/fi-0.7.2/flashinfer
rm -rf "$C"/data/cutlass "$C"/data/spdlog
find "$C"/data/csrc -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +
find "$C"/data/csrc -maxdepth 1 -type f -name '*.cu' ! -name 'pcie_ipc_*' -delete
find "$C"/fused_moe "$C"/experimental "$C"/moe_ep -type f ! -name '*.py' -delete 2>/dev/null || true

# Pre-build the JIT comm modules for sm_90a (FlashInfer loads data/aot/<name>/<name>.so before compiling).
# FI_PREBUILT_DIR: a folder that already holds trtllm_comm.so / pcie_ipc_comm.so built that way.
if [ -n "${FI_PREBUILT_DIR:-}" ]; then
  for pair in "0.6.14 trtllm_comm" "0.7.2 pcie_ipc_comm"; do
    set -- $pair
    if [ -f "$FI_PREBUILT_DIR/$2.so" ]; then
      mkdir -p "$W/fi-$1/flashinfer/data/aot/$2"; cp "$FI_PREBUILT_DIR/$2.so" "$W/fi-$1/flashinfer/data/aot/$2/$2.so"
    else
      echo "no $FI_PREBUILT_DIR/$2.so: the GPU machine compiles $2 on first use"
    fi
  done
# (the build links -lcuda: $CUDA_HOME/lib64/stubs/libcuda.so must exist, or build by hand and use FI_PREBUILT_DIR)
elif command -v nvcc >/dev/null && nvcc --version | grep -q "V13.0.88" && [ -n "${FI_BUILD_PY:-}" ]; then
  for spec in "0.6.14 gen_trtllm_comm_module trtllm_comm" "0.7.2 gen_pcie_ipc_comm_module pcie_ipc_comm"; do
    set -- $spec
    (export FLASHINFER_CUDA_ARCH_LIST="9.0a" FLASHINFER_WORKSPACE_BASE="$W/jit-$1" MAX_JOBS=1
     PYTHONPATH="$W/fi-$1:${FI_BUILD_DEPS:-}" "$FI_BUILD_PY" -c "
from flashinfer.jit.comm import $2
s = $2(); s.build(verbose=False); print(s.jit_library_path)" > "$W/build-$1.log" 2>&1) || {
      echo "pre-build of $3 failed (see $W/build-$1.log); the GPU machine will compile it"; continue; }
    so=$(tail -1 "$W/build-$1.log"); mkdir -p "$W/fi-$1/flashinfer/data/aot/$3"; cp "$so" "$W/fi-$1/flashinfer/data/aot/$3/$3.so"
  done
else
  echo "no pre-build (needs nvcc 13.0.88 and FI_BUILD_PY=a python with torch); the GPU machine compiles on first use"
fi
for v in 0.6.14 0.7.2; do
  [ $v = 0.6.14 ] && tag=fi614 || tag=fi072
  tar -C "$W/fi-$v" -cJf "$DEST/$tag.tar.xz" flashinfer
done
cp "$W"/dl/apache_tvm_ffi-0.1.11-*.whl "$DEST/"
du -ch "$DEST"/* | tail -1
ls -la "$DEST"
