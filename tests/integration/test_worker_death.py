"""A plain torchrun script's worker killed: the daemon sees the death itself (the worker's pidfd) and
kills the attempt at once, without waiting for torchrun to tear the surviving rank down; the job
relaunches and succeeds. And a rank that ends with exit 0 before the others ends nothing."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from harness import Daemon, job_pids, wait_for

SCRIPT = Path(__file__).resolve().parent.parent / "fixtures" / "scripts" / "plain_ranks.py"
PY = sys.executable
SLOW_TEARDOWN = 20.0  # what the surviving rank would take to leave on torchrun's SIGTERM


def plain_job(name: str, mark: Path, *args: str) -> str:
    argv = ", ".join(f'"{a}"' for a in ("--mark", str(mark), *args))
    return (f"name: {name}\nlauncher: torchrun\nscript: {SCRIPT}\npython: {PY}\nargs: [{argv}]\nprocs: 2\n"
            "restart: {max_restarts: 3, backoff_seconds: [0, 1]}\nstop: {grace_seconds: 30}\n")


@pytest.fixture
def daemon(tmp_path):
    d = Daemon(tmp_path / "root", config={"launch_standby": False}).start()
    yield d
    d.stop()


def marks(path: Path) -> list[tuple[str, float]]:
    try:
        return [(a, float(t)) for a, t in (line.split() for line in path.read_text().splitlines())]
    except OSError:
        return []


def rank_pid(name: str, rank: int) -> int | None:
    for pid in job_pids(name):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env and any(v.startswith(b"LOCAL_RANK=") for v in env):
            return pid
    return None


@pytest.mark.slow
def test_a_killed_worker_of_a_plain_script_ends_the_attempt_at_once_and_the_job_relaunches(daemon, tmp_path):
    mark = tmp_path / "first-steps.txt"
    daemon.drop("p.yaml", plain_job("plain-kill", mark, "--steps", "24", "--slow-teardown", str(SLOW_TEARDOWN)))
    wait_for(lambda: marks(mark), 120, "attempt 1's first step")
    victim = wait_for(lambda: rank_pid("plain-kill", 1), 30, "rank 1")
    killed = time.time()
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: len(marks(mark)) >= 2, 120, "attempt 2's first step")
    assert marks(mark)[1][0] == "2"
    # Not torchrun's teardown: the surviving rank would have taken SLOW_TEARDOWN seconds to leave.
    assert marks(mark)[1][1] - killed < SLOW_TEARDOWN / 2, marks(mark)
    daemon.wait_state("plain-kill", {"succeeded", "failed"}, 180)
    st = daemon.status("plain-kill")
    assert st["state"] == "succeeded", st
    first = st["history"][0]
    assert first["reason"] == f"worker rank 1 (pid {victim}) killed by SIGKILL; the daemon ended the attempt at once"
    assert first["reason_class"] == "signal"
    rows = json.loads(daemon.spx("status", "plain-kill", "--timeline", "--json").stdout)
    failure = {r["phase"]: r["time"] for r in rows if r["attempt"] == 2 and r["from_spawn"] is None}
    assert "worker_exit" in failure and "launcher_exit" not in failure, failure
    assert killed <= failure["worker_exit"] < killed + 1.0
    assert failure["group_dead"] - failure["worker_exit"] < 3.0, "the attempt was killed, not torn down by torchrun"
    assert [e["pid"] for e in daemon.events("worker_died", job="plain-kill")] == [victim]
    assert job_pids("plain-kill") == []


@pytest.mark.slow
def test_a_rank_ending_with_exit_0_before_the_others_ends_nothing(daemon, tmp_path):
    mark = tmp_path / "first-steps.txt"
    daemon.drop("z.yaml", plain_job("plain-early", mark, "--steps", "12", "--rank1-exits-0"))
    daemon.wait_state("plain-early", {"succeeded", "failed"}, 180)
    st = daemon.status("plain-early")
    assert st["state"] == "succeeded" and len(st["history"]) == 1, st
    assert "worker_exit" not in (st["history"][0].get("phases") or {})
    assert daemon.events("worker_died", job="plain-early") == []
