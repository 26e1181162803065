"""The log and state filesystem full (a small tmpfs holding the daemon's whole root): a job flooding its
stdout fills it; the daemon keeps running and answering, the store's writes wait instead of crashing
the loop, the other job's end is recorded once space returns, and nothing runs twice."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from ledger import CountedJob, audit, state_of

from harness import Daemon, job_pids, small_tmpfs, wait_for

MIB = 1024 * 1024


@pytest.fixture
def small_fs(tmp_path) -> Iterator[Path]:
    with small_tmpfs(tmp_path / "fs", "24m") as mnt:
        yield mnt


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def test_a_job_filling_the_log_and_state_filesystem_stops_neither_the_daemon_nor_the_other_jobs(
        small_fs, tmp_path, daemons, scenario):
    root = small_fs / "root"
    other = CountedJob("other", tmp_path / "other.ledger", seconds=4)
    flood = CountedJob("flood", tmp_path / "flood.ledger", seconds=600, flood=True, expect="cancelled")
    # A log cap above the filesystem's size: the flood meets ENOSPC instead of rotating.
    d = Daemon(root, config={"log_max_bytes": 256 * MIB})
    daemons.append(d)
    d.start()
    d.drop("other.yaml", other.yaml())
    wait_for(lambda: state_of(root, "other") == "running", 30, "the other job to run")
    d.drop("flood.yaml", flood.yaml())
    wait_for(lambda: free_bytes(small_fs) < 256 * 1024, 60, "the filesystem to fill")
    d.wait_event("attempt_ended", timeout=60, job="other")  # the other job ends meanwhile, on a full disk
    assert d.alive(), d.lines[-10:]
    assert {j["name"] for j in d.ls()} >= {"other", "flood"}, "the daemon still answers"
    assert not d.events("traceback") and not [e for e in d.events("raw") if "Traceback" in e["text"]]
    d.spx("cancel", "flood")
    wait_for(lambda: not job_pids("flood"), 60, "the flood's processes to end")
    scenario.survived = d.alive()
    # The operator makes room: the flooded log is emptied (its writer is gone).
    for log in (root / "log" / "flood").glob("attempt-*.log*"):
        os.truncate(log, 0)
    wait_for(lambda: state_of(root, "other") == "succeeded" and state_of(root, "flood") == "cancelled", 60,
             "the waiting store writes to go through")
    assert d.alive()
    d.stop()
    result = audit(root / "state" / "spx.sqlite", [other, flood])
    scenario.record(result)
    assert result.clean, result
