#!/usr/bin/env bash
# The test command: build (or reuse) the CPU test environment of every pinned SGLang, apply the patch
# series to it, and run the test suite in it. Extra arguments go to pytest.
#   scripts/run_tests.sh [pytest args...]        VERSIONS="0.5.16" limits the releases
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
VERSIONS=${VERSIONS:-$(awk '!/^#/ && NF {print $1}' pins.txt)}
status=0
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
