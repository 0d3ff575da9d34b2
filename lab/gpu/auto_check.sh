#!/bin/bash
# Auto verify against every fixed mode, and the verify-timing overhead at the default interval, on the
# 2x H200 machine in one command (TP=2, patched SGLang 0.5.16).
#
#   bash lab/gpu/auto_check.sh DIR       from the repository root on the GPU machine
#   DIR as for timing_check.sh (site, overlay, jitcache, serving.py, models/dummy-7168, optional py-spy wheel).
#   Results: $OUT/auto.tar.xz (logs, client JSON and tables, /metrics, identity checks, the host's CPUs before
#   the servers started (cpu_probe.txt), the goal verdict of
#   lab/auto_verdict.py, profiles, microbenchmark) and $OUT/summary.txt.
#
# 1. Modes: no speculation, tree, chain, chain + widths 1,2,4,8 and auto on a 2-layer random-weight model
#    (host-bound like SmolLM2-135M: the decode step is mostly host time). Two workloads, the same requests for
#    every server: greedy (a random model's greedy output falls into loops: n-gram drafts match, the
#    repetitive case) and sampling at temperature 1 (near-uniform tokens: drafts never match, the
#    non-repetitive case). Two rounds in opposite server order. Greedy outputs are compared with no speculation.
# 2. Verify timing at its default interval (budgeted: the sampling interval widens to 0.5 % measured cost):
#    plain servers of the dummy 7168-hidden model, one with timing and two without (their difference is the
#    noise floor), in rounds of rotated order; then a chain server's verify split (every 5th pass sampled).
# 3. The all-reduce-vs-compute microbenchmark for the dummy model, tokens 1 and 8, NCCL.
#    PHASE1_MODEL=dummy runs phase 1 on the dummy 7168-hidden model instead (GPU-heavier steps).
#    Phase 1 ends with a host profile (py-spy, 10 s, TP-0 scheduler) of auto on the
#    sampled workload (PROFILE=1, the default; PROFILE=torch: GPU timelines of PROFILE_SERVERS instead,
#    lab/gpu_timeline.py; both: the two; 0: none). Phase 1 and phase 2 servers do not run at the same time.
#    STEPTRACE=1: every scheduler iteration of every server traced (lab/step_trace.py -> step_trace.txt);
#    STEPTRACE_GPU=1 with it: each step's device time and the GPU's idle gap after it (two CUDA events a step).
#    WARMUP=1: a round of both loads on every server before the recorded rounds (kept as *_w1, not judged).
#    MONITOR=1: per-thread CPU use of each server's scheduler processes during its sampled load.
set -u
set +m
. "$(dirname "$0")/servers.sh"
start_check auto "${1:-}"
DEADLINE_S=${DEADLINE_S:-560}
CLIENT_TIMEOUT_S=${CLIENT_TIMEOUT_S:-60}
PHASES=${PHASES:-"1 2"}   # 1: every mode on two workloads; 2: verify timing overhead and split
ROUNDS=${ROUNDS:-2}       # phase 1 rounds (round 2 in reverse server order)
has() { case " $PHASES " in *" $1 "*) return 0;; esac; return 1; }
prepare_machine || exit 1
DM=$D/models/dummy-7168

DMA="--model-path $DM --load-format dummy --tp-allreduce nccl --mem-fraction-static 0.2"
TMA="--model-path $HOME/models/tiny --mem-fraction-static 0.15"
# PHASE1_MODEL=dummy: phase 1 on the dummy 7168-hidden 8-layer model instead (a GPU pass that outweighs the
# host part of a step); five servers share the GPUs, hence the smaller memory fraction (PHASE1_MEM; 0.2 for four)
# (PHASE1_MODEL=<folder under DIR/models>: that dummy-weight model, e.g. dummy-7168-l24, a GPU-bound step)
P1=${PHASE1_MODEL:-tiny}; [ "$P1" = dummy ] && P1=dummy-7168
[ "$P1" != tiny ] && TMA="--model-path $D/models/$P1 --load-format dummy --tp-allreduce nccl --mem-fraction-static ${PHASE1_MEM:-0.16}"
trap 'stop_all; pack' EXIT

