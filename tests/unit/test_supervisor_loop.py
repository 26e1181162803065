"""The supervisor loop with a scripted executor and a fake clock (as torch elastic's agent tests drive
its monitor loop): no processes, no threads, no sleeps. The executor answers each action as the test
scripts it and reports what the test says it saw; the store is a real SQLite file the supervisor reads
jobs from (the scripted executor performs no writes: the tests read what it was asked to do).
"""

from __future__ import annotations

from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest
from test_lanes import Clock

from spx.daemon.core.config import load_config
from spx.daemon.core.spec import parse_spec
from spx.daemon.lifecycle import actions as act
from spx.daemon.lifecycle.failures import in_order
from spx.daemon.lifecycle.observations import (
    ActionFailed,
    AllGone,
    CheckpointFound,
    Diagnosed,
    LauncherExited,
    Observation,
    Spawned,
    Tick,
    WorkQueued,
    WorkStarted,
)
from spx.daemon.lifecycle.record import Phase
from spx.daemon.lifecycle.starting import CHECKPOINT_DEADLINE_SECONDS
from spx.daemon.run.scheduler import Start
from spx.daemon.run.supervisor import Supervisor
from spx.daemon.state.jobs_table import JobRow
from spx.daemon.state.states import JobState
from spx.daemon.state.store import Store

WALL0 = 1_700_000_000.0


class ScriptedExecutor:
    """Answers actions as scripted (`answer[type]`: (job, record, action) → observations), reports the
    observations queued in `seen[job]` at the next turn and the off-loop answers queued in `later`."""

    def __init__(self) -> None:
        self.performed: list[tuple[int, act.Action]] = []
        self.answer: dict[type, object] = {}
        self.seen: dict[int, list[Observation]] = {}
        self.later: list[tuple[int, Observation]] = []
        self.forgotten: list[int] = []
        self.pids: dict[int, list[int]] = {}
        self.standbys: dict[int, tuple[int, ...]] = {}
        self.store_error: str | None = None
        self.last_restart = None
        self.turns = 0

    def kinds(self, job_id: int) -> list[type]:
        return [type(a) for j, a in self.performed if j == job_id and not isinstance(a, act.Log | act.Note)]

    def begin_turn(self) -> None:
        self.turns += 1

    def results(self):
        out, self.later = self.later, []
        return out

    def observe(self, job, s):
        return [*self.seen.pop(job.id, []), Tick()]

    def perform(self, job, s, actions):
        return in_order(actions, lambda a: self._one(job, s, a))

    def _one(self, job, s, a):
        self.performed.append((job.id, a))
        answer = self.answer.get(type(a))
        return answer(job, s, a) if answer is not None else []

    def adopt(self, job, row):
        return None

    def adopt_lost(self, job, number):
        pass

    def forget(self, job_id: int) -> None:
        self.forgotten.append(job_id)

    def close(self) -> None:
        pass

    def child_pids(self) -> set[int]:
        return set()

    def attempt_cgroups(self) -> set[Path]:
        return set()

    def live_pids(self, names):
        return {names[j]: p for j, p in self.pids.items() if j in names}

    def standby_pids(self):
        return dict(self.standbys)

    def gang_hosts(self, job_id):
        return None


@pytest.fixture
def world(tmp_path):
    cfg = load_config(None, tmp_path / "root")
    store = Store(tmp_path / "spx.sqlite")
    clock, executor = Clock(), ScriptedExecutor()
    clock.now = 1000.0
    sup = Supervisor(cfg, store, clock=clock, executor=executor, wall=lambda: WALL0 + clock.now)
    yield sup, store, clock, executor
    store.close()


def add(store: Store, name: str, extra: str = "", owner_uid: int = 1000) -> JobRow:
    spec = parse_spec(f"name: {name}\nscript: /bin/true\nrestart: {{max_restarts: 3, backoff_seconds: [10, 60]}}\n"
                      f"stop: {{grace_seconds: 20}}\n{extra}")
    return store.jobs.get(store.jobs.add(spec, owner_uid, "someone", f"/spool/{name}", 1.0))


