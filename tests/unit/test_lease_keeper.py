"""run/lease_keeper.py: renewals run per owner in the keeper's own lanes, so one owner's stalled helper
(holding `flock` on their own `.spx/lease.lock`) never delays another owner's; a lease another host
took is reported once to the main loop; a lease past its safety margin is flagged. The helpers are
scripted (no processes), the clock is fake, waits are on events."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from lease_fixtures import LiveJobsStore, running_job

from spx.daemon.core.config import DaemonConfig
from spx.daemon.run.lease_keeper import LeaseKeeper
from spx.daemon.state.jobs_table import JobRow

WAIT = 10.0
ALICE, BOB = 1001, 1002


def job(job_id: int, owner: int) -> JobRow:
    return running_job(job_id, owner, str(owner), f"{job_id:032x}", Path(f"/ck/j{job_id}"))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Helpers:
    """Scripted as-user helpers: once `alice_stalls` is set, alice's renewals hang until released (her
    own locks held); every other answer is `answer`."""

    def __init__(self, answer: dict[str, Any]) -> None:
        self.answer = answer
        self.alice_stalls = threading.Event()
        self.release_alice = threading.Event()
        self.calls: list[tuple[int, str]] = []

    def __call__(self, uid: int, action: str, args: dict[str, Any], _timeout: float) -> Any:
        self.calls.append((uid, action))
        if uid == ALICE and self.alice_stalls.is_set():
            assert self.release_alice.wait(WAIT)
        return [dict(self.answer) for _ in args["jobs"]]


def keeper_for(jobs: list[JobRow], helpers: Helpers, clock: Clock, lost: list | None = None) -> LeaseKeeper:
    cfg = DaemonConfig(state_dir=Path("/nonexistent/state"), adopt_lease_seconds=120)
    return LeaseKeeper(cfg, LiveJobsStore(jobs), on_lost=lambda j, h: (lost if lost is not None else []).append((j, h)),
                       clock=clock, call=helpers)


def answered(keeper: LeaseKeeper, until) -> None:
    """Deliver the lanes' answers (as the keeper's thread does) until `until()` holds, for up to WAIT
    seconds (a deadline, not a count of wake-ups: each answer wakes the keeper, and a burst of them
    used up a count of 100 in milliseconds under load before the awaited one came)."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        keeper.lanes.deliver()
        if until():
            return
        keeper._woken.wait(0.1)
        keeper._woken.clear()
    raise AssertionError("the answer never came")


def test_one_owners_stalled_renewals_never_delay_another_owners():
    clock, helpers = Clock(), Helpers({"result": "held", "gen": 1})
    alice_jobs = [job(i, ALICE) for i in range(1, 21)]  # 20 jobs whose lock files alice holds
    bobs = job(99, BOB)
    keeper = keeper_for([*alice_jobs, bobs], helpers, clock)
    try:
        keeper.turn()  # every lease renewed once
        answered(keeper, lambda: len(keeper._renewed) == 21 and not keeper._renewing)
        helpers.alice_stalls.set()  # from now on alice holds her 20 lock files
        clock.now += 40.0  # the next renewal (every third of 120 s)
        keeper.turn()
        answered(keeper, lambda: keeper._renewed[bobs.id] == clock.now)
        assert ALICE in keeper._renewing, "alice's helper still waits on her own locks"
        clock.now += 40.0
        keeper.turn()
        # Alice's stalled helper records its call when its lane thread runs it, which may come after
        # bob's answer: waited for, then held to 2 at the end (none queued behind it).
        answered(keeper, lambda: keeper._renewed[bobs.id] == clock.now and helpers.calls.count((ALICE, "spx_renew")) == 2)
        assert helpers.calls.count((BOB, "spx_renew")) == 3
        clock.now += 1.0  # 81 s since alice's leases were last renewed: past two thirds of 120
        keeper.turn()
        assert keeper.at_risk == {j.id for j in alice_jobs}, "flagged loudly, bob's lease is fine"
        helpers.release_alice.set()
        answered(keeper, lambda: ALICE not in keeper._renewing)
        assert keeper.at_risk == set()
        assert helpers.calls.count((ALICE, "spx_renew")) == 2, "no second helper queued behind the stalled one"
    finally:
        helpers.release_alice.set()
        keeper.lanes.close(wait=WAIT)


def test_a_lease_another_host_took_is_reported_to_the_loop_once():
    clock, lost = Clock(), []
    helpers = Helpers({"result": "other", "holder": {"host": "m:/var/lib/spx", "label": "node-b:/var/lib/spx"}})
    keeper = keeper_for([job(7, BOB)], helpers, clock, lost)
    try:
        keeper.turn()
        answered(keeper, lambda: bool(lost))
        clock.now += 40.0
        keeper.turn()
        answered(keeper, lambda: helpers.calls.count((BOB, "spx_renew")) == 2 and BOB not in keeper._renewing)
        assert lost == [(7, "node-b:/var/lib/spx")]
    finally:
        keeper.lanes.close(wait=WAIT)


def test_a_job_without_a_lease_yet_is_never_flagged():
    clock, helpers = Clock(), Helpers({"result": "absent"})  # queued: not prepared, no .spx/ record yet
    keeper = keeper_for([job(3, BOB)], helpers, clock)
    try:
        keeper.turn()
        answered(keeper, lambda: BOB not in keeper._renewing and helpers.calls)
        clock.now += 200.0
        keeper.turn()
        assert keeper.at_risk == set()
    finally:
        keeper.lanes.close(wait=WAIT)
