#!/usr/bin/env bash
# The test command (README, CI): the whole suite, real processes included. Extra args go to pytest.
# pytest's "no tests collected" (exit 5) is a failure here, never a silent pass.
set -u
cd "$(dirname "$0")/.."
rc=0
.venv/bin/python -m pytest -q -p no:cacheprovider "$@" || rc=$?
if [ "$rc" -eq 5 ]; then
  echo "tests/run.sh: pytest collected no tests; that is a failure" >&2
  exit 1
fi
exit "$rc"
