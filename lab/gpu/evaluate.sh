#!/bin/bash
# The evaluation command: every server of every profile started together on the GPU machine, then
# each profile measured in interleaved, flushed, paired rounds (lab/gpu/evaluate.py), in one command
# of <= 600 s.
#
#   bash lab/gpu/evaluate.sh [BUNDLE_DIR]      from the repository root on the GPU machine;
#                                              BUNDLE_DIR: the carried .scratch/gpu-bundle
#                                              (docs/gpu-staging.md), the large parts already
#                                              received into STORE (default /root/stage)
#   bash lab/gpu/evaluate.sh --print-commands  every server command line (name|args), for
#                                              scripts/gpu/check_args.py
#
# Environment:
#   PROFILES      server sets measured one after the other (default "none"). A profile other than
#                 "none" is an emulated deployment: its servers get FLAGS_<profile> ('-' read as
#                 '_'), by default "$EMU_FLAG <profile>" (the pass-cost emulator's profile flag)
#   SERVERS       servers of each profile (default "A P tree chain_w auto_w"; table: cases())
#   FLAGS_SERVER_<name>  extra flags of that server in every profile, after its own (for example
#                 FLAGS_SERVER_chain_w="--enable-verify-timing": its verify passes timed)
#   ENV_SERVER_<name>    environment of that server ("K=V ..."), e.g. an A/B switch for
#                 auto_w_b or auto_never_b, the second auto_w or auto_never; a launch prefix too
#                 ("taskset -c 0-3": then PIN pins no server, the placement is the prefixes')
#   PIN=1         (default) each server name on cores of its own (taskset), the same cores in every
#                 profile: the machine's cores less PIN_SPARE (default 1, for the client and
#                 py-spy) split evenly in SERVERS order. Unpinned, two identical auto servers came
#                 4-8 % apart in every memorised launch (0.944, 1.039, 1.083); pinned, 1.025 and
#                 0.990, ties (benchmark/results/h200/eval-smollm2-tp1-pinned-twins). PIN=0: the
#                 OS places them; not pinned either where a server would get fewer cores than
#                 its TP ranks. `--print-pins` prints the plan (PIN_NPROC stands for nproc)
#   TP            ranks per server (default: the number of GPUs); the SmolLM2 model padded for it
#   EVAL_ARGS     extra arguments of `evaluate.py run` for every profile (--max-new-tokens,
#                 --per-set, --interleave wave: the servers take turns every c prompts rather
#                 than every prompt set, ...); EVAL_ARGS_<profile> for one profile, after EVAL_ARGS
#   STAGGER=1     start the profiles one after the other (each healthy before the next starts),
#                 so that no server calibrates while another one captures graphs on the same GPU;
#                 the default with more than one profile on a card under 100 GiB (on one H100, ten
#                 servers started at once: three failed SGLang's start-up memory check and were
#                 started again one at a time, 190 s of the call); STAGGER=0 starts them together
#   DEADLINE_S    (default 570) the whole command, with ANALYZE_S (default 35) kept for analysis
#                 (a warning up front when less than a minute of measuring would be left after
#                 START_GUESS_S, default 90, of server start-up)
#   LEFTOVERS_FILE (default $HOME/lab-servers.pgids): the process groups of the servers started;
#                 those of an earlier run that still run are stopped before the launch
#   HEALTH_WAIT_S (default 170) how long to wait for servers to answer /health; RETRY=1 (default)
#                 starts a server that died during the start once more (one at a time), after
#                 the others are up,
#                 if RETRY_MIN_LEFT_S (default 250) seconds are left
#   LAUNCH_GAP_S  seconds between two server launches (default 0: all at once)
#   MEM_FRACTION  each server's --mem-fraction-static (default 0.07; at 0.05 SGLang's KV-cache check
#                 refused a server that loaded after nine others, asking for >= 0.058)
#   SHARE_<profile> its weight in the sharing of the measuring time among profiles (default 1)
#   SGLANG_LAUNCH (default "python3 -m sglang.launch_server"; the rehearsal puts a stand-in here)
#   STEPTRACE=1   every server's scheduler loop recorded step by step (lab/steptrace/; with
#                 STEPTRACE_GPU=1 each step's device span too; with STEPTRACE_SPANS=0 no inner
#                 spans, so that every server pays the same tracing cost a step and the periods
#                 compare to 0.01 ms); lab/step_trace.py compares every server of a profile with
#                 its plain server A: steptrace_<profile>.txt. A server started with
#                 ENV_SERVER_<name>="FASTVERIFY_STEP_TRACE_AB=spin:US" alternates blocks of steps
#                 with and without that busy wait, or (put_first) with an earlier policy of the
#                 plain path and its own (lab/steptrace/steptrace.py), and
#                 lab/ab_within.py prices it inside that process: ab_<profile>.<name>.txt, its last
#                 line also in the timeline
#   PYSPY_SERVERS (e.g. "A auto_never") each named server's TP-0 scheduler sampled by py-spy
#                 (PYSPY_WHEEL, a py-spy wheel; --nonblocking, PYSPY_RATE per second, default 200)
#                 over the whole of its profile's measurement: pyspy_<profile>.<name>.txt (raw)
#                 and, for every other named server, lab/gpu/pyspy_top.py's comparison with the first
#                 one (pyspy_<profile>.<name>.vs.<first>.txt): same requests, same rounds; with
#                 STEPTRACE=1 also in us per decode step (pyspy_<profile>.<name>.vs.<first>.per_step.txt)
#   PYSPY_SERVERS_<profile> that profile's own list instead ("" for none): one launch can time a
#                 profile undisturbed and sample another, e.g. PYSPY_SERVERS="auto_w chain_w"
#                 PYSPY_SERVERS_none="" (py-spy's process shares the spare core and the memory
#                 bus with the servers). `--print-spies` prints each profile's list
#   WEIGHTS=dummy random weights of the model's shapes (--load-format dummy; no GGUF needed: the
#                 one-transfer bundle of scripts/gpu/one_transfer.sh). Cost only: acceptance and
#                 the greedy text mean nothing then, the servers' relative speed does
#   OUT           results (default $HOME/eval-out): summary.json, summary.txt, eval_<profile>.png,
#                 timeline.txt and evaluate.tar.xz (raw records, server logs, command lines, and
#                 under eval/out/ every other result: stretches.txt, each auto server's last log
#                 line on its plain-path stretches; the step traces; the py-spy files). The GPU
#                 machine hands back 8 files at most, so only those five kinds stay in $OUT
set -u
set +m
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
EV=$ROOT/lab/gpu/evaluate.py
PROFILES=${PROFILES:-none}
SERVERS=${SERVERS:-"A P tree chain_w auto_w"}
EMU_FLAG=${EMU_FLAG:-"--emulate-pass-cost"}
DEADLINE_S=${DEADLINE_S:-570}
ANALYZE_S=${ANALYZE_S:-35}
if [ -z "${TP:-}" ]; then
  TP=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU'); [ "$TP" -ge 1 ] || TP=1
