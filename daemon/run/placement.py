"""One scheduling turn: what the scheduler decided, made real — queued jobs placed, waiting ones
relaunched, the reason each job still waits recorded, jobs that can never start failed.

`scheduler.plan` is pure and decides; this is the part of the main loop's turn that gathers its
facts (the live jobs, what the supervisor holds and waits for, which GPUs the gate finds idle, the
queue's rules) and writes what it decided. It lives in `run` because every job-state write after
intake does.
"""

from __future__ import annotations

import functools
import time

from spx.daemon.core.log import get_logger
from spx.daemon.gpu.backend import GpuBackend
from spx.daemon.gpu.gate import GpuGate
from spx.daemon.run import scheduler
from spx.daemon.run.auto_verify import AutoVerify
from spx.daemon.run.queue_control import QueueControl
from spx.daemon.run.supervisor import Supervisor
from spx.daemon.state.states import JobState
from spx.daemon.state.store import Store

log = get_logger()


class Placement:
    def __init__(self, store: Store, supervisor: Supervisor, queue: QueueControl, gate: GpuGate, backend: GpuBackend,
                 auto_verify: AutoVerify | None = None):
        self.store = store
        self.auto_verify = auto_verify  # periodic replays (`verify:`), on GPUs idle at the turn
        self.supervisor = supervisor
        self.queue = queue
        self.gate = gate
        self.backend = backend
        self._waiting_reasons: dict[int, str] = {}  # job → the reason last recorded (said once per change)

    def turn(self) -> None:
        """Ask the scheduler (the one place that decides) what starts now, and start it."""
        live = self.store.jobs.live()
        if self.auto_verify is not None:
            self.auto_verify.tick(live, lambda: self._idle(live))
        tracked = self.supervisor.tracked()
        queued = [j for j in live if j.state is JobState.QUEUED and j.id not in tracked]
        waiting = self.supervisor.waiting()
        if not queued and not waiting:  # asking NVML which GPUs are idle costs calls on every GPU
            return
        held = {g for j in live if j.state.holds_gpus for g in j.gpus} | self.supervisor.held_gpus()
        facts = self.queue.facts(live, queued, time.monotonic()) if queued else None
        plan = scheduler.plan(queued, waiting, [d.index for d in self.backend.devices()], held,
                              functools.cache(self.gate.idle), self.backend.description,
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

    def _idle(self, live: list) -> list[int]:
        """GPUs no live job holds now, not quarantined, that the gate finds free."""
        held = {g for j in live if j.state.holds_gpus for g in j.gpus} | self.supervisor.held_gpus()
        return [d.index for d in self.backend.devices()
                if d.index not in held and d.index not in self.gate.quarantined and self.gate.idle(d.index)]
