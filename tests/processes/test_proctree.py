"""AttemptProcesses with real processes: every process of an attempt — in its group, out of it, in
its cgroup — gets a SIGTERM exactly once, and SIGKILL leaves nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
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
        fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            spawned = launcher.spawn(plan, os.getuid(), fd, "attempt.log", cgroup, 1 << 20)
        finally:
            os.close(fd)
        proc = spawned.proc
        procs = proctree.AttemptProcesses(attempt_id, proc.pid, cgroup)
        try:
            wait_for(lambda: len(list(out.iterdir())) == 3, 10, "three processes up")
            pids = sorted(int(p.name) for p in out.iterdir())
            assert procs.pids() == sorted([*pids, proc.pid]), "the tree and its monitor (the group leader)"
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
            procs.signal(signal.SIGKILL)
            proc.kill()
            proc.wait()
            spawned.relay.wait(timeout=10)


def test_a_stored_pid_is_the_same_process_only_with_the_same_boot_and_start_time():
    """Before signalling a stored pgid after a daemon restart: its leader must be the process that
    was started then, not a later one that reused the pid (or anything from an earlier boot)."""
    child = subprocess.Popen(["sleep", "30"])
    try:
        boot, ticks = proctree.boot_id(), proctree.start_ticks(child.pid)
        assert boot and ticks is not None
        assert proctree.same_process(child.pid, boot, ticks)
        assert not proctree.same_process(child.pid, boot, ticks + 1), "another start time: a reused pid"
        assert not proctree.same_process(child.pid, "an-earlier-boot", ticks)
        assert not proctree.same_process(child.pid, None, None), "nothing recorded: never signalled"
    finally:
        child.kill()
        child.wait()
    assert not proctree.same_process(child.pid, boot, ticks), "gone"


def test_the_reaper_collects_exited_children_of_any_thread_and_leaves_the_kept_ones():
    """Its children come from each thread's `children` list (a child is its forking thread's), the
    same as a scan of /proc by parent pid finds."""
    def zombie(pid: int) -> bool:
        try:
            return proctree.stat_fields(pid)[0] == b"Z"
        except IndexError:
            return False

    spawned: list[int] = []
    forker = threading.Thread(target=lambda: spawned.append(os.posix_spawn("/bin/true", ["true"], os.environ)))
    forker.start()
    forker.join()
    kept = subprocess.Popen(["/bin/true"])
    orphan = spawned[0]
    wait_for(lambda: zombie(orphan) and zombie(kept.pid), 10, "both children exited")
    assert {orphan, kept.pid} <= proctree._children() == proctree._children_by_scan(os.getpid())
    proctree.reap_orphans({kept.pid})
    assert not os.path.exists(f"/proc/{orphan}") and zombie(kept.pid)
    assert kept.wait(timeout=5) == 0
