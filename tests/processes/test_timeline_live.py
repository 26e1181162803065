"""The worker's `interpreter_up` phase is a real process's start time, read from /proc (the other
start-up timeline tests, without processes: tests/unit/test_timeline.py)."""

from __future__ import annotations

import subprocess
import sys
import time

from spx.trainer import phases as worker_phases


def test_interpreter_up_is_the_process_start_from_proc():
    before = time.time()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        started = worker_phases.process_start_time(child.pid)
    finally:
        child.kill()
        child.wait()
    after = time.time()
    assert started is not None and before - 0.05 <= started <= after + 0.05
    assert worker_phases.process_start_time(2**22 + 17) is None, "no such process: None, never an exception"