fi
MODEL=${MODEL:-$HOME/models/smollm2-135m-tp$TP}
NG="--speculative-algorithm NGRAM --speculative-num-draft-tokens 8"
# every server captures decode graphs at the same batch sizes: SGLang's default list is 1 2 4 8 for
# a plain server and 1-8 for a speculative one, so a plain batch of 3 replayed the graph of 4 (under
# the nccl-numa-sm120 profile a pass of 4 tokens costs 17 % more than one of 3)
COMMON="--model-path $MODEL --tp $TP --attention-backend triton --sampling-backend pytorch
  --cuda-graph-max-bs-decode 8 --cuda-graph-bs-decode 1 2 3 4 5 6 7 8
  --cuda-graph-backend-prefill disabled --max-total-tokens 32768
  --mem-fraction-static ${MEM_FRACTION:-0.07} --decode-log-interval 40 --enable-metrics
  --sleep-on-idle --incremental-streaming-output --log-level info"
case "${WEIGHTS:-real}" in
  real) ;;
  dummy) COMMON="$COMMON --load-format dummy"; export FV_WEIGHTS=dummy ;;
  *) echo "evaluate.sh: WEIGHTS must be real or dummy, not '$WEIGHTS'" >&2; exit 2 ;;
esac
COMMON=$(echo $COMMON)

