#!/bin/bash
# End-to-end runs of the patched SGLang 0.5.16 on a 2-GPU H200 machine, in one command of <= 600 s.
#
#   bash run_e2e.sh [PLAN]        from the bundle folder (.scratch/gpu-bundle) on the GPU machine
#   PLAN: "all" (default) or a space-separated list of case names (see cases() below)
#   env:  TP=2 (default; TP=1 for a one-GPU machine), WITH_WIDTHS=1 / WITH_AUTO=1 (default on: the cases of patches 0008 and 0007; 0 leaves them out), OUT (results folder; default $HOME/e2e-out), STORE (staged parts; default /root/stage),
#         DEADLINE_S (default 560: stop benchmarking, pack and leave inside the command limit),
#         HEALTH_WAIT_S (default 180: stop waiting for servers that are not up by then), HEALTH_RESERVE (300),
#         SGLANG_LAUNCH (default "python3 -m sglang.launch_server"; dryrun.sh puts a stand-in here)
#
# All servers of the plan start together (each TP=2 over both GPUs, its own ports and JIT cache copy) so the
# ~80 s of Python imports is paid once; then each is benchmarked alone (the others idle with --sleep-on-idle)
# and stopped. Results: $OUT/e2e.tar.xz (JSON per case, server logs, log excerpts, comparisons, plots),
# $OUT/timeline.txt and $OUT/summary.txt; packed again after every case so a cut-off run still returns data.
set -u
set +m
B=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-$HOME/e2e-out}
W=$HOME/e2e
DEADLINE_S=${DEADLINE_S:-560}
T0=$(date +%s)
TL=$OUT/timeline.txt
el()   { echo $(( $(date +%s) - T0 )); }
left() { echo $(( DEADLINE_S - $(el) )); }
log()  { echo "[$(el)s] $*" | tee -a "$TL"; }
pack() { cp "$TL" "$W/"; tar -C "$HOME" -cJf "$OUT/e2e.tar.xz.tmp" e2e && mv "$OUT/e2e.tar.xz.tmp" "$OUT/e2e.tar.xz"; }

# ---- the cases: name | port | model | client args | server args | extra env -------------------------------
TP=${TP:-2}                  # 1 on a one-GPU machine: no all-reduce, so the NCCL/all-reduce-path cases drop out
SM=$HOME/models/smollm2-135m-tp$TP   # TP=2: heads zero-padded 9/3 -> 12/4 (same function, see convert_smollm2.py)
DM=$HOME/models/dummy-7168
NGRAM="--speculative-algorithm NGRAM --speculative-num-draft-tokens 8"
TIMING="--enable-verify-timing --verify-timing-interval 200 --verify-timing-log-interval 10"
SM_CLIENT=${SM_CLIENT:-"--concurrency 1,8 --max-new-tokens 256 --long-gen 8000"}
DM_CLIENT="--concurrency 1,8 --max-new-tokens 256 --long-gen 2048 --input-ids --vocab-size 32000"
TP2_ONLY=$([ "$TP" = 1 ] && echo "#")
cases() {
cat <<EOF | grep -v '^#'
s_plain|30010|$SM|$SM_CLIENT|$TIMING|
s_tree|30020|$SM|$SM_CLIENT|$NGRAM $TIMING|
s_chain|30030|$SM|$SM_CLIENT|$NGRAM --speculative-ngram-verify-mode chain $TIMING|
${TP2_ONLY}s_plain_nccl|30040|$SM|$SM_CLIENT|--tp-allreduce nccl --nccl-proto LL --nccl-max-channels 4 $TIMING|NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV,TUNING
d_plain|30110|$DM|$DM_CLIENT|--load-format dummy --skip-tokenizer-init $TIMING|
d_tree|30120|$DM|$DM_CLIENT|--load-format dummy --skip-tokenizer-init $NGRAM $TIMING|
d_chain|30130|$DM|$DM_CLIENT|--load-format dummy --skip-tokenizer-init $NGRAM --speculative-ngram-verify-mode chain $TIMING|
${TP2_ONLY}d_tree_fused|30140|$DM|$DM_CLIENT|--load-format dummy --skip-tokenizer-init $NGRAM --tp-allreduce flashinfer-fused $TIMING|
EOF
if [ "${WITH_WIDTHS:-1}" = 1 ]; then    # patch 0008: chain verify at the smallest width that fits the drafts
  echo "s_chain_w|30060|$SM|$SM_CLIENT|$NGRAM --speculative-ngram-verify-mode chain --speculative-ngram-verify-widths 1,2,4,8 $TIMING|"
  echo "d_chain_w|30160|$DM|$DM_CLIENT|--load-format dummy --skip-tokenizer-init $NGRAM --speculative-ngram-verify-mode chain --speculative-ngram-verify-widths 1,2,4,8 $TIMING|"
fi
if [ "${WITH_AUTO:-1}" = 1 ]; then      # patch 0007: per step, no speculation or the best chain width
  echo "s_auto|30050|$SM|$SM_CLIENT|$NGRAM --speculative-ngram-verify-mode auto --speculative-ngram-verify-widths 1,2,4,8 $TIMING|"
  echo "d_auto|30150|$DM|$DM_CLIENT|--load-format dummy --skip-tokenizer-init $NGRAM --speculative-ngram-verify-mode auto --speculative-ngram-verify-widths 1,2,4,8 $TIMING|"
fi
}
COMMON="--tp $TP --attention-backend triton --sampling-backend pytorch --cuda-graph-max-bs-decode 16
        --cuda-graph-backend-prefill disabled --max-total-tokens 65536 --decode-log-interval 40
        --enable-metrics --sleep-on-idle --incremental-streaming-output --log-level info"
