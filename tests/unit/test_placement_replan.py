"""The scheduling turn plans again only when something its plan reads has changed (run/placement.py):
turns with nothing new read none of the live jobs, and each input that can let a waiting job start —
the store (a release, a new job, an undrain written), GPUs the supervisor frees, a GPU freed outside
the daemon, the quarantine, a relaunch whose backoff ran out, the per-user limits read again — makes
the next turn plan, and the job starts. The supervisor, the gate and the host's GPUs are stand-ins;
the store and the queue's rules are the daemon's own."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from spx.daemon.core.config import load_config
from spx.daemon.core.spec import parse_spec
from spx.daemon.run import queue_control
from spx.daemon.run.placement import Placement
from spx.daemon.run.queue_control import QueueControl
from spx.daemon.run.queue_rules import Limit
from spx.daemon.run.scheduler import Start, Waiting
from spx.daemon.state.states import JobState
from spx.daemon.state.store import Store

GPUS = 8


@dataclass(frozen=True)
class Device:
    index: int


class Host:
    description = "stand-in: 8 GPUs"

    def devices(self) -> list[Device]:
        return [Device(i) for i in range(GPUS)]


class Gate:
    """`idle(g)`: no process outside the daemon on g (`busy` says which have one); asks counted."""

    def __init__(self) -> None:
        self.busy: set[int] = set()
        self.quarantined: dict[int, tuple] = {}
        self.asked = 0

    def idle(self, g: int) -> bool:
        self.asked += 1
        return g not in self.busy


class Supervisor:
    """What the turn asks of the supervisor: the jobs it tracks, the GPUs they hold, the relaunches
    ready to go; `start` tracks the job on its GPUs and moves it to starting, as the real one does."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.held: dict[int, tuple[int, ...]] = {}
        self.ready: list[Waiting] = []
        self.jobs: dict = {}
        self.started: list[int] = []

    def tracked(self) -> set[int]:
        return set(self.held)

    def waiting(self) -> list[Waiting]:
        return list(self.ready)

    def held_gpus(self) -> set[int]:
        return {g for gpus in self.held.values() for g in gpus}

    def start(self, start: Start) -> None:
        self.started.append(start.job_id)
        self.ready = [w for w in self.ready if w.job_id != start.job_id]
        self.held[start.job_id] = start.gpus
        if start.job is not None:
            self.store.jobs.transition(start.job_id, JobState.STARTING, None, 2.0, gpus=list(start.gpus))


class Turns:
    def __init__(self, tmp_path, monkeypatch) -> None:
        self.cfg = load_config(None, tmp_path / "root")
        self.cfg.state_dir.mkdir(parents=True)
        self.store = Store(self.cfg.store_path)
        self.sup, self.gate, self.now = Supervisor(self.store), Gate(), 100.0
        self.queue = QueueControl(self.cfg, self.store)
        self.placement = Placement(self.store, self.sup, self.queue, self.gate, Host(), clock=lambda: self.now)
        self.reads = 0
        live = self.store.jobs.live

        def counted():
            self.reads += 1
            return live()

        monkeypatch.setattr(self.store.jobs, "live", counted)

    def add(self, name: str, gpus: int = 1, **extra: str) -> int:
        lines = "".join(f"{k}: {v}\n" for k, v in extra.items())
        return self.store.jobs.add(parse_spec(f"name: {name}\nscript: /bin/true\ngpus: {gpus}\n{lines}"),
                                   0, "root", f"/spool/{name}", 1.0)

    def turns(self, n: int = 3) -> None:
        for _ in range(n):
            self.placement.turn()
            self.now += 1.0

    def settled(self) -> None:
        """Turns until planning stops (its own reasons written are one change), then a check that
        further turns plan nothing and read no job."""
        self.turns(3)
        plans, reads = self.placement.plans, self.reads
        self.turns(5)
        assert (self.placement.plans, self.reads) == (plans, reads), "turns with nothing new planned again"


@pytest.fixture
def t(tmp_path, monkeypatch):
    turns = Turns(tmp_path, monkeypatch)
    turns.sup.held[0] = tuple(range(GPUS))  # a relaunch between two attempts holds every GPU
    yield turns
    turns.store.close()


def test_turns_with_nothing_new_read_no_job_and_plan_nothing(t):
    for i in range(50):
        t.add(f"q{i}")
    t.turns(1)
    assert t.store.jobs.by_name("q7").reason == "waiting behind an earlier job that waits for GPUs (no backfill)"
    t.settled()
    asked = t.gate.asked
    t.turns(20)
    assert t.gate.asked == asked, "GPUs held by the daemon's own jobs are asked about only when planning"