cases() {  # name|role|server flags
  cat <<EOF
A|plain|
P|noise|
tree|fixed|$NG
chain|fixed|$NG --speculative-ngram-verify-mode chain
chain_w|fixed|$NG --speculative-ngram-verify-mode chain --speculative-ngram-verify-widths 1,2,4,8
auto_w|auto|$NG --speculative-ngram-verify-mode auto --speculative-ngram-verify-widths 1,2,4,8
auto_never|auto|$NG --speculative-ngram-verify-mode auto --speculative-ngram-verify-widths 1,2,4,8 --speculative-ngram-auto-cost-table $ROOT/lab/gpu/cost_never_speculate.json
auto_w_b|auto|$NG --speculative-ngram-verify-mode auto --speculative-ngram-verify-widths 1,2,4,8
auto_never_b|auto|$NG --speculative-ngram-verify-mode auto --speculative-ngram-verify-widths 1,2,4,8 --speculative-ngram-auto-cost-table $ROOT/lab/gpu/cost_never_speculate.json
EOF
}
group_flags() {  # the extra server flags of a profile
  [ "$1" = none ] && return 0
  local v="FLAGS_$(echo "$1" | tr -- '-.' '__')"
  echo "${!v-$EMU_FLAG $1}"
}
servers_of() {  # index profile -> "name|role|port|args" lines
  local gi=$1 g=$2 si=0 name role flags
  for want in $SERVERS; do
    IFS='|' read -r name role flags < <(cases | grep "^$want|") || {
      echo "evaluate.sh: unknown server $want; allowed: $(cases | cut -d'|' -f1 | tr '\n' ' ')" >&2
      return 2; }
    local own="FLAGS_SERVER_$name"
    echo "$name|$role|$((24000 + 200 * gi + 10 * si))|$COMMON $flags ${!own:-} $(group_flags "$g")"
    si=$((si + 1))
  done
}
all_servers() {
  local gi=0 g
  for g in $PROFILES; do servers_of $gi "$g" || return 2; gi=$((gi + 1)); done
}
case "${PIN:-1}" in 0|1) ;; *) echo "evaluate.sh: PIN must be 0 or 1, not '$PIN'" >&2; exit 2 ;; esac
[[ "${PIN_SPARE:-1}" =~ ^[0-9]+$ ]] || {
  echo "evaluate.sh: PIN_SPARE must be a count of cores, not '$PIN_SPARE'" >&2; exit 2; }
