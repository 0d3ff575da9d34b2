#!/usr/bin/env bash
# The test command: build (or reuse) the CPU test environment of every pinned SGLang, apply the patch
# series to it, and run the test suite in it. Extra arguments go to pytest.
#   scripts/run_tests.sh [pytest args...]        VERSIONS="0.5.16" limits the releases
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
VERSIONS=${VERSIONS:-$(awk '!/^#/ && NF {print $1}' pins.txt)}
status=0
# Disk first: a full disk fails deep inside pip or pytest with a message that names neither. Each
# missing environment takes ~2.6 GiB in the checkout; the suite's patched copies of SGLang ~1.5 GiB
# in the temporary folder.
free_gib() { df -Pk "$1" 2>/dev/null | awk 'NR==2 {printf "%.1f", $4 / 1048576}'; }
tmpdir=${TMPDIR:-/tmp}
need_here=0
for v in $VERSIONS; do [ -x "$ROOT/.venv-$v/bin/python" ] || need_here=$(( need_here + 3 )); done
need_tmp=2
if [ "$(stat -c %d "$ROOT")" = "$(stat -c %d "$tmpdir")" ]; then
  need_here=$(( need_here + need_tmp )); need_tmp=0
fi
for pair in "$ROOT:$need_here" "$tmpdir:$need_tmp"; do
  dir=${pair%:*} need=${pair##*:}
  [ "$need" -gt 0 ] || continue
  have=$(free_gib "$dir")
  if [ -n "$have" ] && awk -v h="$have" -v n="$need" 'BEGIN {exit !(h < n)}'; then
    echo "not enough disk for the tests: $have GiB free on the filesystem of $dir, about $need GiB" \
         "needed (3 GiB for each missing .venv-VERSION, 2 GiB of test copies in $tmpdir, each" \
         "with some room over the 2.6 and 1.5 GiB they take); free some space and run again" >&2
    exit 1
  fi
done
# Every environment first: the tests of one release also read the other release's pristine sources.
for v in $VERSIONS; do
  bash scripts/setup_test_env.sh "$v" "$ROOT/.venv-$v" || { echo "setup of SGLang $v failed" >&2; exit 1; }
done
for v in $VERSIONS; do
  VENV=$ROOT/.venv-$v
  "$VENV/bin/python" -m fastverify patches apply || { echo "applying the $v series failed" >&2; exit 1; }
  echo "=== tests against SGLang $v ($VENV) ==="
  "$VENV/bin/python" -m pytest -p no:cacheprovider -rs "$@"
  rc=$?
  if [ $rc -eq 5 ]; then echo "no tests collected for $v"; rc=0; fi
  [ $rc -ne 0 ] && status=$rc
done
exit $status
