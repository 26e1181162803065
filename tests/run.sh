#!/usr/bin/env bash
# The test command (README, CI): the whole suite, real processes included. Extra args go to pytest.
# The suite runs on SPX_TEST_WORKERS pytest-xdist workers (default 2; 0 runs it in this one process):
# most slow tests wait on real daemons and jobs rather than compute, and the tests that share
# machine-wide state (real users) run together on one worker (tests/conftest.py).
# The 25 slowest tests are listed at the end: the suite must stay under 30 min on 2 cores.
# pytest's "no tests collected" (exit 5) is a failure here, never a silent pass.
set -u
cd "$(dirname "$0")/.."
rc=0
.venv/bin/python -m pytest -q -p no:cacheprovider --durations=25 -n "${SPX_TEST_WORKERS:-2}" "$@" || rc=$?
if [ "$rc" -eq 5 ]; then
  echo "tests/run.sh: pytest collected no tests; that is a failure" >&2
  exit 1
fi
exit "$rc"