# ---- 1. every mode, two workloads, two rounds (servers of phase 1 only: the GPUs and CPUs otherwise idle) ---
if has 1; then
MODES=${MODES:-"m_plain m_tree m_chain m_chain_w m_auto"}   # a subset of these servers (or m_plain2:
# a second server without speculation, the noise floor between two processes of the same flags):
# (ports below 32768, out of the kernel's ephemeral range: an ephemeral port another server took once made the
# fixed --nccl-port of the next server fail with EADDRINUSE)
M_CASES="m_plain|23010|$TMA
m_plain2|23070|$TMA
m_tree|23020|$TMA $NG
m_chain|23030|$TMA $NG --speculative-ngram-verify-mode chain
m_chain_w|23040|$TMA $NG --speculative-ngram-verify-mode chain --speculative-ngram-verify-widths 1,2,4,8
m_auto|23050|$TMA $NG --speculative-ngram-verify-mode auto --speculative-ngram-verify-widths 1,2,4,8"
CASES=$(echo "$M_CASES" | grep -E "^($(echo $MODES | tr ' ' '|'))\|")
# LAUNCH_SERIAL=1: each server up before the next starts (large models: no start-up races over GPU memory;
# the default for the dummy models, which lost servers to such races when started together)
[ "$P1" = tiny ] && SERIAL_DEFAULT=0 || SERIAL_DEFAULT=1
if [ "${LAUNCH_SERIAL:-$SERIAL_DEFAULT}" = 1 ]; then
  while IFS= read -r c; do launch_servers "$COMMON" <<< "$c"; wait_healthy 60; done <<< "$CASES"
else
  launch_servers "$COMMON" <<< "$CASES"
  wait_healthy 60
fi
LOAD="--vocab-size 2048 --kinds code,chat,repetitive,story --per-kind 2 --concurrency 1,4 --max-new-tokens 200 --warmup 1"
# GREEDY_SLOTS: requests per concurrency slot of the repetitive load (c=4: 4 x this). With 8 equal requests a
# speculative server's c=4 level lasts 0.6 s in two waves, and the server idles between them until the client's
# next four requests arrive (up to 0.26 s seen in run20-run22, in every server); more waves dilute that.
GREEDY="$LOAD --requests-per-slot ${GREEDY_SLOTS:-8}"
# SAMPLED_SLOTS: the same for the sampled load (default: the 8 prompts once per level). Its first token's time
# varies by tens of ms with SGLang's eager prefill and with how a wave's requests fall into prefill batches,
# so more requests per level average that out (16: 16 at c=1, 64 at c=4)
SAMPLED="$LOAD --temperature 1.0${SAMPLED_SLOTS:+ --requests-per-slot $SAMPLED_SLOTS}"
# WARMUP=1: one unrecorded round of both loads on every server first (tags *_w1, which the verdict does not
# read): the first use of each verify width and batch size, compiled or loaded once per server, lands there
ROUND_TAGS=$(seq -f "r%g" 1 "$ROUNDS" | tr '\n' ' '); [ "${WARMUP:-0}" = 1 ] && ROUND_TAGS="w1 $ROUND_TAGS"
for tag in $ROUND_TAGS; do
  order=$MODES; [ $tag = r2 ] && order=$(echo $MODES | tr ' ' '\n' | tac | tr '\n' ' ')
  for n in $order; do
    up "$n" || continue
    [ "$(left)" -lt 40 ] && { log "skip $n round $tag: time"; continue; }
    client "$n" "${n}_greedy_$tag" $GREEDY
    # MONITOR=1: per-thread CPU of the server's scheduler processes while the sampled load runs (which
    # threads are busy on which CPUs; lab/gpu/thread_cpu.py), $W/<server>_threads_<round>.txt
    MON=""
    if [ "${MONITOR:-0}" = 1 ]; then
      pids=$(ps -eo pid=,pgid=,args= | awk -v g="${PID[$n]}" '$2 == g && /scheduler_TP/ {print $1}')
      [ -n "$pids" ] && { python3 lab/gpu/thread_cpu.py $pids --interval 0.5 --samples 24 \
        > "$W/${n}_threads_$tag.txt" 2>&1 & MON=$!; }
    fi
    client "$n" "${n}_sampled_$tag" $SAMPLED
    [ -n "$MON" ] && { kill "$MON" 2>/dev/null; wait "$MON" 2>/dev/null; }
  done
  pack
done
for n in $MODES; do up "$n" && scrape "$n"; done
for n in m_tree m_chain m_chain_w m_auto; do
  for lv in c=1 c=4; do
    [ -f "$W/${n}_greedy_r1.json" ] && python3 "$D/serving.py" compare "$W/m_plain_greedy_r1.json" "$W/${n}_greedy_r1.json" --level $lv
  done
