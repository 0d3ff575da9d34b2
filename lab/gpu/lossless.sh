#!/bin/bash
# The real-weights lossless check in one GPU-machine command: a plain server and the speculative
# ones started together on SmolLM2-135M-Instruct (bf16, TP=1 by default), then lab/gpu/lossless.py
# greedy (token for token against plain at c=1 and c=4, plain's top-1 minus top-2 logprob at each
# departure) and sampled (chi-square of the first tokens at temperature 1), results under $OUT.
#
#   bash lab/gpu/lossless.sh [BUNDLE_DIR]   from the repository root on the GPU machine;
#                                           BUNDLE_DIR: the carried .scratch/gpu-bundle
#                                           (docs/gpu-staging.md), the large parts already
#                                           received into STORE (default /root/stage)
# Environment:
#   SERVERS       (default "plain tree chain chain_w auto_w"; plain is always first; table: cases())
#   TP            (default 1); MODEL (default $HOME/models/smollm2-135m-tp$TP)
#   EXTRA_FLAGS   added to every server (e.g. "--enable-deterministic-inference"; "--dtype float32"
#                 with SGLANG_LAUNCH="python3 $PWD/lab/gpu/native_ops.py": the float32 check, whose
#                 RMSNorm the bundle's kernel refuses, through SGLang's torch ops)
#   GREEDY_ARGS   extra arguments of `lossless.py greedy` (default "--max-new-tokens 128"; add
#                 --memorise for long accepted runs: drafts from each server's own earlier outputs)
#   SAMPLED_ARGS  extra arguments of `lossless.py sampled` (default "--sets grounded --per-set 3
#                 --samples 300 --tokens 4"); SAMPLED=0 skips the sampled check
#   TOKENIZE      (default "--tokenizer $MODEL"; empty: plain's /tokenize)
#   HEALTH_WAIT_S (default 170, counted again for a server started a second time);
#   SGLANG_LAUNCH (default "python3 -m sglang.launch_server");
#   MEM_FRACTION  --mem-fraction-static of every server (default 0.07: at 0.05 a server's KV-cache
#                 check can fail once the others hold their memory, as float32 servers did)
#   LAUNCH_GAP_S  seconds between two launches (default 0); RETRY=0: a server that died during
#                 start-up is not started again (default: once more, alone, after the others)
#   PREPARE=0     skip device_env.sh (the CPU rehearsal: lossless_dryrun.sh)
#   LEFTOVERS_FILE (default $HOME/lab-servers.pgids): the process groups of the servers started;
#                 those of an earlier run that still run are stopped before the launch
#   OUT           (default $HOME/lossless-out): greedy/ and sampled/ (summary.json, summary.txt, one
#                 folder per server), timeline.txt, commands.txt, lossless.tar.xz (server logs),
#                 died-NAME.txt (the last lines of the log of a server that died during start-up)
set -u
set +m
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SERVERS=${SERVERS:-"plain tree chain chain_w auto_w"}
TP=${TP:-1}
MODEL=${MODEL:-$HOME/models/smollm2-135m-tp$TP}
NG="--speculative-algorithm NGRAM --speculative-num-draft-tokens 8"
COMMON="--model-path $MODEL --tp $TP --attention-backend triton --sampling-backend pytorch
  --cuda-graph-max-bs-decode 8 --cuda-graph-backend-prefill disabled --max-total-tokens 32768
  --mem-fraction-static ${MEM_FRACTION:-0.07} --decode-log-interval 40 --sleep-on-idle
  --log-level info ${EXTRA_FLAGS:-}"
COMMON=$(echo $COMMON)
cases() {  # name|server flags
  cat <<CASES
plain|
tree|$NG
chain|$NG --speculative-ngram-verify-mode chain
chain_w|$NG --speculative-ngram-verify-mode chain --speculative-ngram-verify-widths 1,2,4,8
auto_w|$NG --speculative-ngram-verify-mode auto --speculative-ngram-verify-widths 1,2,4,8
CASES
}
OUT=${OUT:-$HOME/lossless-out}
W=$HOME/lossless
mkdir -p "$OUT"; rm -rf "$W"; mkdir -p "$W/logs"
T0=$(date +%s)
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/timeline.txt"; }
pack() { tar -C "$HOME" -cJf "$OUT/lossless.tar.xz" lossless 2>/dev/null; }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
if [ "${PREPARE:-1}" = 1 ]; then
  B=$(cd "${1:-$ROOT/.scratch/gpu-bundle}" && pwd) || exit 2
  # shellcheck disable=SC1091
  source "$B/device_env.sh" "$B" "${STORE:-/root/stage}" > "$W/prepare.log" 2>&1 || {
    log "prepare FAILED"; tail -30 "$W/prepare.log" | tee -a "$OUT/timeline.txt"; exit 1; }
  log "prepared: model $MODEL"
fi
# shellcheck disable=SC1091
source "$ROOT/lab/gpu/leftovers.sh"
msg=$(leftovers_stop); [ -n "$msg" ] && log "$msg"
declare -A PID PORT CMD RETRIED
start_one() {  # name: (re)start one server in a process group of its own
  [ -d "$HOME/jitcache" ] && { rm -rf "$HOME/jit-$1"; cp -r "$HOME/jitcache" "$HOME/jit-$1"; }
  # shellcheck disable=SC2086
  TVM_FFI_CACHE_DIR="$HOME/jit-$1" setsid ${CMD[$1]} > "$W/logs/$1.log" 2>&1 &
  PID[$1]=$!
  leftovers_record "${PID[$1]}"
}
i=0
for name in $SERVERS; do PORT[$name]=$((25000 + 10 * i)); i=$((i + 1)); done
ports=""; for port in "${PORT[@]}"; do ports="$ports $port $((port + 5))"; done
# shellcheck disable=SC2086
if p=$(taken_port $ports); then  # every port free before any server starts
  log "port $p is taken (not by a server this script started): stop it first"; exit 2
