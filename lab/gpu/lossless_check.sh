#!/bin/bash
# Greedy-identity check of every verify mode of the patched SGLang 0.5.16, TP=2, in one GPU-machine command.
#
#   bash lab/gpu/lossless_check.sh DIR        DIR holds site.tar.xz (build_bundle.sh), overlay.tar.xz and
#                                                  jitcache.tar.xz (--repatch), serving.py, and a model folder
#                                                  tiny-random/ (make_random_model.py); results go to $OUT.
#
# Starts plain, tree, chain, chain + widths, auto and chain + verify timing together on a seeded random-weight
# model (token-id requests), sends each the same greedy requests at concurrency 1 and 4, and compares every
# speculative server's output ids with the plain server's, token by token.
set -u
set +m
D=$(cd "${1:?bundle dir}" && pwd)
OUT=${OUT:-$HOME/lossless-out}
mkdir -p "$OUT"
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
log() { echo "[$(el)s] $*" | tee -a "$OUT/timeline.txt"; }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
mkdir -p "$HOME/site" "$HOME/jitcache"
tar -xJf "$D/site.tar.xz" -C "$HOME/site" && tar -xJf "$D/overlay.tar.xz" -C "$HOME/site" \
  && tar -xJf "$D/jitcache.tar.xz" -C "$HOME/jitcache" || { log "unpack failed"; exit 1; }
export PYTHONPATH=$HOME/site
log "unpacked"
M=$D/tiny-random
NG="--speculative-algorithm NGRAM --speculative-num-draft-tokens 8"
COMMON="--model-path $M --tp 2 --skip-tokenizer-init --attention-backend triton --sampling-backend pytorch
  --cuda-graph-max-bs-decode 8 --cuda-graph-backend-prefill disabled --max-total-tokens 32768
  --mem-fraction-static 0.08 --decode-log-interval 20 --sleep-on-idle --log-level info"
COMMON=$(echo $COMMON)
CASES="plain|31010|
tree|31020|$NG
chain|31030|$NG --speculative-ngram-verify-mode chain
chain_w|31040|$NG --speculative-ngram-verify-mode chain --speculative-ngram-verify-widths 1,2,4,8
auto|31050|$NG --speculative-ngram-verify-mode auto --speculative-ngram-verify-widths 1,2,4,8
chain_timing|31060|$NG --speculative-ngram-verify-mode chain --enable-verify-timing --verify-timing-interval 5"
declare -A PID PORT
while IFS='|' read -r name port extra; do
  cp -r "$HOME/jitcache" "$HOME/jit-$name"
  TVM_FFI_CACHE_DIR="$HOME/jit-$name" setsid python3 -m sglang.launch_server $COMMON --port "$port" \
    --nccl-port $((port + 5)) $extra > "$OUT/$name.log" 2>&1 &
  PID[$name]=$!; PORT[$name]=$port
  echo "$name: python3 -m sglang.launch_server $COMMON --port $port --nccl-port $((port + 5)) $extra" >> "$OUT/commands.txt"
done <<< "$CASES"
trap 'for n in "${!PID[@]}"; do kill -KILL -- -${PID[$n]} 2>/dev/null; done' EXIT
log "launched ${!PID[*]}"
declare -A UP
for _ in $(seq 1 110); do
  pending=0
  for n in "${!PID[@]}"; do
    [ -n "${UP[$n]:-}" ] && continue
    if ! kill -0 "${PID[$n]}" 2>/dev/null; then UP[$n]=dead; log "$n: exited"; continue; fi
    if python3 -c "import sys,urllib.request as u; sys.exit(u.urlopen('http://127.0.0.1:${PORT[$n]}/health',timeout=2).status!=200)" 2>/dev/null
    then UP[$n]=ok; log "$n: healthy"; else pending=$((pending + 1)); fi
  done
  [ $pending -eq 0 ] && break
  sleep 2
done
for n in plain tree chain chain_w auto chain_timing; do
  [ "${UP[$n]:-}" = ok ] || { log "$n: not up"; tail -25 "$OUT/$n.log" >> "$OUT/timeline.txt"; continue; }
  timeout 90 python3 "$D/serving.py" run --base-url "http://127.0.0.1:${PORT[$n]}" --tag "$n" --input-ids \
    --vocab-size 2048 --kinds code,reasoning,chat,repetitive,story --per-kind 2 --concurrency 1,4 \
    --max-new-tokens 160 --warmup 1 --no-progress --json "$OUT/$n.json" > "$OUT/$n.txt" 2>&1
  log "$n: client rc=$? $(grep -E '^ +c=' "$OUT/$n.txt" | tr -s ' ' | tr '\n' ';')"
  kill -TERM -- -"${PID[$n]}" 2>/dev/null
done
cd "$OUT"
for lv in c=1 c=4; do
  for n in tree chain chain_w auto chain_timing; do
    [ -f $n.json ] && [ -f plain.json ] && python3 "$D/serving.py" compare plain.json $n.json --level $lv
  done
done > identity.txt 2>&1
grep -h -E "n-gram verify|verify width|accept len|Verify timing" *.log | tail -40 > log_excerpts.txt
log "done"; cat identity.txt | grep -E "identical|vs" | head -20
