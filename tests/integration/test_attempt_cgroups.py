"""Per-attempt cgroups with a real daemon (`cgroups: on`, started in a scratch cgroup as systemd would
start it in the unit's): a process that left the attempt's session AND scrubbed its environment —
invisible to the tag search — is still killed by a cancel, and by a restarted daemon."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from scratch_cgroup import cgroup_of, scratch_cgroup

from harness import Daemon, job_pids, wait_for
from spx.daemon.run import cgroups, proctree

SCRIPTS = Path(__file__).resolve().parent.parent / "fixtures" / "scripts"
PY = sys.executable


@pytest.fixture
def scratch():
    with scratch_cgroup() as cg:
        yield cg


def escaper_job(name: str, pidfile: Path) -> str:
    return (f"name: {name}\nlauncher: python\nscript: {SCRIPTS / 'setsid_scrubbed_grandchild.py'}\npython: {PY}\n"
            f"args: ['{pidfile}']\nstop: {{grace_seconds: 2}}\nrestart: {{max_restarts: 3, backoff_seconds: [1, 5]}}\n")


def scrubbed_grandchild(pidfile: Path) -> int:
    """The grandchild's pid, once it has exec'd `sleep` with an empty environment."""
    wait_for(pidfile.exists, 30, "the grandchild to start")
    pid = int(pidfile.read_text())
    wait_for(lambda: Path(f"/proc/{pid}/comm").read_text().strip() == "sleep", 10, "the grandchild's exec")
    return pid


def gone(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists() or proctree._is_zombie(pid)


def test_cancel_kills_a_setsid_grandchild_that_scrubbed_its_environment(scratch, tmp_path):
    d = Daemon(tmp_path / "root", config={"cgroups": "on"}, cgroup=scratch).start()
    try:
        assert d.events("cgroups")[-1]["cgroup"] == str(scratch)
        assert cgroup_of(d.proc.pid) == scratch / "supervisor", "the daemon sits in its supervisor leaf"
        pidfile = tmp_path / "grandchild.pid"
        d.drop("e.yaml", escaper_job("scrubber", pidfile))
        grandchild = scrubbed_grandchild(pidfile)
        started = d.wait_event("attempt_started", job="scrubber")
        attempt_cg = Path(started["cgroup"])
        assert attempt_cg.parent == scratch / "attempts" and attempt_cg.name.startswith("scrubber-1-")

        # What the tag+pgid mechanism alone would have missed: no tag, another session.
        assert Path(f"/proc/{grandchild}/environ").read_bytes() == b""
        assert os.getsid(grandchild) != started["pid"] and os.getpgid(grandchild) != started["pid"]
        assert grandchild not in job_pids("scrubber") and job_pids("scrubber")
        # What the cgroup sees: all of it.
        assert cgroup_of(grandchild) == attempt_cg
        assert set(job_pids("scrubber")) | {grandchild} <= set(cgroups.procs(attempt_cg))

        d.spx("cancel", "scrubber")
        d.wait_state("scrubber", "cancelled", 30)
        assert gone(grandchild), "the scrubbed grandchild survived the cancel"
        assert not attempt_cg.exists(), "the attempt's cgroup is removed once empty"
        assert job_pids("scrubber") == []
    finally:
        d.stop()


def test_a_restarted_daemon_finds_its_predecessors_attempt_by_its_cgroup(scratch, tmp_path):
    """The attempt is adopted as it is (its scrubbed grandchild too: no tag, only the cgroup finds
    it), and a cancel still reaches every process of it."""
    root = tmp_path / "root"
    d = Daemon(root, config={"cgroups": "on"}, cgroup=scratch).start()
    pidfile = tmp_path / "grandchild.pid"
    try:
        d.drop("e.yaml", escaper_job("orphaned", pidfile))
        first = scrubbed_grandchild(pidfile)
        attempt_cg = Path(d.wait_event("attempt_started", job="orphaned")["cgroup"])
        d.kill9()
        stale = scratch / "attempts" / "gone-7-0123456789ab"  # an emptied one an earlier daemon left
        stale.mkdir()
        assert not gone(first) and cgroups.populated(attempt_cg)

        d.start()
        adopted = d.wait_event("adopted_after_restart", job="orphaned")
        assert adopted["cgroup"] == str(attempt_cg), "the cgroup is found from the store's attempt row"
        assert first in adopted["pids"] and adopted["exited"] is False
        assert not stale.exists(), "empty stale attempt cgroups are swept at start-up"
        st = d.wait_state("orphaned", "running", 30)
        assert st["attempts"] == 1 and not gone(first), "adopted as it is, nothing relaunched"
        d.spx("cancel", "orphaned")
        d.wait_state("orphaned", "cancelled", 30)
        assert gone(first), "the cancel reaches the grandchild through the cgroup"
        assert not attempt_cg.exists()
        assert cgroups.CgroupTree(scratch).attempt_cgroups() == []
    finally:
        d.stop()