def launched(sup: Supervisor, executor: ScriptedExecutor, job: JobRow, clock: Clock) -> None:
    """Start `job` and answer its discovery and launch as a healthy executor would."""
    sup.start(Start(job.id, (0,), job))
    executor.later.append((job.id, CheckpointFound(None, None, 1)))
    executor.answer[act.Spawn] = lambda j, s, a: []
    sup.tick()
    executor.later.append((job.id, Spawned(4242, WALL0 + clock.now)))
    sup.tick()


def test_a_job_runs_through_every_phase_and_is_forgotten_at_its_end(world):
    sup, store, clock, executor = world
    job = add(store, "whole-life")
    assert sup.settled(), "nothing tracked: nothing moves"
    sup.start(Start(job.id, (0,), job))
    assert executor.kinds(job.id) == [act.MarkStarting, act.FindCheckpoint]
    assert sup.records[job.id].phase is Phase.PREPARING and sup.held_gpus() == {0}
    assert not sup.settled(), "a job between phases keeps the loop's turns close"
    executor.later.append((job.id, CheckpointFound("/c/step-10", 10, 1)))
    sup.tick()
    assert executor.kinds(job.id)[-1] is act.Spawn
    executor.later.append((job.id, Spawned(777, WALL0 + clock.now, "boot", 12, "resuming from /c/step-10")))
    sup.tick()
    assert sup.records[job.id].phase is Phase.RUNNING
    assert executor.performed[-1] == (job.id, act.RecordRunning(1, 777, "boot", 12, "resuming from /c/step-10",
                                                                 WALL0 + clock.now))
    assert sup.settled(), "a running attempt is watched once a second"
    clock.now += 30
    executor.seen[job.id] = [LauncherExited(0, None), AllGone()]
    sup.tick()
    finish = [a for j, a in executor.performed if isinstance(a, act.FinishAttempt)]
    assert [(f.number, f.state) for f in finish] == [(1, JobState.SUCCEEDED)]
    assert job.id not in sup.tracked() and executor.forgotten == [job.id]


def test_a_crash_backs_off_on_the_clock_it_is_given_then_waits_for_its_gpus(world):
    sup, store, clock, executor = world
    job = add(store, "crashes")
    launched(sup, executor, job, clock)
    executor.seen[job.id] = [LauncherExited(1, None), AllGone()]
    sup.tick()
    executor.later.append((job.id, Diagnosed(1, None, False)))
    sup.tick()
    assert sup.records[job.id].phase is Phase.BACKOFF and sup.waiting() == [] and not sup.settled()
    clock.now += 9.9
    sup.tick()
    assert sup.waiting() == []
    clock.now += 0.2
    sup.tick()
    assert [w.job_id for w in sup.waiting()] == [job.id], "backoff over: waiting for its GPUs"


def test_an_answer_for_a_job_no_longer_tracked_is_dropped_and_the_job_forgotten(world):
    sup, store, clock, executor = world
    job = add(store, "gone")
    sup.start(Start(job.id, (0,), job))
    sup.cancel(store.jobs.get(job.id), "alice")
    assert job.id not in sup.tracked()
    executor.later.append((job.id, CheckpointFound(None, None, 1)))
    sup.tick()
    assert act.Spawn not in executor.kinds(job.id) and executor.forgotten.count(job.id) == 2


def test_a_refused_write_waits_blocks_the_relaunch_and_is_retried_until_the_store_takes_it(world):
    sup, store, clock, executor = world
    job = add(store, "patient")
    refusals = []

    def full_disk(j, s, a):
        if len(refusals) < 2:
            refusals.append(a)
            executor.store_error = "database or disk is full"
            return [ActionFailed(a, "database or disk is full", retry=True)]
        return []

    executor.answer[act.MarkStarting] = full_disk
    sup.start(Start(job.id, (0,), job))
    assert sup.store_problem() == "database or disk is full"
    executor.later.append((job.id, CheckpointFound(None, None, 1)))
    sup.tick()  # the mark is re-emitted (refused again); the spawn queues behind it
    assert act.Spawn not in executor.kinds(job.id) and sup.records[job.id].pending
    sup.tick()  # the store takes it: the mark, then the spawn
    kinds = executor.kinds(job.id)
    assert kinds.count(act.MarkStarting) == 3 and kinds[-1] is act.Spawn
    assert sup.store_problem() is None and not sup.records[job.id].pending


