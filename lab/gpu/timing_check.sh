#!/bin/bash
# Verify-pass timing on the 2x H200 machine, in one command: its overhead, its split against the
# microbenchmark, and host profiles of the decode step with and without n-gram speculation.
#
#   bash lab/gpu/timing_check.sh DIR     from the repository root on the GPU machine
#   DIR holds site.tar.xz (build_bundle.sh), overlay.tar.xz and jitcache.tar.xz (--repatch), serving.py,
#   models/dummy-7168/config.json, and optionally a py-spy wheel (host profiles are skipped without it).
#   Results: $OUT/timing.tar.xz (logs, client JSON, /metrics, profiles, microbenchmark JSON) and
#   $OUT/summary.txt.
#
# 1. Overhead: two plain servers of the dummy 7168-hidden model (TP=2, NCCL all-reduce), timing off and on
#    (one pass in 100 sampled: 5x the default rate), benchmarked in turn, three rounds each, same requests.
# 2. Split: the timing-on server's decode passes (1 token) and an n-gram chain server's verify passes
#    (8 tokens), then the all-reduce-vs-compute microbenchmark for the same config, tokens 1 and 8, NCCL.
# 3. Host profiles (py-spy, TP rank 0's scheduler, 10 s, while a client runs): plain, chain + widths and
#    auto on a 2-layer random model (host-bound, so the step's host work shows).
set -u
set +m
. "$(dirname "$0")/servers.sh"
start_check timing "${1:-}"
DEADLINE_S=${DEADLINE_S:-540}
prepare_machine || exit 1
DM=$D/models/dummy-7168

DMA="--model-path $DM --load-format dummy --tp-allreduce nccl --mem-fraction-static 0.2"
TMA="--model-path $HOME/models/tiny --mem-fraction-static 0.06"
launch_servers "$COMMON" <<EOC
t_off|32010|$DMA
t_on|32020|$DMA --enable-verify-timing --verify-timing-interval 100 --verify-timing-log-interval 5
t_chain|32030|$DMA $NG --speculative-ngram-verify-mode chain --enable-verify-timing --verify-timing-interval 20 --verify-timing-log-interval 5
p_plain|32040|$TMA
p_chain_w|32050|$TMA $NG --speculative-ngram-verify-mode chain --speculative-ngram-verify-widths 1,2,4,8
p_auto|32060|$TMA $NG --speculative-ngram-verify-mode auto --speculative-ngram-verify-widths 1,2,4,8
EOC
trap 'stop_all; pack' EXIT
wait_healthy 300

# ---- 1. overhead (alternating rounds, same requests) -----------------------------------------------------
OH="--vocab-size 32000 --kinds code,chat,story --per-kind 2 --concurrency 1,8 --max-new-tokens 200 --warmup 1"
if up t_off && up t_on; then
  for r in 1 2 3; do
    client t_off "overhead_off_r$r" $OH
    client t_on "overhead_on_r$r" $OH
  done
  scrape t_on
fi
pack
# ---- 2. verify passes of 8 tokens -------------------------------------------------------------------------
if up t_chain; then client t_chain chain_split --vocab-size 32000 --kinds code,chat,repetitive --per-kind 2 \
  --concurrency 1 --max-new-tokens 200 --warmup 1; scrape t_chain; fi
for n in t_off t_on t_chain; do stop_server $n; done
pack
# ---- 3. host profiles --------------------------------------------------------------------------------------
for n in p_plain p_chain_w p_auto; do
  up "$n" || continue
  [ "$(left)" -lt 150 ] && { log "skip $n: time"; continue; }
  PC="--vocab-size 2048 --kinds code,chat,repetitive,story --per-kind 3 --concurrency 1 --max-new-tokens 300 --warmup 1"
  client "$n" "${n}_warm" --vocab-size 2048 --kinds chat --per-kind 1 --concurrency 1 --max-new-tokens 50
  ( client "$n" "${n}_prof" $PC ) &
  CP=$!
  sleep 3
  pid=$(tp0_pid "$n")
  if [ -n "$SPY" ] && [ -n "$pid" ]; then
    timeout 30 "$SPY" record --pid "$pid" --duration 10 --rate 250 --format raw --nonblocking \
      --output "$W/$n.pyspy.txt" > "$W/$n.pyspy.log" 2>&1
    log "$n: py-spy rc=$? pid $pid $(wc -l < "$W/$n.pyspy.txt" 2>/dev/null) stacks"
  else
    log "$n: no profile (py-spy ${SPY:-missing}, pid ${pid:-not found})"
  fi
  wait $CP
  stop_server "$n"
  pack
done
# ---- the microbenchmark for the same shapes ---------------------------------------------------------------
sleep 3
timeout $(( $(left) > 20 ? $(left) - 15 : 5 )) python3 benchmark/allreduce_vs_compute.py --profile "$DM/config.json" \
  --widths 1,8 --batch-sizes 1 --backends nccl --json "$W/microbench_dummy7168.json" > "$W/microbench.log" 2>&1
log "microbenchmark rc=$?"
grep -h "Verify timing" "$W"/t_*.log | tail -20 > "$W/timing_lines.txt"
{
  cat "$W/timeline.txt"; echo "== env"; cat "$W/env.txt"
  echo "== timing lines"; cat "$W/timing_lines.txt"
  echo "== microbenchmark"; grep -vE "it/s\]|s/it\]" "$W/microbench.log" | tail -40
} > "$OUT/summary.txt"
log "done"