done > "$W/identity.txt" 2>&1
# the goal per load and concurrency (auto >= 0.98x the best server and >= no speculation), from the client JSONs
python3 lab/auto_verdict.py "$W" --json "$W/verdict.json" > "$W/verdict.txt" 2>&1
# STEPTRACE=1: per-step host statistics of every server (launch, wait for the GPU, garbage collections; the
# servers' step traces are written when they go idle between loads, so the last load's are complete)
if [ "${STEPTRACE:-0}" = 1 ]; then
  traced=""; for n in $MODES; do [ -d "$W/steps-$n" ] && traced="$traced $n=$W/steps-$n"; done
  [ -n "$traced" ] && python3 lab/step_trace.py $traced --json "$W/step_trace.json" > "$W/step_trace.txt" 2>&1
fi
# host profiles on the sampled workload (nothing to speculate on); PYSPY_ARGS adds py-spy options (--idle:
# waiting threads too, --native: C/C++ frames such as the CUDA driver's); PROF_CONC=4: four requests at once
# (the batch-size-4 step; default 1)
for n in ${PROFILE_SERVERS:-m_auto}; do
  { [ "${PROFILE:-1}" = 1 ] || [ "${PROFILE:-1}" = both ]; } && up "$n" && [ -n "$SPY" ] && [ "$(left)" -gt 30 ] || continue
  ( client "$n" "${n}_prof" --vocab-size 2048 --kinds chat,story --per-kind $((3 * ${PROF_CONC:-1})) \
      --concurrency ${PROF_CONC:-1} --max-new-tokens 900 --temperature 1.0 --warmup 0 ) &
  CP=$!
  sleep 2
  pid=$(tp0_pid "$n")
  # (py-spy reads native stacks only by pausing the process: --native drops --nonblocking)
  NB=--nonblocking; case " ${PYSPY_ARGS:-} " in *" --native "*) NB="";; esac
  [ -n "$pid" ] && timeout 30 "$SPY" record --pid "$pid" --duration 10 --rate 250 --format raw $NB ${PYSPY_ARGS:-} \
    --output "$W/$n.pyspy.txt" > "$W/$n.pyspy.log" 2>&1
  log "$n: py-spy rc=$? pid ${pid:-none}"
  [ -s "$W/$n.pyspy.txt" ] && python3 lab/gpu/pyspy_top.py "$W/$n.pyspy.txt" --top 70 > "$W/$n.pyspy_top.txt" 2>&1
  wait $CP