declare -A PINS
pin_plan() {  # PINS[name]="taskset -c a-b" for each server name PIN pins; prints "name cores"
  [ "${PIN:-1}" = 1 ] || return 0
  local cores=${PIN_NPROC:-$(nproc 2>/dev/null || echo 1)} names=() n own first=0 per
  for n in $SERVERS; do
    own="ENV_SERVER_$n"
    if [[ "${!own:-}" == *taskset* || "${!own:-}" == *numactl* ]]; then
      # (cores chosen here could overlap those: the placement is left to the given prefixes)
      echo "not pinned: ENV_SERVER_$n places that server itself"
      return 0
    fi
    [[ " ${names[*]:-} " == *" $n "* ]] || names+=("$n")
  done
  [ ${#names[@]} -ge 1 ] || return 0
  per=$(( (cores - ${PIN_SPARE:-1}) / ${#names[@]} ))
  # (each of a server's TP ranks runs a scheduler process of its own: a core each at least)
  if [ "$per" -lt "$TP" ] || ! command -v taskset > /dev/null; then
    echo "not pinned: $cores cores for ${#names[@]} servers of $TP rank(s) and" \
      "${PIN_SPARE:-1} spare $(command -v taskset > /dev/null || echo '(no taskset)')"
    return 0
  fi
  for n in "${names[@]}"; do
    PINS[$n]="taskset -c $first-$((first + per - 1))"
    echo "$n $first-$((first + per - 1))"
    first=$((first + per))
  done
}
spies_of() {  # profile -> the servers py-spy samples in it (PYSPY_SERVERS_<profile>, else PYSPY_SERVERS)
  local v="PYSPY_SERVERS_$(echo "$1" | tr -- '-.' '__')"
  echo ${!v-${PYSPY_SERVERS:-}}
}
spies_checked() {  # every py-spy list names servers of SERVERS only
  local g n
  for g in $PROFILES; do
    for n in $(spies_of "$g"); do
      [[ " $SERVERS " == *" $n "* ]] || {
        echo "evaluate.sh: py-spy server $n of profile $g is not among SERVERS ($SERVERS)" >&2
        return 2; }
    done
  done
}
if [ "${1:-}" = --print-pins ]; then pin_plan; exit 0; fi
if [ "${1:-}" = --print-spies ]; then
  spies_checked || exit 2
  for g in $PROFILES; do echo "$g: $(spies_of "$g")"; done
  exit 0
fi
if [ "${1:-}" = --print-commands ]; then
  gi=0
  for g in $PROFILES; do
    servers_of $gi "$g" | while IFS='|' read -r n r port args; do
      echo "$g.$n|$args --port $port --nccl-port $((port + 5))"; done
    gi=$((gi + 1))
  done
  exit 0
fi
all_servers > /dev/null || exit 2
spies_checked || exit 2

B=$(cd "${1:-$ROOT/.scratch/gpu-bundle}" && pwd) || exit 2
OUT=${OUT:-$HOME/eval-out}
W=$HOME/eval
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( DEADLINE_S - $(el) )); }
log() { echo "[$(el)s] $*" | tee -a "$W/timeline.txt"; }
# the GPU machine hands back at most 8 files of $OUT: every result file other than the summary, the
# timeline, the plots and the tarball goes into the tarball's eval/out/ ($R)
tidy_out() { local w; w=$(bash "$ROOT/lab/gpu/tidy_out.sh" "$OUT" "$R") || log "$w"; }
pack() { cp "$W/timeline.txt" "$OUT/"; tidy_out
  if tar -C "$HOME" -cJf "$OUT/evaluate.tar.xz.tmp" eval; then
    mv "$OUT/evaluate.tar.xz.tmp" "$OUT/evaluate.tar.xz"
  else rm -f "$OUT/evaluate.tar.xz.tmp"; fi; }
STAGGER_WHY=""
if [ -z "${STAGGER+x}" ] && [ "$(echo "$PROFILES" | wc -w)" -gt 1 ]; then
  mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null \
        | sort -n | head -n 1)
  if [ -n "$mib" ] && [ "$mib" -lt 102400 ] 2>/dev/null; then
    STAGGER=1; STAGGER_WHY=" (STAGGER=1: more than one profile on a card of $mib MiB)"; fi
fi
REPRO="PROFILES=\"$PROFILES\" SERVERS=\"$SERVERS\" TP=$TP EVAL_ARGS=\"${EVAL_ARGS:-}\""
for g in $PROFILES; do
  v="EVAL_ARGS_$(echo "$g" | tr -- '-.' '__')"; [ -n "${!v:-}" ] && REPRO="$REPRO $v=\"${!v}\""
  v="FLAGS_$(echo "$g" | tr -- '-.' '__')"; [ -n "${!v+x}" ] && REPRO="$REPRO $v=\"${!v}\""
done
for v in EMU_FLAG LAUNCH_GAP_S DEADLINE_S STAGGER MEM_FRACTION STEPTRACE STEPTRACE_GPU \
         STEPTRACE_SPANS WEIGHTS PYSPY_SERVERS PYSPY_WHEEL PYSPY_RATE PIN PIN_SPARE; do
  [ -n "${!v+x}" ] && REPRO="$REPRO $v=\"${!v}\""
done
for v in $(compgen -v SHARE_); do REPRO="$REPRO $v=${!v}"; done
for v in $(compgen -v PYSPY_SERVERS_); do REPRO="$REPRO $v=\"${!v}\""; done
for v in $(compgen -v FLAGS_SERVER_) $(compgen -v ENV_SERVER_); do REPRO="$REPRO $v=\"${!v}\""; done
REPRO="$REPRO bash lab/gpu/evaluate.sh"
R=$W/out  # the results that travel inside evaluate.tar.xz only (tidy_out)
mkdir -p "$OUT"; rm -rf "$W"; mkdir -p "$W/logs" "$W/raw" "$R"; : > "$W/timeline.txt"
log "start on $(hostname): profiles '$PROFILES', servers '$SERVERS', TP=$TP$STAGGER_WHY"
pin_plan > "$W/pins.txt"
[ -s "$W/pins.txt" ] && log "cores (PIN=${PIN:-1}): $(tr '\n' ';' < "$W/pins.txt" | sed 's/;$//; s/;/, /g')"
# servers took 60-90 s to answer on the H200 machine; a deadline that leaves less than a minute of
# measuring after that and the analysis ends with no round at all: said now, not after the call
if [ $((DEADLINE_S - ANALYZE_S - ${START_GUESS_S:-90})) -lt 60 ]; then
  log "warning: DEADLINE_S=$DEADLINE_S leaves $((DEADLINE_S - ANALYZE_S - ${START_GUESS_S:-90})) s" \
    "to measure after ~${START_GUESS_S:-90} s of server start-up and ${ANALYZE_S} s of analysis"
fi
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
# shellcheck disable=SC1091
source "$B/device_env.sh" "$B" "${STORE:-/root/stage}" > "$W/prepare.log" 2>&1 || {
  log "prepare FAILED"; tail -30 "$W/prepare.log" | tee -a "$W/timeline.txt"; pack; exit 1; }
log "prepared: jit modules $(ls "$HOME/jitcache" | wc -l), model $MODEL"
SPY=""
if [ -n "$(for g in $PROFILES; do spies_of "$g"; done)" ]; then
  if [ -f "${PYSPY_WHEEL:-}" ] && python3 -m pip install -q --no-index --no-deps --target \
       "$HOME/pyspy" "$PYSPY_WHEEL" > "$W/pyspy_install.log" 2>&1; then
    SPY=$HOME/pyspy/bin/py-spy
  fi
  log "py-spy: ${SPY:-none (PYSPY_WHEEL '${PYSPY_WHEEL:-}' is no wheel that installs)}"
fi
COMMIT=$(sed -n 's/^# bundle built .* from \([0-9a-f+dirty]*\).*/\1/p' "$B/MANIFEST.txt" \
  2>/dev/null)

# shellcheck disable=SC1091
source "$ROOT/lab/gpu/leftovers.sh"
msg=$(leftovers_stop); [ -n "$msg" ] && log "$msg"
# every port free before any server starts (a server of an earlier run would answer in its place)
ports=$(all_servers | while IFS='|' read -r _ _ port _; do echo "$port $((port + 5))"; done)
# shellcheck disable=SC2086
if p=$(taken_port $ports); then
  log "port $p is taken (not by a server this script started): stop it first"; pack; exit 2
fi
declare -A PID PORT ROLE UP CMD RETRIED
launch_group() {  # index profile
  local n r port args cmd
  while IFS='|' read -r n r port args; do
    local key="$2.$n"
    cp -r "$HOME/jitcache" "$HOME/jit-$key"
    local own="ENV_SERVER_$n"
    cmd="${!own:-} ${PINS[$n]:-} ${SGLANG_LAUNCH:-python3 -m sglang.launch_server} $args"
    cmd="$cmd --port $port"
    cmd="$cmd --nccl-port $((port + 5))"
    echo "$key: TVM_FFI_CACHE_DIR=$HOME/jit-$key $cmd" >> "$W/commands.txt"
    CMD[$key]=$cmd; PORT[$key]=$port; ROLE[$key]=$r
    start_one "$key"
    sleep "${LAUNCH_GAP_S:-0}"
  done < <(servers_of "$1" "$2")
  log "launched profile $2: $(servers_of "$1" "$2" | cut -d'|' -f1 | tr '\n' ' ')"
}
start_one() {  # key: (re)start one server in a process group of its own
  # shellcheck disable=SC2086
  local trace=""
  if [ "${STEPTRACE:-0}" = 1 ]; then
    trace="FASTVERIFY_STEP_TRACE=$W/steps/$1 PYTHONPATH=$ROOT/lab/steptrace:${PYTHONPATH:-}"
    [ "${STEPTRACE_GPU:-0}" = 1 ] && trace="$trace FASTVERIFY_STEP_TRACE_GPU=1"
    [ "${STEPTRACE_SPANS:-1}" = 0 ] && trace="$trace FASTVERIFY_STEP_TRACE_SPANS=0"
  fi
  # shellcheck disable=SC2086
  TVM_FFI_CACHE_DIR="$HOME/jit-$1" setsid env $trace ${CMD[$1]} > "$W/logs/$1.log" 2>&1 &
  PID[$1]=$!
  leftovers_record "${PID[$1]}"
}
healthy() {
  python3 -c "import sys, urllib.request as u
sys.exit(u.urlopen(sys.argv[1], timeout=2).status != 200)" \
    "http://127.0.0.1:$1/health" >/dev/null 2>&1
}
wait_up() {  # until every launched server answers, died, or HEALTH_WAIT_S passed since $1
  local n pending
  while :; do
    pending=0
    for n in "${!PID[@]}"; do
      [ -n "${UP[$n]:-}" ] && continue
      if ! kill -0 "${PID[$n]}" 2>/dev/null; then UP[$n]=dead; log "$n: exited"
        tail -4 "$W/logs/$n.log" | cut -c1-300 >> "$W/timeline.txt"; continue; fi
      if healthy "${PORT[$n]}"; then UP[$n]=ok; log "$n: healthy"; else pending=$((pending + 1)); fi
    done
    if [ $pending -eq 0 ]; then
      # RETRY=1 (default): a server that died while the others started (a start-up check that the
      # others' graph captures on the same GPU disturbed, say) is started once more, alone
      local again=""
      for n in "${!PID[@]}"; do
        [ "${UP[$n]}" = dead ] && [ -z "${RETRIED[$n]:-}" ] && [ "${RETRY:-1}" = 1 ] \
          && again="$again $n"
      done
      [ -z "$again" ] && return 0
      if [ "$(left)" -lt "${RETRY_MIN_LEFT_S:-250}" ]; then
        log "no time to start$again again"; return 0; fi
      # one at a time: two servers starting together can spoil each other's start-up checks
      n=${again# }; n=${n%% *}
      mv "$W/logs/$n.log" "$W/logs/$n.first.log"; RETRIED[$n]=1; UP[$n]=""; start_one "$n"
      log "started again: $n"; set -- "$(el)"; continue
    fi
    if [ $(( $(el) - $1 )) -gt "${HEALTH_WAIT_S:-170}" ]; then
      log "giving up on $pending server(s)"; return 1; fi
    sleep 2
  done
}
leftovers_traps
python3 "$EV" env --out "$W/env.json" --commit "${COMMIT:-unknown}" --repro "$REPRO" \
  > /dev/null 2>&1 &
ENVJOB=$!
gi=0; t_launch=$(el)
for g in $PROFILES; do
  launch_group $gi "$g"; gi=$((gi + 1))
  [ "${STAGGER:-0}" = 1 ] && { wait_up "$t_launch"; t_launch=$(el); }
done
wait_up "$t_launch"
nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv,noheader \
  >> "$W/timeline.txt" 2>&1
wait $ENVJOB
pack

step_traces() {  # profile index: its servers' traces against its plain server A, once they stopped
  local specs=() n
  sleep 3  # a stopped scheduler writes what it holds when it exits
  while IFS='|' read -r n _; do
    [ -d "$W/steps/$1.$n" ] && specs+=("$n=$W/steps/$1.$n")
  done < <(servers_of "$2" "$1")
  [ ${#specs[@]} -ge 1 ] || { log "profile $1: no step trace"; return; }
  python3 "$ROOT/lab/step_trace.py" "${specs[@]}" --json "$R/steptrace_$1.json" \
    > "$R/steptrace_$1.txt" 2>&1
  log "profile $1: step traces rc=$? (${#specs[@]} servers)"
  within_ab "$1" "$2"
}
within_ab() {  # profile index: each server started with a within-process A/B, its paired result
  local n own
  while IFS='|' read -r n _; do
    own="ENV_SERVER_$n"
    [[ "${!own:-}" == *FASTVERIFY_STEP_TRACE_AB=* ]] && [ -d "$W/steps/$1.$n" ] || continue
    python3 "$ROOT/lab/ab_within.py" "$n=$W/steps/$1.$n" \
      --json "$R/ab_$1.$n.json" > "$R/ab_$1.$n.txt" 2>&1
    log "profile $1: within-process A/B of $n (rc=$?): $(tail -n 1 "$R/ab_$1.$n.txt")"
  done < <(servers_of "$2" "$1")
}
spy_start() {  # profile: py-spy on each of its servers' (spies_of) TP-0 scheduler until spy_stop
  SPIES=(); SPIED=()  # (set here for each profile: spy_stop reads them)
  [ -n "$SPY" ] || return 0
  local n pid
  for n in $(spies_of "$1"); do
    pid=$(bash "$ROOT/lab/gpu/scheduler_pid.sh" "${PID[$1.$n]:-none}")
    [ -n "$pid" ] || { log "py-spy: no TP-0 scheduler of $1.$n"; continue; }
    "$SPY" record --pid "$pid" --rate "${PYSPY_RATE:-200}" --format raw --nonblocking \
      --output "$R/pyspy_$1.$n.txt" > "$W/logs/pyspy_$1.$n.log" 2>&1 &
    SPIES+=($!); SPIED+=("$n")
  done
}
spy_against() {  # profile name suffix [pyspy_top.py args]: that server's profile against the first's
  local p=$1 n=$2 suffix=$3 first=${SPIED[0]}; shift 3
  python3 "$ROOT/lab/gpu/pyspy_top.py" "$R/pyspy_$p.$n.txt" --against "$R/pyspy_$p.$first.txt" \
    --rate "${PYSPY_RATE:-200}" --top 80 "$@" > "$R/pyspy_$p.$n.vs.$first$suffix.txt" 2>&1
}
spy_stop() {  # profile: py-spy stopped (it writes its profile on SIGINT), the others against the first
  [ ${#SPIES[@]} -gt 0 ] || return 0
  kill -INT "${SPIES[@]}" 2>/dev/null
  wait "${SPIES[@]}" 2>/dev/null
  local n first=${SPIED[0]} got=""
  for n in "${SPIED[@]}"; do
    [ -s "$R/pyspy_$1.$n.txt" ] && got="$got $n"
    python3 "$ROOT/lab/gpu/pyspy_top.py" "$R/pyspy_$1.$n.txt" --top 60 \
      > "$R/pyspy_$1.$n.top.txt" 2>&1
    [ "$n" = "$first" ] || spy_against "$1" "$n" ""
  done
  log "profile $1: py-spy profiles of${got:- none} (sampled: ${SPIED[*]}; logs/pyspy_*.log)"
}
spy_per_step() {  # profile: spy_stop's comparisons again in us per decode step (the step traces')
  [ ${#SPIED[@]} -gt 1 ] && [ -s "$R/steptrace_$1.json" ] || return 0
  local n first=${SPIED[0]}
  for n in "${SPIED[@]:1}"; do
    spy_against "$1" "$n" .per_step --steptrace "$R/steptrace_$1.json" --names "$n,$first"
  done
  log "profile $1: py-spy comparisons per decode step: pyspy_$1.*.per_step.txt"
}
share() { local v="SHARE_$(echo "$1" | tr -- '-.' '__')"; echo "${!v:-1}"; }
shares_left=0; for g in $PROFILES; do shares_left=$((shares_left + $(share "$g"))); done
gi=0; RAWS=()
for g in $PROFILES; do
  args=(); skip=""
  while IFS='|' read -r n r port _; do
    if [ "${UP[$g.$n]:-}" != ok ]; then
      [ "$r" = plain ] && skip="plain server $g.$n is not up"; continue; fi
    args+=(--server "$n,$r,http://127.0.0.1:$port")
  done < <(servers_of $gi "$g")
  # the time left, shared among the profiles still to run by their SHARE_<profile> (default 1)
  budget=$(( ($(left) - ANALYZE_S) * $(share "$g") / shares_left ))
  shares_left=$((shares_left - $(share "$g")))
  gi=$((gi + 1))
  if [ -n "$skip" ] || [ "$budget" -lt 30 ]; then
    log "profile $g skipped: ${skip:-$budget s left}"; continue; fi
  v="EVAL_ARGS_$(echo "$g" | tr -- '-.' '__')"
  log "profile $g: ${#args[@]} args, budget $budget s"
  spy_start "$g"
  # shellcheck disable=SC2086
  timeout $((budget + 60)) python3 "$EV" run "${args[@]}" --group "$g" \
    --group-flags "$(group_flags "$g")" --time-budget-s "$budget" --repro "$REPRO" \
    --out "$W/raw/$g.json" ${EVAL_ARGS:-} ${!v:-} > "$W/run_$g.txt" 2>&1
  log "profile $g: rc=$?; $(tail -1 "$W/run_$g.txt" | cut -c1-200)"
  [ -f "$W/raw/$g.json" ] && RAWS+=("$W/raw/$g.json")
  spy_stop "$g"
  # this profile's servers are done: stop them (the next profile then runs beside idle processes)
  while IFS='|' read -r n _; do kill -TERM -- -"${PID[$g.$n]}" 2>/dev/null
  done < <(servers_of $((gi - 1)) "$g")
  [ "${STEPTRACE:-0}" = 1 ] && step_traces "$g" $((gi - 1)) && spy_per_step "$g"
  pack
done
{ for f in "$W"/logs/*.log; do
    echo "=== $f"
    grep -E -e "emulat|pass.cost|auto verify|n-gram verify|verify width|accept len|draftlog" \
      -e "Traceback|Error" "$f" \
      | grep -vE "Fail to set RLIMIT|helion|openai_harmony" | cut -c1-400 | head -40
  done; } > "$W/log_excerpts.txt" 2>&1
# each auto server's last line on its stretches without speculation on the plain decode path (how
# many of its decode steps ran there, and why the others did not)
{ for f in "$W"/logs/*.log; do
    l=$(grep -h "stretches on the plain decode path" "$f" | tail -1 | cut -c1-1200)
    [ -n "$l" ] && echo "$(basename "$f" .log): $l"
  done; } > "$R/stretches.txt" 2>/dev/null
[ -s "$R/stretches.txt" ] || echo "(no server logged stretches on the plain decode path)" \
  > "$R/stretches.txt"
if [ ${#RAWS[@]} -gt 0 ]; then
  python3 "$EV" analyze "${RAWS[@]}" --env "$W/env.json" --repro "$REPRO" --out-dir "$OUT" \
    --logs "$W/logs" \
    > "$W/analyze.txt" 2>&1
  log "analysis rc=$?: $(ls "$OUT" | tr '\n' ' '); in the tarball's eval/out: $(ls "$R" | tr '\n' ' ')"
  grep -E "^(##|###|GOAL|# rounds|A |P |tree|chain|auto)" "$OUT/summary.txt" | cut -c1-160 \
    | tail -60
else
  log "no profile measured"
fi
log "done"
pack
