# Progress lines for the setup scripts (sourced; bash). No step of a setup stays quiet for more than
# ~20 s: `say` stamps a line with the seconds since the start, `heartbeat` repeats one while a step
# that prints nothing runs, `pip_progress` keeps one short line per package from pip's output.
#   PROGRESS_TAG   the tag in front of each line (e.g. "setup 0.5.23")
#   HEARTBEAT_S    seconds between heartbeat lines (default 20)
PROGRESS_T0=${PROGRESS_T0:-$(date +%s)}
say() { echo "[${PROGRESS_TAG:-setup}] $(( $(date +%s) - PROGRESS_T0 ))s: $*"; }

HB=
heartbeat() {  # heartbeat "what is running"  ... heartbeat_end
  ( while sleep "${HEARTBEAT_S:-20}"; do say "$1 (still running)"; done ) & HB=$!
}
heartbeat_end() { [ -z "$HB" ] || { kill "$HB" 2>/dev/null; wait "$HB" 2>/dev/null; HB=; } || true; }

pip_progress() {  # pip ... | pip_progress
  awk '/^Collecting / { print "  collecting " $2; fflush(); next }
       /^(Downloading|Processing) / { n = split($2, p, "/"); print "  " tolower($1) " " p[n]; fflush(); next }
       /^Installing collected packages:/ { print "  installing the collected packages ..."; fflush(); next }
       /^Successfully installed / { print "  installed " (NF - 2) " packages"; fflush(); next }'
}
