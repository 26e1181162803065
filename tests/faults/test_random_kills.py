"""SIGKILL the daemon at random moments (seeded; replay with SPX_FAULT_SEED) while its jobs are in every
state — queued, starting, running, restarting (in backoff), succeeded, failed, cancelled — and new jobs
arrive, some while it is down. After the last restart every job settles; none is lost, none ran twice,
and the ones that crash are failed after exactly max_restarts + 1 crashes of their own."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest
from ledger import CountedJob, audit, state_of

from harness import Daemon, wait_for

KILLS = 30
SEED = int(os.environ.get("SPX_FAULT_SEED", time.time_ns() % 100_000))


def states_of(root: Path, names: list[str]) -> dict[str, str | None]:
    return {n: state_of(root, n) for n in names}


@pytest.mark.slow(seconds=85)
def test_sigkill_at_random_moments_loses_nothing_and_runs_nothing_twice(root, tmp_path, daemons, scenario):
    print(f"random seed {SEED} (replay with SPX_FAULT_SEED={SEED})")
    rng = random.Random(SEED)
    ledgers = tmp_path / "ledgers"
    ledgers.mkdir()

    def job(name: str, **kw) -> CountedJob:
        return CountedJob(name, ledgers / f"{name}.ledger", **kw)

    # From the start, jobs that stay in each state: long runners (one holding 4 fake GPUs), one wanting
    # all 8 (queued behind them for good), one in a long backoff after each crash, one failed at once.
    jobs = [job("long", seconds=600, expect="cancelled"), job("hog", seconds=600, gpus=4, expect="cancelled"),
            job("waiter", gpus=8, expect="cancelled"),
            job("backoff", seconds=0.1, exit_code=2, max_restarts=100, backoff=(60, 60), expect="cancelled")]
    cancel_later = [j.name for j in jobs if j.name != "waiter"]
    jobs.append(job("failer", seconds=0.1, exit_code=2, max_restarts=0, expect="failed"))
    d = Daemon(root, gpu_backend="fake")
    daemons.append(d)
    d.start()
    for j in jobs:
        if j.name != "waiter":
            d.drop(f"{j.name}.yaml", j.yaml())
    # The waiter only once hog holds its GPUs: files dropped together are queued in the order their
    # checks (in the owner's lane, side by side) finish, and a waiter queued ahead of hog takes all 8
    # GPUs at once, runs its 0.5 s and succeeds.
    wait_for(lambda: state_of(root, "hog") == "running", 60, "hog to hold its GPUs")
    d.drop("waiter.yaml", jobs[2].yaml())
    seen: set[str] = set()
    for i in range(KILLS):
        # New work each round: a short job that succeeds, now and then one that always crashes (it is
        # in backoff for a while, then fails) or one that is cancelled while it runs.
        kind = rng.choice(["ok", "ok", "crash", "cancel"])
        if kind == "ok":
            new = job(f"ok-{i}", seconds=rng.uniform(0.1, 2.0))
        elif kind == "crash":
            new = job(f"crash-{i}", seconds=0.1, exit_code=3, max_restarts=1, backoff=(3.0, 6.0), expect="failed")
        else:
            new = job(f"cancel-{i}", seconds=600, expect="cancelled")
        jobs.append(new)
        if d.alive():
            d.drop(f"{new.name}.yaml", new.yaml())
        time.sleep(rng.uniform(0.1, 2.0))
        if kind == "cancel":
            d.spx("cancel", new.name, check=False)
            cancel_later.append(new.name)  # again at the end, should the kill have come first
        seen.update(s for s in states_of(root, [j.name for j in jobs]).values() if s)
        d.kill9()
        if rng.random() < 0.3:  # a job dropped while the daemon is down must be found on restart
            down = job(f"down-{i}", seconds=0.3)
            jobs.append(down)
            d.drop(f"{down.name}.yaml", down.yaml())
        d.start()
    scenario.survived = True
    # Settle: what finishes by itself does; then the waiter, the long runners and the rest are cancelled.
    own = [j for j in jobs if j.expect != "cancelled"]
    wait_for(lambda: all(state_of(root, j.name) in ("succeeded", "failed") for j in own), 120,
             "the jobs that end by themselves")
    # The waiter first, and cancelled before hog is: once hog's GPUs are free it rightly starts, and a
    # 0.5 s run ends before a slow `spx cancel waiter` (a loaded machine) comes — succeeded, not cancelled.
    d.spx("cancel", "waiter", check=False)
    wait_for(lambda: state_of(root, "waiter") == "cancelled", 60, "the waiter cancelled while hog holds its GPUs")
    for name in cancel_later:
        if state_of(root, name) not in ("cancelled", "succeeded", "failed"):
            d.spx("cancel", name, check=False)
    wait_for(lambda: all(state_of(root, j.name) in ("succeeded", "failed", "cancelled") for j in jobs), 120,
             "every job to settle")
    d.stop()
    result = audit(root / "state" / "spx.sqlite", jobs)
    scenario.record(result)
    assert result.clean, f"seed {SEED}: {result}"
    assert {"queued", "running", "restarting", "succeeded", "failed", "cancelled"} <= seen, seen
