#!/bin/bash
# The microbenchmarks on a 2-GPU H200 machine, in one call. Run from the repository root:
#   bash scripts/gpu/bench_run.sh [STAGE_DIR]      (STAGE_DIR from scripts/gpu/bench_stage.sh, default .whl/bench)
# Writes at most 8 files to $OUT (default ./bench-out): the all-reduce JSON + PNG, the NCCL tuning profile,
# the kernel baselines, the NCCL variable check, logs.tar.gz and summary.txt. Every step has its own timeout;
# a failed step is logged and the next one runs; partial results are kept.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd); cd "$ROOT"
STAGE=${1:-.whl/bench}
OUT=${OUT:-$ROOT/bench-out}; mkdir -p "$OUT"
LOGS=$(mktemp -d /tmp/benchlogs.XXXX)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1   # multicast stays off
export PYTHONUNBUFFERED=1 FLASHINFER_WORKSPACE_BASE=/tmp/fiws
T0=$(date +%s)
DEADLINE=$(( T0 + ${BUDGET_S:-420} ))   # the whole script ends by then (the call's own limit is larger)
PY=${PYTHON:-python3}
left() { local r=$(( DEADLINE - $(date +%s) )); [ $r -lt 1 ] && r=1; [ $r -gt $1 ] && r=$1; echo $r; }

step() {  # step NAME TIMEOUT_S CMD...: run with a timeout, log to $LOGS/NAME.log, record rc and seconds
  local name=$1 t=$2; shift 2
  local s=$(date +%s)
  timeout -k 10 "$t" "$@" > "$LOGS/$name.log" 2>&1
  local rc=$?
  printf '%-22s rc=%-4s %4ss\n' "$name" "$rc" "$(( $(date +%s) - s ))" | tee -a "$LOGS/steps.txt"
  return $rc
}

finish() {
  tar -C "$LOGS" -czf "$OUT/logs.tar.gz" . 2>/dev/null
  {
    echo "== steps (total $(( $(date +%s) - T0 )) s)"; cat "$LOGS/steps.txt" 2>/dev/null
    echo "== flashinfer module load"; grep -h "LOAD" "$LOGS"/fi_*.log 2>/dev/null
    echo "== kernels"; grep -E "^(add_rmsnorm|chain|tree|greedy|# wrong|# reference)" "$LOGS/kernels.log" 2>/dev/null | cut -c1-100
    echo "== nccl env check"; grep -vE "^# env" "$LOGS/nccl_env_check.log" 2>/dev/null | tail -n 25 | cut -c1-160
    echo "== all-reduce vs compute (kimi-k2.5; job lines, then the table)"
    grep -E "^# job " "$LOGS/allreduce.log" 2>/dev/null
    grep -vE "^# (env|args|date|host|python|job )" "$LOGS/allreduce.log" 2>/dev/null | grep -vE "it/s\]|s/it\]|^backends" | tail -n 110
  } > "$OUT/summary.txt"
  cat "$OUT/summary.txt"
}
trap finish EXIT

step env 30 bash -c "nvidia-smi; nvidia-smi topo -m; $PY -c 'import torch,sys; print(sys.version); print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version(), torch.cuda.device_count())'; nvcc --version | tail -1; env | grep -E '^(NCCL|TORCH|NVSHMEM|CUDA)' | sort"

# FlashInfer 0.6.14 (trtllm fusion) and the cut 0.7.2 (PCIe IPC), each in its own folder; tvm-ffi shared
FI614=/tmp/fi614; FI072=/tmp/fi072; TVM=/tmp/tvmffi
step unpack 90 bash -c "mkdir -p $FI614 $FI072 && tar -C $FI614 -xJf $STAGE/fi614.tar.xz && tar -C $FI072 -xJf $STAGE/fi072.tar.xz && $PY -m pip install -q --no-index --no-deps --no-compile --target $TVM $STAGE/apache_tvm_ffi-*.whl && ls $FI614/flashinfer/data/aot $FI072/flashinfer/data/aot"
# Load (or JIT-compile with this machine's nvcc, timed) the comm modules before the benchmark needs them
step fi_trtllm_load $(left 150) env PYTHONPATH=$FI614:$TVM $PY -c "
import time; t=time.time()
from flashinfer.jit.comm import gen_trtllm_comm_module
s=gen_trtllm_comm_module(); aot=s.is_aot; s.build_and_load()
print('LOAD trtllm_comm 0.6.14: aot=%s %.1f s' % (aot, time.time()-t))"
step fi_pcie_load $(left 90) env PYTHONPATH=$FI072:$TVM $PY -c "
import time; t=time.time()
from flashinfer.jit.comm import gen_pcie_ipc_comm_module
s=gen_pcie_ipc_comm_module(); aot=s.is_aot; s.build_and_load()
print('LOAD pcie_ipc_comm 0.7.2: aot=%s %.1f s' % (aot, time.time()-t))"

step kernels $(left 90) env CUDA_VISIBLE_DEVICES=0 $PY benchmark/kernels/run.py --json "$OUT/kernels_h200.json"

NGPU=$($PY -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
AT=$(left 290); [ $AT -gt 40 ] && AT=$(( AT - 20 ))
if [ "$NGPU" -ge 2 ]; then
step allreduce $AT $PY benchmark/allreduce_vs_compute.py --profile kimi-k2.5 --shard-tp 8 --batch-sizes 1,4 \
  --flashinfer-site $FI614:$TVM --flashinfer-pcie-site $FI072:$TVM --job-timeout 100 \
  --json "$OUT/allreduce_kimi.json" --png "$OUT/allreduce_kimi.png" --write-nccl-profile "$OUT/nccl_tuning_profile.json"
else  # one GPU: the compute side of the split only
step allreduce $AT $PY benchmark/allreduce_vs_compute.py --profile kimi-k2.5 --shard-tp 8 --batch-sizes 1,4 \
  --compute-only --world 1 --json "$OUT/allreduce_kimi.json"
fi
[ -f "$OUT/allreduce_kimi.json" ] || cp "$OUT/allreduce_kimi.json.partial" "$LOGS/" 2>/dev/null
rm -f "$OUT/allreduce_kimi.json.partial"
[ -f "$OUT/allreduce_kimi.json" ] && step extract 30 $PY benchmark/kernels/compare.py \
  --extract-allreduce "$OUT/allreduce_kimi.json" "$OUT/kernels_allreduce_h200x2.json"
# Do the NCCL variables reach NCCL in both ranks? With the tuning profile the sweep just wrote, through the
# same --nccl-tuning-profile path the server uses (fixed flags if the sweep produced none).
if [ -f benchmark/nccl_env_check.py ] && [ "$NGPU" -ge 2 ]; then
  if [ -f "$OUT/nccl_tuning_profile.json" ]; then NARGS=(--nccl-tuning-profile "$OUT/nccl_tuning_profile.json")
  else NARGS=(--nccl-proto LL --nccl-max-channels 4); fi
  step nccl_env_check $(left 90) env PYTHONPATH=$ROOT/python $PY benchmark/nccl_env_check.py "${NARGS[@]}" \
    --log-dir "$LOGS/nccl_env_check_logs" --json "$OUT/nccl_env_check.json"
fi
exit 0