COMMON=$(echo $COMMON)
if [ "${1:-}" = --print-commands ]; then    # name|server args, for check_args.py on the build host
  cases | while IFS='|' read -r name port model cargs sargs senv; do
    [ -n "$name" ] || continue
    echo "$name|--model-path $model --port $port --nccl-port $((port + 5)) $COMMON $sargs"; done
  exit 0
fi
mkdir -p "$OUT"; rm -rf "$W"; mkdir -p "$W/logs" "$W/json"; : > "$TL"
log "start on $(hostname); plan: ${1:-all}"
{ nvidia-smi -L; nvidia-smi topo -m; nvcc --version | tail -1; python3 -V; nproc
  env | grep -E "^(NCCL|TORCH_|NVSHMEM|CUDA_HOME)" | sort; } > "$W/env.txt" 2>&1
source "$B/device_env.sh" "$B" "${STORE:-/root/stage}" >> "$W/prepare.log" 2>&1 || {
  log "prepare FAILED"; tail -30 "$W/prepare.log" | tee -a "$TL"; pack; exit 1; }
log "prepared: site $(du -sm "$HOME/site" | cut -f1) MB, jit modules $(ls "$HOME/jitcache" | wc -l), models $(ls "$HOME/models" | tr '\n' ' ')"
python3 -c "import sglang, fastverify, torch; print('sglang', sglang.__version__, 'torch', torch.__version__, 'gpus', torch.cuda.device_count())" >> "$W/env.txt" 2>&1
grep -c "" "$W/prepare.log" >/dev/null; tail -3 "$W/prepare.log" >> "$TL"

PLAN=${1:-all}
selected() { [ "$PLAN" = all ] || [[ " $PLAN " == *" $1 "* ]]; }

declare -A PID PORT CARGS
: > "$W/launch_commands.txt"
while IFS='|' read -r name port model cargs sargs senv; do
  [ -n "$name" ] && selected "$name" || continue
  cp -r "$HOME/jitcache" "$HOME/jit-$name"               # own JIT cache: no two servers build in one folder
  cmd="${SGLANG_LAUNCH:-python3 -m sglang.launch_server} --model-path $model --port $port --nccl-port $((port + 5)) $COMMON $sargs"
  echo "$name: env $senv TVM_FFI_CACHE_DIR=$HOME/jit-$name $cmd" >> "$W/launch_commands.txt"
  env $senv TVM_FFI_CACHE_DIR="$HOME/jit-$name" setsid $cmd > "$W/logs/$name.log" 2>&1 &
  PID[$name]=$!; PORT[$name]=$port; CARGS[$name]=$cargs
done < <(cases)
log "launched: ${!PID[*]}"; LAUNCHED_AT=$(el)
trap 'for n in "${!PID[@]}"; do kill -KILL -- -${PID[$n]} 2>/dev/null; done' EXIT

# ---- wait for health ---------------------------------------------------------------------------------------
declare -A UP
healthy() { python3 -c "import sys, urllib.request as u; sys.exit(0 if u.urlopen(sys.argv[1], timeout=2).status == 200 else 1)" \
              "http://127.0.0.1:$1/health" >/dev/null 2>&1; }