def test_a_fault_in_one_jobs_turn_fails_that_job_and_the_others_go_on(world):
    sup, store, clock, executor = world
    buggy, bystander = add(store, "buggy"), add(store, "bystander")

    def bug(j, s, a):
        if j.name == "buggy":
            raise ZeroDivisionError("injected")
        return []

    executor.answer[act.FindCheckpoint] = bug
    sup.start(Start(buggy.id, (0,), buggy))
    sup.start(Start(bystander.id, (1,), bystander))
    failed = [a for j, a in executor.performed if j == buggy.id and isinstance(a, act.FinishAttempt)]
    assert [(f.state, f.reason) for f in failed] == [(JobState.FAILED, "daemon error: ZeroDivisionError: injected")]
    assert buggy.id not in sup.tracked() and sup.records[bystander.id].phase is Phase.PREPARING


def test_a_machine_that_keeps_answering_itself_is_stopped_and_contained(world):
    sup, store, clock, executor = world
    job = add(store, "echo")
    executor.answer[act.Log] = lambda j, s, a: [ActionFailed(a, "the log is full")]  # each answer logs again
    sup.start(Start(job.id, (0,), job))
    sup.cancel(store.jobs.get(job.id), "root")
    assert job.id not in sup.tracked()
    sup.tick()  # the loop goes on


def test_a_deadline_counts_from_the_works_start_not_from_its_wait_for_a_slot(world):
    sup, store, clock, executor = world
    job = add(store, "behind-its-own-work")
    sup.start(Start(job.id, (0,), job))
    find = next(a for _, a in executor.performed if isinstance(a, act.FindCheckpoint))
    executor.seen[job.id] = [WorkQueued(find, "uid 1000 has 4 tasks running")]
    sup.tick()
    clock.now += CHECKPOINT_DEADLINE_SECONDS * 3  # queued behind the owner's other work all along
    sup.tick()
    assert sup.records[job.id].phase is Phase.PREPARING
    executor.seen[job.id] = [WorkStarted(find)]
    sup.tick()
    clock.now += CHECKPOINT_DEADLINE_SECONDS - 1
    sup.tick()
    assert sup.records[job.id].phase is Phase.PREPARING
    clock.now += 2
    sup.tick()
    finish = [a for _, a in executor.performed if isinstance(a, act.FinishAttempt)]
    assert finish and "did not finish" in finish[0].reason and job.id not in sup.tracked()


def test_cancel_of_a_running_attempt_stores_its_cause_then_signals_and_gives_the_grace(world):
    sup, store, clock, executor = world
    job = add(store, "cancelled")
    launched(sup, executor, job, clock)
    said = sup.cancel(store.jobs.get(job.id), "alice")
    assert said == "cancelling cancelled: SIGTERM sent, 20 s grace to checkpoint"
    assert executor.kinds(job.id)[-2:] == [act.RecordStop, act.SignalTerm]
    assert sup.stop_all() == 20.0 and sup.busy == 1
    clock.now += 20
    sup.tick()
    assert executor.kinds(job.id)[-1] is act.SignalKill


def test_the_snapshot_is_published_each_turn_and_cannot_be_changed(world):
    sup, store, clock, executor = world
    job = add(store, "seen")
    launched(sup, executor, job, clock)
    executor.pids[job.id] = [4242, 4243]
    executor.standbys[job.id] = (4250, 4251)
    sup.tick()
    snap = sup.snapshot()
    summary = snap.job(job.id)
    assert summary is not None and (summary.name, summary.phase, summary.attempt, summary.pids) == (
        "seen", Phase.RUNNING, 1, (4242, 4243))
    assert snap.live_pids() == {"seen": [4242, 4243]}
    assert summary.standby_pids == (4250, 4251) and snap.standby_pids() == {job.id: [4250, 4251]}
    with pytest.raises(FrozenInstanceError):
        summary.phase = Phase.DONE  # type: ignore[misc]
    executor.seen[job.id] = [LauncherExited(0, None), AllGone()]
    sup.tick()
    assert sup.snapshot().job(job.id) is None and snap.job(job.id) is summary, "an old snapshot stays as it was"

