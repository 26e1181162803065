"""AttemptProcesses with real processes: every process of an attempt — in its group, out of it, in
its cgroup — gets a SIGTERM exactly once, and SIGKILL leaves nothing."""

from __future__ import annotations

import os
import signal
import sys
import uuid
from contextlib import nullcontext

import pytest
from scratch_cgroup import scratch_cgroup

from harness import wait_for
from spx.daemon.run import launcher, proctree
from spx.daemon.run.launcher import LaunchPlan

# Launcher + child in the launcher's group + grandchild in a session of its own; each appends a
# "T" to OUT/PID per SIGTERM it handles, and they keep running.
TREE = (
    "import os, signal, sys, time\n"
    "out = sys.argv[1]\n"
    "def on_term(s, f):\n"
    "    with open(os.path.join(out, str(os.getpid())), 'a') as fh: fh.write('T')\n"
    "signal.signal(signal.SIGTERM, on_term)\n"
    "if os.fork() == 0 and os.fork() == 0:\n"
    "    os.setsid()\n"
    "open(os.path.join(out, str(os.getpid())), 'a').close()\n"
    "while True: time.sleep(0.01)\n"
)


@pytest.mark.parametrize("contained", [False, True], ids=["tag-and-group", "cgroup-tag-and-group"])
def test_sigterm_reaches_each_process_once_and_sigkill_leaves_none(tmp_path, contained):
    attempt_id = uuid.uuid4().hex
    out = tmp_path / "out"
    out.mkdir()
    plan = LaunchPlan(argv=[sys.executable, "-c", TREE, str(out)], cwd="/",
                      env={"PATH": "/usr/bin:/bin", "SPX_ATTEMPT_ID": attempt_id})
    with scratch_cgroup() if contained else nullcontext(None) as cgroup:
        proc = launcher.spawn(plan, os.getuid(), tmp_path / "attempt.log", cgroup=cgroup)
        procs = proctree.AttemptProcesses(attempt_id, proc.pid, cgroup)
        try:
            wait_for(lambda: len(list(out.iterdir())) == 3, 10, "three processes up")
            pids = sorted(int(p.name) for p in out.iterdir())
            assert procs.pids() == pids
            assert len({os.getpgid(p) for p in pids}) == 2, "one of them left the attempt's group"

            procs.signal(signal.SIGTERM)
            wait_for(lambda: all((out / str(p)).read_text() for p in pids), 10, "every process to get SIGTERM")
            assert not procs.gone()
            assert {p: (out / str(p)).read_text() for p in pids} == dict.fromkeys(pids, "T"), "exactly once each"

            procs.signal(signal.SIGKILL)
            proc.wait(timeout=10)
            wait_for(procs.gone, 10, "no process of the attempt left")
            assert procs.pids() == []
        finally:
            proc.kill()
            proc.wait()
