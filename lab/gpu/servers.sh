# Shared by the GPU-machine check scripts (source it): start SGLang servers together, wait for health,
# run the serving client, scrape /metrics, find a server's TP-0 scheduler. A check begins with
# `start_check NAME BUNDLE_DIR` (D, W, OUT, T0) and sets DEADLINE_S; prepare_machine sets PYTHONPATH to the
# unpacked site.
start_check() {  # start_check NAME BUNDLE_DIR: D = the bundle, W = $HOME/NAME (work), OUT (default $HOME/NAME-out)
  CHECK=$1
  D=$(cd "${2:?bundle dir}" && pwd) || exit 2
  OUT=${OUT:-$HOME/$CHECK-out}
  W=$HOME/$CHECK
  mkdir -p "$OUT" "$W"
  T0=$(date +%s)
}
pack() {  # the work folder as $OUT/NAME.tar.xz (written whole or not at all)
  tar -C "$HOME" -cJf "$OUT/$CHECK.tar.xz.tmp" "$CHECK" && mv "$OUT/$CHECK.tar.xz.tmp" "$OUT/$CHECK.tar.xz"
}
el() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( DEADLINE_S - $(el) )); }
log() { echo "[$(el)s] $*" | tee -a "$W/timeline.txt"; }
declare -A PID PORT UP
# the server settings every check shares (TP=2, token-id requests, graphs up to bs 8, metrics on); ATTN picks
# the attention backend (default triton, the one SM120 has too; fa3 on Hopper), TP the ranks (TP=8 on 8 GPUs)
COMMON="--tp ${TP:-2} --skip-tokenizer-init --attention-backend ${ATTN:-triton} --sampling-backend pytorch \
--cuda-graph-max-bs-decode 8 --cuda-graph-backend-prefill disabled --max-total-tokens 32768 \
--decode-log-interval 40 --enable-metrics --sleep-on-idle --log-level info"
NG="--speculative-algorithm NGRAM --speculative-num-draft-tokens 8"

unpack_bundle() {  # site + overlay + JIT cache from $D into $HOME
  mkdir -p "$HOME/site" "$HOME/jitcache"
  tar -xJf "$D/site.tar.xz" -C "$HOME/site" && tar -xJf "$D/overlay.tar.xz" -C "$HOME/site" \
    && tar -xJf "$D/jitcache.tar.xz" -C "$HOME/jitcache"
}

prepare_machine() {  # multicast off, bundle unpacked, py-spy (if its wheel is in $D), a 2-layer random model
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
  unpack_bundle || { log "unpack failed"; return 1; }
  export PYTHONPATH=$HOME/site
  SPY=""
  if ls "$D"/py_spy-*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --target "$HOME/pyspy" "$D"/py_spy-*.whl && SPY=$HOME/pyspy/bin/py-spy
  fi
  python3 scripts/gpu/make_random_model.py "$HOME/models/tiny" --layers 2 > "$W/make_model.log" 2>&1
  { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    python3 -c 'import torch,sglang;print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version(), sglang.__version__)'
    env | grep -E '^(NCCL|TORCH)' | sort; } > "$W/env.txt" 2>&1
  # the host's CPUs before any server starts (their speed varies by CPU and over seconds on a shared host:
  # lab/gpu/cpu_probe.py), so that each run's host-side numbers can be read against the host it had
  python3 lab/gpu/cpu_probe.py --bases "" --reps 3 --json "$W/cpu_probe.json" > "$W/cpu_probe.txt" 2>&1
  log "unpacked; py-spy: ${SPY:-none}; commit $(cat "$D/commit.txt" 2>/dev/null || echo unknown); $(grep '^work alone' "$W/cpu_probe.txt")"
}

