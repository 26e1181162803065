"""The machine's store writes, performed: each action one transaction (Store). A write the store
cannot take now raises StoreUnavailable, which the executor answers as a retryable ActionFailed —
the machine's `pending` queue is the one place refused writes wait and are re-emitted from. Keeps
the store's last refusal (shown in the STATUS line while a write waits) and the last restart."""

from __future__ import annotations

import time
from collections.abc import Callable

from spx.daemon.core.causes import ReasonClass
from spx.daemon.lifecycle.actions import (
    FinishAttempt,
    MarkStarting,
    RecordExit,
    RecordRunning,
    RecordStop,
    SaveBackoff,
)
from spx.daemon.state.jobs_table import JobRow
from spx.daemon.state.states import JobState
from spx.daemon.state.store import Store


class StoreWrites:
    def __init__(self, store: Store, rows: Callable[[int, int], int | None], wall: Callable[[], float] = time.time):
        self.store = store
        self.rows = rows  # (job, attempt number) → its store row, where it has one
        self.wall = wall
        self.store_error: str | None = None  # the store's last refusal of a write
        self.last_restart: tuple[str, float, str] | None = None  # (job, wall time, reason) for STATUS

    def mark_starting(self, job: JobRow, a: MarkStarting) -> None:
        self.store.jobs.transition(job.id, JobState.STARTING, a.reason, self.wall(), gpus=list(a.gpus))

    def record_running(self, job: JobRow, a: RecordRunning) -> None:
        row = self.rows(job.id, a.number)
        if row is not None:
            self.store.attempts.running(job.id, row, pgid=a.pgid, boot_id=a.boot_id, start_ticks=a.start_ticks,
                                       reason=a.reason, now=a.wall)

    def record_stop(self, job: JobRow, a: RecordStop) -> None:
        row = self.rows(job.id, a.number)
        if row is not None:
            self.store.attempts.stopping(row, a.cause)

    def record_exit(self, job: JobRow, a: RecordExit) -> None:
        row = self.rows(job.id, a.number)
        if row is not None:
            self.store.attempts.exited(row, a.code, a.signal, a.stop_cause, self.wall())

    def finish(self, job: JobRow, a: FinishAttempt, memory_peak: int | None = None) -> int | None:
        """The attempt's row ended and the job moved, together; returns the row ended (None: none).
        `memory_peak`: the attempt cgroup's, where it was measured."""
        now = a.ended_wall if a.ended_wall is not None else self.wall()
        row = self.rows(job.id, a.number) if a.number else None
        attempt_fields: dict[str, object] = {}
        if row is not None:
            attempt_fields = {"end": now, "exit_code": a.exit_code, "signal": a.signal, "reason": a.reason,
                              "reason_class": a.reason_class, "max_step": a.max_step, "root_cause": a.root_cause,
                              "memory_peak": memory_peak,
                              "backoff": a.backoff_remaining if a.state is JobState.RESTARTING else None}
        job_fields: dict[str, object] = {"backoff_level": a.backoff_level, "no_progress_streak": a.no_progress_streak,
                                         "backoff_remaining": a.backoff_remaining}
        if a.release_gpus:
            job_fields["gpus"] = []
        self.store.attempts.finish(job.id, row, a.state, a.reason, now, attempt_fields, job_fields)
        if a.state is JobState.RESTARTING and a.reason_class not in (ReasonClass.DAEMON_RESTART, None):
            self.last_restart = (job.name, now, str(a.reason_class))
        return row

    def save_backoff(self, job: JobRow, a: SaveBackoff) -> None:
        self.store.jobs.update(job.id, self.wall(), backoff_remaining=a.remaining)
