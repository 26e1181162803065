"""cgroups.py on this machine's real cgroup v2: finding our cgroup, when to manage it, and killing,
sweeping and removing attempt cgroups, with real processes in them. Everything lives under a scratch
cgroup removed afterwards. Reading mountinfo, and what is refused before anything is touched, without
a cgroup: tests/unit/test_cgroups.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from scratch_cgroup import cgroup_of, own_cgroup, scratch_cgroup

from harness import wait_for
from spx.daemon.run import cgroups

MOUNTINFO = Path("/proc/self/mountinfo").read_text()
# A process tree that is hard to catch: the child leaves the session, ignores SIGTERM and forks a
# grandchild that scrubs its environment.
ESCAPER = (
    "import os, signal, time\n"
    "if os.fork() == 0:\n"
    "    os.setsid(); signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "    if os.fork() == 0: os.execve('/bin/sleep', ['sleep', '300'], {})\n"
    "    time.sleep(300)\n"
    "time.sleep(300)\n"
)


def start_in(cgroup: Path, *argv: str) -> subprocess.Popen:
    """A process that is in `cgroup` before it runs anything (as systemd starts a unit's)."""
    proc = subprocess.Popen(["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(cgroup), *argv])
    wait_for(lambda: proc.pid in cgroups.procs(cgroup), 10, f"pid {proc.pid} in {cgroup}")
    return proc


def stop(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait()


@pytest.fixture
def scratch():
    with scratch_cgroup() as cg:
        yield cg


# --- where our cgroup is ------------------------------------------------------------------------------


def test_own_cgroup_is_the_directory_this_process_is_listed_in():
    own = own_cgroup()
    if own is None:
        pytest.skip("no cgroup v2 hierarchy is mounted here")
    assert os.getpid() in cgroups.procs(own)


# --- whether to manage it -----------------------------------------------------------------------------


def test_auto_manages_a_cgroup_only_once_it_carries_systemds_delegate_mark(scratch):
    daemon = start_in(scratch, "sleep", "300")
    try:
        tree, why = cgroups.manage("auto", scratch, MOUNTINFO, daemon.pid)
        assert tree is None and "not delegated" in why
        assert sorted(p.name for p in scratch.iterdir() if p.is_dir()) == [], "nothing created in a cgroup not ours"
        assert cgroup_of(daemon.pid) == scratch

        os.setxattr(scratch, "user.delegate", b"1")  # what systemd >= 252 sets with Delegate=yes
        tree, why = cgroups.manage("auto", scratch, MOUNTINFO, daemon.pid)
        assert tree is not None and tree.root == scratch and "delegated" in why
        assert cgroup_of(daemon.pid) == scratch / "supervisor", "the daemon sits in the supervisor leaf"
        assert (scratch / "attempts").is_dir() and cgroups.procs(scratch) == []
    finally:
        stop(daemon)


def test_a_daemon_started_in_the_supervisor_leaf_manages_its_parent(scratch):
    os.setxattr(scratch, "user.delegate", b"1")
    (scratch / "supervisor").mkdir()
    daemon = start_in(scratch / "supervisor", "sleep", "300")
    try:
        tree, _ = cgroups.manage("auto", scratch / "supervisor", MOUNTINFO, daemon.pid)
        assert tree is not None and tree.root == scratch and tree.attempts.is_dir()
    finally:
        stop(daemon)


def test_on_manages_an_undelegated_cgroup_and_off_never_does(scratch):
    assert cgroups.manage("off", scratch, MOUNTINFO, os.getpid()) == (None, "cgroups: off in the config")
    daemon = start_in(scratch, "sleep", "300")
    try:
        tree, why = cgroups.manage("on", scratch, MOUNTINFO, daemon.pid)
        assert tree is not None and "cgroups: on" in why
        assert cgroup_of(daemon.pid) == scratch / "supervisor"
    finally:
        stop(daemon)


# --- an attempt's cgroup ------------------------------------------------------------------------------


def test_cgroup_kill_takes_down_a_tree_that_left_its_session_and_scrubbed_its_environment(scratch):
    tree = cgroups.CgroupTree(scratch)
    tree.prepare()
    cg = tree.attempt("job", 1, "0123456789abcdef")
    assert cg == scratch / "attempts" / "job-1-0123456789ab"
    cg.mkdir()
    launcher = start_in(cg, sys.executable, "-c", ESCAPER)
    try:
        wait_for(lambda: len(cgroups.procs(cg)) == 3, 10, "launcher, child and grandchild in the cgroup")
        assert cgroups.populated(cg) and not cgroups.remove(cg), "a populated cgroup cannot be removed"
        cgroups.signal_all(cg, signal.SIGTERM)
        launcher.wait(timeout=10)
        assert len(cgroups.procs(cg)) == 2, "the SIGTERM-ignoring escapers are still there"
        cgroups.kill(cg)
        wait_for(lambda: not cgroups.populated(cg), 10, "cgroup.events: populated 0")
        assert cgroups.procs(cg) == [] and cgroups.remove(cg) and not cg.exists()
    finally:
        stop(launcher)


def test_sigkill_to_each_listed_pid_empties_the_cgroup_where_cgroup_kill_is_missing(scratch):
    launcher = start_in(scratch, sys.executable, "-c", ESCAPER)
    try:
        wait_for(lambda: len(cgroups.procs(scratch)) == 3, 10, "three processes in the cgroup")
        wait_for(lambda: cgroups.signal_all(scratch, signal.SIGKILL) == [] and not cgroups.populated(scratch), 10,
                 "repeated SIGKILLs to empty the cgroup")
    finally:
        stop(launcher)


def test_a_gone_cgroup_reads_as_empty_and_unpopulated(scratch):
    gone = scratch / "gone"
    assert cgroups.procs(gone) == [] and not cgroups.populated(gone)
    cgroups.kill(gone)
    assert cgroups.remove(gone)


def test_sweep_removes_stale_empty_cgroups_kills_strays_and_keeps_live_attempts(scratch):
    tree = cgroups.CgroupTree(scratch)
    tree.prepare()
    live, stale, stray = (tree.attempt(n, 1, "ab" * 16) for n in ("live", "stale", "stray"))
    for cg in (live, stale, stray):
        cg.mkdir()
    live_proc = start_in(live, "sleep", "300")
    stray_proc = start_in(stray, "sleep", "300")
    try:
        wait_for(lambda: cgroups.populated(live) and cgroups.populated(stray), 10, "processes in their cgroups")
        killed, removed = cgroups.sweep(tree, keep={live})
        assert killed == [stray] and removed == [stale]
        assert stray_proc.wait(timeout=10) == -signal.SIGKILL
        wait_for(lambda: cgroups.sweep(tree, keep={live}) == ([], [stray]), 10, "the emptied stray to be removed")
        assert tree.attempt_cgroups() == [live] and live_proc.poll() is None
    finally:
        stop(live_proc)
        stop(stray_proc)
