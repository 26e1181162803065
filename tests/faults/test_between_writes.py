"""The daemon killed between every pair of store writes of a job's life (SPX_TEST_FAULT_POINT: before
and after each write transaction commits), then restarted: the job still runs to its end exactly once,
no attempt runs twice or beside another, and its first attempt's crash is counted once.

The life: submitted → queued → starting → running → exit 1 → restarting (backoff) → starting →
running → exit 0 → succeeded. A traced run counts its write transactions first.
"""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

import pytest
from ledger import CountedJob, audit, state_of

from harness import Daemon, wait_for

SETTLE_SECONDS = 10  # how long a daemon that committed a job's end has to reach a fault point after it


def job(tmp_path: Path) -> CountedJob:
    return CountedJob("life", tmp_path / "life.ledger", seconds=0.1, exit_code=1, fail_first_run=True,
                      backoff=(0.2, 0.2))


def start(d: Daemon, daemons: list[Daemon]) -> None:
    daemons.append(d)
    d.start()


def traced_writes(tmp_path: Path, daemons: list[Daemon]) -> list[dict]:
    """The write transactions of one undisturbed life, in order."""
    d = Daemon(tmp_path / "traced" / "root", env={"SPX_TEST_FAULT_TRACE": "1"})
    j = job(tmp_path / "traced")
    start(d, daemons)
    d.drop("life.yaml", j.yaml())
    wait_for(lambda: state_of(d.root, "life") == "succeeded", 60, "the job's end")
    writes = d.events("test_store_write", phase="before-commit")
    d.stop()
    return writes


@pytest.mark.slow(seconds=105)
def test_a_kill_between_any_two_writes_of_a_job_life_runs_it_exactly_once_to_its_end(tmp_path, daemons, scenario):
    writes = traced_writes(tmp_path, daemons)
    ops = [w["op"] for w in writes]
    assert {"add_job", "transition", "start_attempt"} <= set(ops), ops
    results = []
    for number in range(1, len(writes) + 1):
        for phase in ("before-commit", "after-commit"):
            where = tmp_path / f"{phase}-{number}"
            j = job(where)
            d = Daemon(where / "root", env={"SPX_TEST_FAULT_POINT": f"{phase}:{number}"})
            start(d, daemons)
            d.drop("life.yaml", j.yaml())
            wait_for(lambda d=d: not d.alive() or state_of(d.root, "life") == "succeeded", 60,
                     f"the fault point {phase}:{number} or the job's end", interval=0.05)
            # The store can read "succeeded" a moment before the daemon that committed it reaches the
            # fault point right after (after-commit of the last write): a point that is reached
            # takes the daemon down within that moment, one that is not leaves it running.
            with contextlib.suppress(subprocess.TimeoutExpired):
                d.proc.wait(timeout=SETTLE_SECONDS)
            hit = d.events("test_fault_point")
            d.stop()
            assert hit, f"{phase}:{number} ({ops[number - 1]}) was never reached"
            assert d.proc is not None and d.proc.returncode == 137
            again = Daemon(where / "root")
            daemons.append(again)
            again.start()
            wait_for(lambda r=where / "root": state_of(r, "life") in ("succeeded", "failed"), 60,
                     "the job's end after the restart", interval=0.05)
            again.stop()
            result = audit(where / "root" / "state" / "spx.sqlite", [j])
            scenario.record(result)
            results.append((f"{phase}:{number} ({hit[0]['op']})", result))
    bad = [f"{point}: {r}" for point, r in results if not r.clean]
    scenario.survived = True  # every kill was followed by a daemon that started and finished the job
    assert not bad, "\n".join(bad)
