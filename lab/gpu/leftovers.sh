#!/bin/bash
# Sourced by lossless.sh and evaluate.sh. Their servers run in process groups of their own
# (setsid), so a command killed from outside (a wall-clock limit) leaves them serving, and the next
# run would talk to them instead of its own. Each launch is recorded; before launching, servers
# recorded by an earlier run that still run are stopped, and a port that still answers is an error.
LEFTOVERS_FILE=${LEFTOVERS_FILE:-$HOME/lab-servers.pgids}
stop_groups() {  # pgid...: TERM, up to 15 s for them to go, then KILL; prints how many ran
  local pg n=0 t alive
  for pg in "$@"; do
    kill -0 -- -"$pg" 2>/dev/null || continue
    kill -TERM -- -"$pg" 2>/dev/null; n=$((n + 1))
  done
  for t in $(seq 1 30); do
    alive=0
    for pg in "$@"; do kill -0 -- -"$pg" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break; sleep 0.5
  done
  for pg in "$@"; do kill -KILL -- -"$pg" 2>/dev/null; done
  echo $n
}
leftovers_stop() {  # stop the process groups an earlier run recorded; say how many ran
  local n
  [ -f "$LEFTOVERS_FILE" ] || return 0
  # shellcheck disable=SC2046
  n=$(stop_groups $(cat "$LEFTOVERS_FILE"))
  [ "$n" -gt 0 ] && echo "stopped $n server(s) left running by an earlier run"
  rm -f "$LEFTOVERS_FILE"
}
leftovers_record() { echo "$1" >> "$LEFTOVERS_FILE"; }  # pgid of a server just started
taken_port() {  # port...: prints the first one something listens on at 127.0.0.1 (status 0),
  python3 -c "import socket, sys
for p in sys.argv[1:]:
    s = socket.socket(); s.settimeout(1)
    if s.connect_ex(('127.0.0.1', int(p))) == 0:
        print(p); sys.exit(0)
sys.exit(1)" "$@"  # or status 1 when all are free
}
leftovers_traps() {  # on any end, the servers started (the PID array) killed and forgotten (a
  # number the system may give out again); a TERM, INT or HUP ends the script through that too
  trap 'for pg in "${PID[@]}"; do kill -KILL -- -"$pg" 2>/dev/null; done
        rm -f "$LEFTOVERS_FILE"' EXIT
  trap 'log "stopped by a signal"; exit 143' TERM INT HUP
}
