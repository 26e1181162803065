"""Work the executor does for a job's owner off the main loop, in that owner's lane (core.lanes).

Checkpoint discovery and the attempt's files (as the user), a standby's handoff and a cold launch's
status (the user's process on the other end of a pipe), stack dumps, root cause, the shared dir of a
job across hosts: each can wait on something the owner controls, so each runs in the owner's lane —
at most `user_work.slots_per_owner` of one owner's tasks at once, deadlines counted from a task's
start — and its answer comes back on the loop's thread as an observation (`results`).

A task the machine has a deadline on (`action` given: the FindCheckpoint, DumpStacks, Diagnose or
AgreeGeneration its phase waits for) is watched while it waits for a slot: `observe` says WorkQueued
once it has waited a while, and WorkStarted when it got its slot, so the machine's deadline counts
from the work's start, never from the queue. A task whose job is forgotten (cancelled meanwhile) is
dropped if it has not started, unless it owns processes that must be ended when it lands (`keep`);
a forgotten job's answers run their `done` (for that cleanup) but give no observation.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from spx.daemon.core.lanes import Lanes, Outcome, Task
from spx.daemon.lifecycle.actions import Action
from spx.daemon.lifecycle.observations import Observation, WorkQueued, WorkStarted
from spx.daemon.state.jobs_table import JobRow

# A task that has waited this long for a slot is reported (WorkQueued): the machine's deadline waits.
QUEUED_REPORT_SECONDS = 1.0


@dataclass(eq=False)
class _Submitted:
    job_id: int
    owner: int
    action: Action | None
    keep: bool
    task: Task | None = None
    told_queued: bool = False
    told_started: bool = False
    dropped: bool = False  # its job was forgotten: its answer gives no observation


@dataclass
class UserWork:
    """The executor's side of the lanes (see the module doc)."""

    lanes: Lanes
    clock: Callable[[], float] = time.monotonic
    _inflight: dict[int, list[_Submitted]] = field(default_factory=dict)
    _inbox: list[tuple[int, Observation]] = field(default_factory=list)

    def submit(self, job: JobRow, kind: str, work: Callable[[], Any], deadline: float,
               done: Callable[[Outcome], Observation | None], action: Action | None = None,
               keep: bool = False) -> None:
        """Run `work` in the owner's lane; `done(outcome)` runs on the loop's thread and gives the
        observation for the job (None: none)."""
        entry = _Submitted(job.id, job.owner_uid, action, keep)

        def answered(outcome: Outcome) -> None:
            jobs = self._inflight.get(entry.job_id, [])
            if entry in jobs:
                jobs.remove(entry)
                if not jobs:
                    del self._inflight[entry.job_id]
            obs = done(outcome)
            if obs is not None and not entry.dropped:
                self._inbox.append((entry.job_id, obs))

        entry.task = self.lanes.submit(job.owner_uid, kind, work, deadline, answered)
        self._inflight.setdefault(job.id, []).append(entry)

    def observe(self, job_id: int) -> list[Observation]:
        """WorkQueued / WorkStarted for the job's work that a deadline of the machine waits on."""
        out: list[Observation] = []
        for entry in self._inflight.get(job_id, ()):
            task = entry.task
            if entry.action is None or task is None:
                continue
            if task.started is None and not entry.told_queued and self.clock() - task.queued >= QUEUED_REPORT_SECONDS:
                entry.told_queued = True
                running, queued = self.lanes.counts().get(entry.owner, (0, 0))
                out.append(WorkQueued(entry.action, f"uid {entry.owner} has {running} tasks running and {queued} "
                                                    f"waiting (user_work.slots_per_owner: {self.lanes.per_owner})"))
            elif task.started is not None and entry.told_queued and not entry.told_started:
                entry.told_started = True
                out.append(WorkStarted(entry.action))
        return out

    def results(self) -> list[tuple[int, Observation]]:
        """The answers of finished (or overdue) work, as (job, observation), on the loop's thread."""
        self.lanes.deliver()
        out, self._inbox = self._inbox, []
        return out

    def forget(self, job_id: int) -> None:
        for entry in self._inflight.pop(job_id, []):
            entry.dropped = True
            if not entry.keep and entry.task is not None:
                self.lanes.cancel(entry.task)

    def waiting(self) -> set[int]:
        """Jobs with work waiting for a slot of their owner's lane."""
        return {j for j, entries in self._inflight.items()
                if any(e.task is not None and e.task.started is None for e in entries)}