launch_servers() {  # launch_servers "COMMON ARGS" <<< "name|port|extra args" lines; SRV_ENV_<name>="K=V ..."
  local common=$1 name port extra envv                  # adds environment variables to that server only,
  # SRV_ENV_ALL="K=V ..." to every server (e.g. SGLANG_SET_CPU_AFFINITY=1: each TP rank bound to its own block of CPUs)
  while IFS='|' read -r name port extra; do
    [ -z "$name" ] && continue
    cp -r "$HOME/jitcache" "$HOME/jit-$name"
    envv="SRV_ENV_$name"
    trace=""  # STEPTRACE=1: every scheduler iteration recorded under $W/steps-NAME (lab/step_trace.py)
    [ "${STEPTRACE:-0}" = 1 ] && trace="FASTVERIFY_STEP_TRACE=$W/steps-$name PYTHONPATH=$PWD/lab/steptrace:$PYTHONPATH"
    # STEPTRACE_GPU=1 (with STEPTRACE=1): each step's device span and the forward stream's idle gap after it
    [ -n "$trace" ] && [ "${STEPTRACE_GPU:-0}" = 1 ] && trace="$trace FASTVERIFY_STEP_TRACE_GPU=1"
    TVM_FFI_CACHE_DIR="$HOME/jit-$name" setsid env $trace ${SRV_ENV_ALL:-} ${!envv:-} python3 -m sglang.launch_server $common \
      --port "$port" --nccl-port $((port + 5)) $extra > "$W/$name.log" 2>&1 &
    PID[$name]=$!; PORT[$name]=$port
    echo "$name: $trace ${SRV_ENV_ALL:-} ${!envv:-} python3 -m sglang.launch_server $common --port $port --nccl-port $((port + 5)) $extra" >> "$W/commands.txt"
  done
  log "launched ${!PID[*]}"
}

wait_healthy() {  # wait_healthy MIN_LEFT_S: until all are up, dead, or fewer than MIN_LEFT_S seconds remain
  local n pending
  for _ in $(seq 1 150); do
    pending=0
    for n in "${!PID[@]}"; do
      [ -n "${UP[$n]:-}" ] && continue
      if ! kill -0 "${PID[$n]}" 2>/dev/null; then UP[$n]=dead; log "$n: exited"; tail -5 "$W/$n.log" >> "$W/timeline.txt"; continue; fi
      if python3 -c "import sys,urllib.request as u; sys.exit(u.urlopen('http://127.0.0.1:${PORT[$n]}/health',timeout=2).status!=200)" 2>/dev/null
      then UP[$n]=ok; log "$n: healthy"; else pending=$((pending + 1)); fi
    done
    [ $pending -eq 0 ] && return 0
    [ "$(left)" -lt "$1" ] && { log "stop waiting: $pending not up"; return 1; }
    sleep 2
  done
}

up() { [ "${UP[$1]:-}" = ok ]; }
stop_server() { kill -TERM -- -"${PID[$1]}" 2>/dev/null; UP[$1]=stopped; }
stop_all() { local n; for n in "${!PID[@]}"; do kill -KILL -- -"${PID[$n]}" 2>/dev/null; done; }

client() {  # client SERVER TAG ARGS...: serving.py run against SERVER, JSON + table to $W/TAG.*
  local n=$1 tag=$2 rc; shift 2
  timeout "${CLIENT_TIMEOUT_S:-150}" python3 "$D/serving.py" run --base-url "http://127.0.0.1:${PORT[$n]}" \
    --tag "$tag" --input-ids --no-progress --json "$W/$tag.json" "$@" > "$W/$tag.txt" 2>&1
  rc=$?
  log "$tag: rc=$rc $(grep -E '^ +c=' "$W/$tag.txt" | tr -s ' ' | tr '\n' ';')"
  if [ $rc = 124 ]; then log "$n: client timed out; server stopped"; stop_server "$n"; UP[$n]=timeout; fi
}

scrape() {  # scrape SERVER: its sglang:verify_* and auto metrics to $W/SERVER.metrics.txt
  python3 -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:${PORT[$1]}/metrics',timeout=5).read().decode())" \
    2>&1 | grep -E '^sglang:(verify_|fastverify_)' > "$W/$1.metrics.txt"
}

tp0_pid() {  # the TP-0 scheduler process of a server (in the server's own process group)
  bash "$(dirname "${BASH_SOURCE[0]}")/scheduler_pid.sh" "${PID[$1]}"
}