done
# GPU timelines (PROFILE=torch, or both): SGLang's torch profiler (TORCH_ACTIVITIES, default GPU only: the
# host-side recording of CPU would slow the host enough to change the step) for TORCH_STEPS decode steps of
# each PROFILE_SERVERS server, well into one sampled request (TORCH_CONC=4: four at once, the batch-size-4
# step); lab/gpu_timeline.py compares them (first =
# baseline). The traces stay on the machine ($HOME/traces, about 2 MB each gzipped) unless KEEP_TRACES=1.
if [ "${PROFILE:-1}" = torch ] || [ "${PROFILE:-1}" = both ]; then
  # TORCH_CONC may list several concurrencies ("1 4"): each server is profiled at each, in the same processes,
  # and each concurrency gets its own comparison (gpu_timeline_c<N>.txt; gpu_timeline.txt with one)
  CONCS=(${TORCH_CONC:-1})
  for conc in "${CONCS[@]}"; do
    TL=()
    sfx=""; [ ${#CONCS[@]} -gt 1 ] && sfx="_c$conc"
    for n in ${PROFILE_SERVERS:-m_plain m_auto}; do
      up "$n" && [ "$(left)" -gt 40 ] || continue
      rm -rf "$HOME/traces/$n$sfx"
      ( client "$n" "${n}_torch$sfx" --vocab-size 2048 --kinds chat --per-kind $conc \
          --concurrency $conc --max-new-tokens 700 --temperature 1.0 --warmup 0 ) &
      CP=$!
      sleep 1.5
      python3 -c "import json,sys,urllib.request as u; r=u.Request('http://127.0.0.1:${PORT[$n]}/start_profile', \
data=json.dumps({'output_dir': sys.argv[1], 'num_steps': ${TORCH_STEPS:-120}, 'activities': sys.argv[2].split(',')}).encode(), \
headers={'Content-Type': 'application/json'}); print(u.urlopen(r, timeout=30).read().decode())" "$HOME/traces/$n$sfx" "${TORCH_ACTIVITIES:-GPU}" \
        > "$W/$n.torch$sfx.log" 2>&1
      wait $CP
      for _ in $(seq 1 20); do ls "$HOME/traces/$n$sfx"/*TP-0*.trace.json.gz >/dev/null 2>&1 && break; sleep 1; done
      f=$(ls "$HOME/traces/$n$sfx"/*TP-0*.trace.json.gz 2>/dev/null | head -1)
      log "$n: torch trace (concurrency $conc) ${f:-missing} $(du -h "$f" 2>/dev/null | cut -f1)"
      [ -n "$f" ] && TL+=("$n=$f")
      # KEEP_TRACES=1: the TP-0 trace itself comes back too ($OUT/traces/<server>.trace.json.gz), for analyses
      # gpu_timeline.py does not make
      [ -n "$f" ] && [ "${KEEP_TRACES:-0}" = 1 ] && mkdir -p "$OUT/traces" && cp "$f" "$OUT/traces/$n$sfx.trace.json.gz"
    done
    [ ${#TL[@]} -gt 0 ] && python3 lab/gpu_timeline.py "${TL[@]}" --json "$W/gpu_timeline$sfx.json" \
      > "$W/gpu_timeline$sfx.txt" 2>&1
  done
fi
grep -h "auto verify\|n-gram verify widths" "$W"/m_auto.log | tail -40 > "$W/auto_lines.txt"
for n in $MODES; do up "$n" && stop_server "$n"; done
pack
fi

# ---- 2. verify timing: overhead at the default (budgeted) interval against two servers without it -----------
if has 2; then
sleep 3
launch_servers "$COMMON" <<EOC
t_off|23110|$DMA
t_off2|23140|$DMA
t_on|23120|$DMA --enable-verify-timing --verify-timing-log-interval 5
t_chain|23130|$DMA $NG --speculative-ngram-verify-mode chain --enable-verify-timing --verify-timing-interval 5 --verify-timing-log-interval 5
EOC
wait_healthy 60
OH="--vocab-size 32000 --kinds code,chat,story --per-kind 2 --concurrency 1,8 --max-new-tokens 300 --warmup 1"
r=0
for order in "t_off t_on t_off2" "t_off2 t_on t_off" "t_on t_off t_off2"; do
  r=$((r + 1))
  [ "$(left)" -lt 110 ] && break
  for n in $order; do up "$n" && client "$n" "overhead_${n}_r$r" $OH; done
done
up t_on && scrape t_on
for n in t_off t_off2; do stop_server "$n"; done
# the verify split: a chain server sampling every 5th pass (an explicit interval is kept exactly)
if up t_chain; then
  client t_chain chain_split --vocab-size 32000 --kinds code,chat,story --per-kind 2 --concurrency 1,4 \
    --max-new-tokens 400 --warmup 1
  scrape t_chain
fi
for n in t_on t_chain; do stop_server "$n"; done
pack

# ---- 3. the microbenchmark for the same shapes -------------------------------------------------------------
sleep 2
[ "$(left)" -gt 30 ] && timeout $(( $(left) - 15 )) python3 benchmark/allreduce_vs_compute.py \
  --profile "$DM/config.json" --widths 1,8 --batch-sizes 1 --backends nccl \
  --json "$W/microbench_dummy7168.json" > "$W/microbench.log" 2>&1
log "microbenchmark rc=$?"
fi
grep -h "Verify timing" "$W"/t_*.log | tail -30 > "$W/timing_lines.txt"
{
  cat "$W/timeline.txt"; echo "== identity"; grep -E "identical|vs" "$W/identity.txt" | head -20
  echo "== verdict"; grep -E "^(#|[a-z])|auto:" "$W/verdict.txt" 2>/dev/null
  [ -f "$W/gpu_timeline.txt" ] && { echo "== GPU timeline"; cat "$W/gpu_timeline.txt"; }
  echo "== timing lines"; cut -c1-330 "$W/timing_lines.txt" | tail -12
  echo "== auto lines"; cut -c1-400 "$W/auto_lines.txt" | tail -12
  echo "== microbenchmark"; grep -vE "it/s\]|s/it\]" "$W/microbench.log" | tail -8
} > "$OUT/summary.txt"
log "done"
