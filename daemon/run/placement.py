"""One scheduling turn: what the scheduler decided, made real — queued jobs placed, waiting ones
relaunched, the reason each job still waits recorded, jobs that can never start failed.

`scheduler.plan` is pure and decides; this is the part of the main loop's turn that gathers its
facts (the live jobs, what the supervisor holds and waits for, which GPUs the gate finds idle, the
queue's rules) and writes what it decided. It lives in `run` because every job-state write after
intake does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from spx.daemon.core.log import get_logger
from spx.daemon.gpu.backend import GpuBackend
from spx.daemon.gpu.gate import GpuGate
from spx.daemon.run import scheduler
from spx.daemon.run.auto_verify import AutoVerify
from spx.daemon.run.queue_control import QueueControl
from spx.daemon.run.supervisor import Supervisor
from spx.daemon.state.jobs_table import JobRow
from spx.daemon.state.states import JobState
from spx.daemon.state.store import Store

log = get_logger()


@dataclass(frozen=True)
class Inputs:
    """What one plan read, apart from the gate's answers (module doc): equal inputs, equal plan."""

    store: tuple[int, int]
    tracked: frozenset[int]
    waiting: tuple[scheduler.Waiting, ...]
    supervisor_gpus: frozenset[int]
    devices: tuple[int, ...]
    quarantined: frozenset[int]
    drained: str | None


class Asked:
    """The gate's `idle`, asked once per GPU per turn, with the answers kept: the next turn asks
    these GPUs again to know whether the plan would change."""

    def __init__(self, idle: Callable[[int], bool]) -> None:
        self.idle = idle
        self.answers: dict[int, bool] = {}

    def __call__(self, g: int) -> bool:
        if g not in self.answers:
            self.answers[g] = self.idle(g)
        return self.answers[g]

    def same_now(self) -> bool:
        return all(self.idle(g) == was for g, was in self.answers.items())


class Placement:
    def __init__(self, store: Store, supervisor: Supervisor, queue: QueueControl, gate: GpuGate, backend: GpuBackend,
                 clock: Callable[[], float] = time.monotonic, auto_verify: AutoVerify | None = None):
        self.clock = clock  # monotonic: when the per-user limits' cache is due
        self.store = store
        self.auto_verify = auto_verify  # periodic replays (`verify:`), on GPUs idle at the turn
        self.supervisor = supervisor
        self.queue = queue
        self.gate = gate
        self.backend = backend
        self._waiting_reasons: dict[int, str] = {}  # job → the reason last recorded (said once per change)
        self._planned: Inputs | None = None  # the inputs of the last plan made and written in full
        self._asked: Asked | None = None     # the gate's answers that plan used
        self._had_queue = False              # it had queued jobs (so the limits' cache mattered)
        self.plans = 0                       # plans made (the tests count them)

    def _inputs(self) -> Inputs:
        return Inputs(self.store.db.version(), frozenset(self.supervisor.tracked()), tuple(self.supervisor.waiting()),
                      frozenset(self.supervisor.held_gpus()), tuple(d.index for d in self.backend.devices()),
                      frozenset(self.gate.quarantined), self.queue.drained)

    def _unchanged(self, inputs: Inputs, now_mono: float) -> bool:
        """Nothing the last plan read has changed since it was made (module doc)."""
        if inputs != self._planned or self._asked is None:
            return False
        if self._had_queue and self.queue.limits_due(now_mono):
            return False
        return self._asked.same_now()

    def turn(self) -> None:
        """Ask the scheduler (the one place that decides) what starts now, and start it; nothing
        when nothing it would read has changed since its last plan (module doc)."""
        now_mono = self.clock()
        if self.auto_verify is not None:  # its own clock: heartbeats change without a store write
            self.auto_verify.tick(self.store.jobs.live, self._idle)
        inputs = self._inputs()
        if self._unchanged(inputs, now_mono):
            return
        self._planned = None  # until this plan is written in full: a turn cut short plans again
        live = self.store.jobs.live()
        tracked = self.supervisor.tracked()
        queued = [j for j in live if j.state is JobState.QUEUED and j.id not in tracked]
        waiting = self.supervisor.waiting()
        asked = Asked(self.gate.idle)
        if queued or waiting:  # asking NVML which GPUs are idle costs calls on every GPU
            self._plan(live, queued, waiting, asked, now_mono)
        self._planned, self._asked, self._had_queue = inputs, asked, bool(queued)

    def _plan(self, live: list[JobRow], queued: list[JobRow], waiting: list[scheduler.Waiting], asked: Asked,
              now_mono: float) -> None:
        self.plans += 1
        held = {g for j in live if j.state.holds_gpus for g in j.gpus} | self.supervisor.held_gpus()
        facts = self.queue.facts(live, queued, now_mono) if queued else None
        plan = scheduler.plan(queued, waiting, [d.index for d in self.backend.devices()], held,
                              asked, self.backend.description,
                              quarantined=frozenset(self.gate.quarantined), facts=facts)
        changed = {i: why for i, why in plan.waiting.items() if self._waiting_reasons.get(i) != why}
        if changed:
            self.store.jobs.set_reasons(changed, time.time())
        names = {j.id: j.name for j in queued} if changed else {}
        for job_id, why in changed.items():
            if job_id in self.supervisor.jobs:
                log.warning("relaunch_waiting", job=self.supervisor.jobs[job_id].name, attempt=None, reason=why)
            else:
                log.debug("job_waiting", job=names.get(job_id), attempt=None, reason=why)
        self._waiting_reasons = dict(plan.waiting)
        for imp in plan.impossible:
            self.store.jobs.transition(imp.job.id, JobState.FAILED, imp.reason, time.time())
            log.error("job_cannot_run", job=imp.job.name, attempt=None, reason=imp.reason)
        for start in plan.starts:
            self.supervisor.start(start)

    def _idle(self, live: list[JobRow]) -> list[int]:
        """GPUs no live job holds now, not quarantined, that the gate finds free."""
        held = {g for j in live if j.state.holds_gpus for g in j.gpus} | self.supervisor.held_gpus()
        return [d.index for d in self.backend.devices()
                if d.index not in held and d.index not in self.gate.quarantined and self.gate.idle(d.index)]