while :; do
  pending=0
  for n in "${!PID[@]}"; do
    [ -n "${UP[$n]:-}" ] && continue
    if ! kill -0 "${PID[$n]}" 2>/dev/null; then UP[$n]=dead; log "$n: server exited"; continue; fi
    if healthy "${PORT[$n]}"; then UP[$n]=ok; log "$n: healthy"
    else pending=$((pending + 1)); fi
  done
  [ $pending -eq 0 ] && break
  # give up on stragglers once HEALTH_WAIT_S passed since launch (12 servers came up in 84-100 s on 2x H200)
  # or less than HEALTH_RESERVE s remain for the benchmarks
  if [ $(( $(el) - LAUNCHED_AT )) -gt "${HEALTH_WAIT_S:-180}" ] || [ "$(left)" -lt "${HEALTH_RESERVE:-300}" ]; then
    log "still not healthy after $(( $(el) - LAUNCHED_AT ))s ($(left)s left): giving up on $pending"; break; fi
  sleep 2
done
nvidia-smi --query-gpu=index,memory.used --format=csv,noheader >> "$TL"
pack

stop() {
  kill -TERM -- -"${PID[$1]}" 2>/dev/null
  for _ in $(seq 1 10); do kill -0 -- -"${PID[$1]}" 2>/dev/null || break; sleep 1; done
  kill -KILL -- -"${PID[$1]}" 2>/dev/null
}

# ---- benchmark each healthy server alone (order: same model together, plain first) ------------------------
ORDER=$(cases | cut -d'|' -f1 | grep '^s_'; cases | cut -d'|' -f1 | grep -v '^s_')
for n in $ORDER; do
  [ "${UP[$n]:-}" = ok ] || { [ -n "${PID[$n]:-}" ] && stop "$n"; continue; }
  l=$(left)
  if [ "$l" -lt 40 ]; then log "$n: skipped ($l s left)"; stop "$n"; continue; fi
  log "$n: benchmark"
  # shellcheck disable=SC2086
  timeout $((l - 15)) python3 "$B/serving.py" run --base-url "http://127.0.0.1:${PORT[$n]}" --tag "$n" \
      ${CARGS[$n]} --metrics --warmup 2 --no-progress --json "$W/json/$n.json" > "$W/json/$n.txt" 2>&1
  rc=$?
  log "$n: client rc=$rc $(grep -E '^ +(c=|long)' "$W/json/$n.txt" | tr -s ' ' | tr '\n' ';')"
  stop "$n"; pack
done

# ---- lossless check, plots, log excerpts ------------------------------------------------------------------
cd "$W/json"
S=""; for f in s_plain s_tree s_chain s_chain_w s_auto s_plain_nccl; do [ -f $f.json ] && S="$S $f.json"; done
D=""; for f in d_plain d_tree d_chain d_chain_w d_auto d_tree_fused; do [ -f $f.json ] && D="$D $f.json"; done
{ for lv in c=1 c=8 long8000; do [ -n "$S" ] && python3 "$B/serving.py" compare $S --level $lv; done
  for lv in c=1 c=8 long2048; do [ -n "$D" ] && python3 "$B/serving.py" compare $D --level $lv; done; } > "$W/identity.txt" 2>&1
[ -n "$S" ] && python3 "$B/serving.py" plot $S --out "$OUT/smollm2_tp2.png" >> "$W/identity.txt" 2>&1
[ -n "$D" ] && python3 "$B/serving.py" plot $D --out "$OUT/dummy7168_tp2.png" >> "$W/identity.txt" 2>&1
cd "$W"
{ for f in logs/*.log; do
    echo "=== $f"
    grep -E "NCCL INFO .*(NCCL_PROTO|NCCL_MAX|NCCL_ALGO|set by environment|Channel|nChannels|Using network|version)|NCCL settings|nccl|--tp-allreduce|n-gram verify|auto verify|verify width|Verify timing|FlashInfer|flashinfer|trtllm|accept len|Capture cuda graph|Traceback|Error|error" "$f" \
      | grep -vE "Fail to set RLIMIT|helion|openai_harmony" | head -80
  done; } > "$W/log_excerpts.txt" 2>&1
{ echo "# summary $(date -u +%FT%TZ)"; cat "$TL"; echo; cat "$W/identity.txt"; echo
  for f in json/*.txt; do echo "=== $f"; grep -vE "^# (env|client)" "$f" | head -40; done; } > "$OUT/summary.txt"
log "done"
pack
