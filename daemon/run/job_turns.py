"""One tracked job's turn, contained to that job: its observations fed to the machine
(lifecycle.machine.advance), each answer's actions to the executor, whose immediate results join the
observations, until nothing is left. Whatever a job's turn raises — a bug in the machine, an error
the executor did not expect — is logged once with `job` and `attempt`, and the job fails with the
error as its reason (lifecycle.failures.fault); the other jobs, and the daemon, go on."""

from __future__ import annotations

import traceback
from collections import deque
from collections.abc import Callable
from typing import Protocol

from spx.daemon.core.log import get_logger
from spx.daemon.lifecycle import failures, machine
from spx.daemon.lifecycle.actions import Action
from spx.daemon.lifecycle.observations import Observation
from spx.daemon.lifecycle.record import Phase, TrackedJob
from spx.daemon.state.db import StoreUnavailable
from spx.daemon.state.jobs_table import JobRow

log = get_logger()
# Observations one job may cause in one turn: a machine that keeps answering itself is a bug.
MAX_CHAIN = 64


class Performer(Protocol):
    store_error: str | None

    def perform(self, job: JobRow, s: TrackedJob, actions: list[Action]) -> list[Observation]: ...
    def forget(self, job_id: int) -> None: ...


class JobTurns:
    def __init__(self, executor: Performer, clock: Callable[[], float]):
        self.executor = executor
        self.clock = clock
        self.records: dict[int, TrackedJob] = {}
        self.jobs: dict[int, JobRow] = {}  # the row each tracked job was loaded from (its spec, owner)

    def begin(self, job: JobRow, record: TrackedJob, actions: list[Action]) -> None:
        """Track `job` from `record`, performing the actions that begin it."""
        self.jobs[job.id] = job
        self.records[job.id] = record
        self.guarded(job, lambda: self.run(job.id, deque(), actions))

    def feed(self, job_id: int, obs: list[Observation]) -> None:
        job = self.jobs.get(job_id)
        if job is not None:
            self.guarded(job, lambda: self.run(job_id, deque(obs), []))

    def run(self, job_id: int, pending: deque[Observation], actions: list[Action]) -> None:
        """Advance through `pending` observations, performing each answer's actions (whose immediate
        results join the queue), until none is left."""
        job = self.jobs[job_id]
        for _ in range(MAX_CHAIN):
            pending.extend(self.executor.perform(job, self.records[job_id], actions))
            if not pending:
                break
            self.records[job_id], actions = machine.advance(self.records[job_id], pending.popleft(), self.clock())
        else:
            raise RuntimeError(f"the job's state machine did not settle in {MAX_CHAIN} observations")
        s = self.records[job_id]
        if s.phase is Phase.DONE and not s.pending:
            self.forget(job_id)

    def forget(self, job_id: int) -> None:
        self.records.pop(job_id, None)
        self.jobs.pop(job_id, None)
        self.executor.forget(job_id)

    def guarded(self, job: JobRow, turn: Callable[[], None]) -> None:
        """Containment: whatever one job's turn raises fails that job, not the daemon."""
        try:
            turn()
        except StoreUnavailable as e:
            # Not the job's fault: its state is kept and the turn is tried again on the next tick.
            self.executor.store_error = str(e)
            log.warning("store_unavailable_during_turn", job=job.name, attempt=None, error=str(e))
        except Exception as e:  # noqa: BLE001 — the point: no job's fault ends the loop
            s = self.records.get(job.id)
            error = f"{type(e).__name__}: {e}"
            log.error("job_fault_contained", job=job.name, attempt=s.number if s else None, error=error,
                      traceback=traceback.format_exc(limit=8))
            if s is None or s.phase is Phase.DONE:
                self.forget(job.id)
                return
            try:
                self.records[job.id], actions = failures.fault(s, error, self.clock())
                self.run(job.id, deque(), actions)
            except Exception as e2:  # noqa: BLE001 — even failing it failed: forget it; the next daemon adopts it
                log.error("job_fault_unrecorded", job=job.name, attempt=s.number, error=f"{type(e2).__name__}: {e2}")
                self.forget(job.id)