fi
leftovers_traps
for name in $SERVERS; do
  line=$(cases | grep "^$name|") || {
    echo "lossless.sh: unknown server $name; allowed: $(cases | cut -d'|' -f1 | tr '\n' ' ')" >&2
    exit 2; }
  flags=${line#*|}
  port=${PORT[$name]}
  cmd="${SGLANG_LAUNCH:-python3 -m sglang.launch_server} $COMMON $flags --port $port"
  cmd="$cmd --nccl-port $((port + 5))"
  echo "$name: $cmd" >> "$OUT/commands.txt"
  CMD[$name]=$cmd
  start_one "$name"
  sleep "${LAUNCH_GAP_S:-0}"
done
log "launched: $SERVERS"
declare -A UP
t_wait=$(date +%s)
while :; do
  pending=0
  for n in "${!PID[@]}"; do
    [ -n "${UP[$n]:-}" ] && continue
    if ! kill -0 "${PID[$n]}" 2>/dev/null; then UP[$n]=dead; log "$n: exited"
      tail -5 "$W/logs/$n.log" | cut -c1-300 >> "$OUT/timeline.txt"
      tail -60 "$W/logs/$n.log" | cut -c1-400 > "$OUT/died-$n.txt"; continue; fi
    if python3 -c "import sys, urllib.request as u
sys.exit(u.urlopen(sys.argv[1], timeout=2).status != 200)" \
        "http://127.0.0.1:${PORT[$n]}/health" >/dev/null 2>&1; then UP[$n]=ok; log "$n: healthy"
    else pending=$((pending + 1)); fi
  done
  if [ $pending -eq 0 ]; then
    # a server that died while the others started (their memory and graph captures on the same GPU
    # can spoil its start-up checks) is started once more, alone
    again=""
    for n in $SERVERS; do
      [ "${UP[$n]:-}" = dead ] && [ -z "${RETRIED[$n]:-}" ] && [ "${RETRY:-1}" = 1 ] && again=$n
    done
    [ -z "$again" ] && break
    mv "$W/logs/$again.log" "$W/logs/$again.first.log"; RETRIED[$again]=1; UP[$again]=""
    start_one "$again"; log "started again, alone: $again"; t_wait=$(date +%s); continue
  fi
  [ $(( $(date +%s) - t_wait )) -gt "${HEALTH_WAIT_S:-170}" ] && { log "giving up on $pending"; break; }
  sleep 2
done
first=${SERVERS%% *}
[ "${UP[$first]:-}" = ok ] || { log "$first (plain) is not up"; pack; exit 1; }
args=()
for n in $SERVERS; do
  [ "$n" = "$first" ] && continue
  if [ "${UP[$n]:-}" = ok ]; then args+=(--server "$n=http://127.0.0.1:${PORT[$n]}")
  else log "$n: not up, not checked"; fi
done
[ ${#args[@]} -gt 0 ] || { log "no speculative server up"; pack; exit 1; }
PLAIN="--plain http://127.0.0.1:${PORT[$first]} --plain-name $first"
# prompts encoded by the model folder's tokenizer (the bundle's server answers /tokenize with 500)
TOKENIZE=${TOKENIZE-"--tokenizer $MODEL"}
# shellcheck disable=SC2086
python3 "$ROOT/lab/gpu/lossless.py" greedy $PLAIN "${args[@]}" --concurrency 1,4 \
  ${GREEDY_ARGS:---max-new-tokens 128} $TOKENIZE --out "$OUT/greedy" > "$W/greedy.txt" 2>&1
log "greedy rc=$?: $(grep '^# result' "$W/greedy.txt")"
if [ "${SAMPLED:-1}" = 1 ]; then
  # shellcheck disable=SC2086
  python3 "$ROOT/lab/gpu/lossless.py" sampled $PLAIN "${args[@]}" \
    ${SAMPLED_ARGS:---sets grounded --per-set 3 --samples 300 --tokens 4} $TOKENIZE \
    --out "$OUT/sampled" > "$W/sampled.txt" 2>&1
  log "sampled rc=$?: $(grep '^# result' "$W/sampled.txt")"
fi
# errors, and the lines in which each flag of this project says it took effect
for f in "$W"/logs/*.log; do
  grep -E "Traceback|Error|NCCL settings|NCCL tuning|--tp-allreduce|n-gram verify|verify width|\
plain decode runtime|auto verify:|kernel warm-up|Verify timing on|pass-cost emulation|native_ops:" "$f" \
    | cut -c1-300 | head -12 | sed "s|^|$(basename "$f" .log): |"
done > "$OUT/log_excerpts.txt"
stop_groups "${PID[@]}" > /dev/null  # gone, their ports and memory free, before the end
pack
log "done"
grep -E "^## |^ +[0-9]+ |^# result" "$OUT/greedy/summary.txt" 2>/dev/null | head -40
grep -E "^## |^# result" "$OUT/sampled/summary.txt" 2>/dev/null | head -20