def test_gpus_the_supervisor_frees_start_the_next_job(t):
    job = t.add("next", 2)
    t.settled()
    t.sup.held[0] = ()  # the blocker's attempt let go of its GPUs (the supervisor still tracks it)
    t.turns(1)
    assert t.sup.started[-1] == job


def test_a_job_the_supervisor_no_longer_tracks_is_placed_again(t):
    t.sup.held[0] = ()
    job = t.add("cpu", 0)
    t.sup.held[job] = ()  # tracked: not queued for the scheduler
    t.settled()
    assert job not in t.sup.started
    del t.sup.held[job]
    t.turns(1)
    assert t.sup.started[-1] == job


def test_a_gpu_freed_outside_the_daemon_starts_the_job_waiting_for_it(t):
    t.sup.held = {0: (0, 1, 2, 3, 4, 5, 6)}  # the blocker holds 7 of 8; GPU 7 busy with another program
    t.gate.busy = {7}
    job = t.add("one")
    t.settled()
    assert job not in t.sup.started
    t.gate.busy.clear()
    t.turns(1)
    assert t.sup.started[-1] == job


def test_store_changes_release_undrain_and_new_jobs_are_planned(t):
    t.sup.held.clear()
    held = t.add("held")
    t.queue.hold(t.store.jobs.get(held), "root")
    t.queue.drain("root")
    t.settled()
    assert t.store.jobs.get(held).reason.startswith("held by root")
    t.queue.release(t.store.jobs.get(held), "root")
    t.settled()
    assert held not in t.sup.started and "drained" in t.store.jobs.get(held).reason
    t.queue.undrain("root")
    t.turns(1)
    assert t.sup.started[-1] == held
    late = t.add("late", 0)
    t.turns(1)
    assert t.sup.started[-1] == late


def test_a_dependency_that_ends_starts_the_job_after_it(t):
    t.sup.held.clear()
    first = t.add("first", 0, priority="-5")
    t.sup.held[first] = ()  # tracked: running, so never placed again
    after = t.add("second", 0, after="[first]")
    t.settled()
    assert "waiting for dependency first" in t.store.jobs.get(after).reason
    t.store.jobs.transition(first, JobState.STARTING, None, 3.0)
    t.store.jobs.transition(first, JobState.SUCCEEDED, None, 4.0)
    t.turns(1)
    assert t.sup.started[-1] == after


def test_a_released_quarantine_and_a_ready_relaunch_are_planned(t):
    t.sup.held.clear()
    t.gate.quarantined = {g: ("uuid", "xid 79", 1.0) for g in range(GPUS)}
    job = t.add("q")
    t.settled()
    t.gate.quarantined = {}
    t.turns(1)
    assert t.sup.started[-1] == job
    t.sup.held.pop(job)
    t.settled()
    t.sup.ready = [Waiting(job, (0,), 1)]  # its backoff ran out
    t.turns(1)
    assert t.sup.started[-1] == job and t.sup.held[job] == (0,)


def test_a_raised_limit_is_seen_once_the_limits_are_read_again(t, monkeypatch):
    t.sup.held.clear()
    limit = {"gpus": 0}
    monkeypatch.setattr(t.queue.cfg.limits.__class__, "any", property(lambda self: True))
    monkeypatch.setattr(queue_control, "limit_for", lambda cfg, uid: Limit(limit["gpus"], "default"))
    job = t.add("limited")
    t.settled()
    assert "limit" in t.store.jobs.get(job).reason
    limit["gpus"] = 1  # the user database now says more; read again once the cache is due
    t.now += queue_control.LIMITS_CACHE_SECONDS
    t.turns(1)
    assert t.sup.started[-1] == job


def test_a_turn_cut_short_by_a_refusing_store_plans_again(t, monkeypatch):
    """A plan whose writes the store refused (disk full) left nothing recorded: the next turn plans
    again, though nothing the plan reads has changed, and its reasons are written then."""
    from spx.daemon.state.db import StoreUnavailable

    t.settled()
    job = t.add("late")
    real = t.store.jobs.set_reasons
    refused: list[int] = []

    def refuse_once(reasons, now):
        if not refused:
            refused.append(1)
            raise StoreUnavailable("disk full")
        real(reasons, now)

    monkeypatch.setattr(t.store.jobs, "set_reasons", refuse_once)
    with pytest.raises(StoreUnavailable):
        t.placement.turn()
    assert t.store.jobs.get(job).reason is None
    t.turns(1)
    assert t.store.jobs.get(job).reason == "waiting for 1 free GPU"
