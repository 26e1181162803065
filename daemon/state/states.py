"""Job states and the edges allowed between them. Stdlib only: the CLI and metrics import it for free.

    queued → starting → running ⇄ restarting → succeeded | failed | cancelled

Meanings of the terminal states:
- succeeded: the last attempt exited 0.
- failed: the daemon gave up; `reason` says why (crash loop, max restarts, non-restartable exit
  code, staging failed, launch impossible).
- cancelled: `spx cancel`; the running attempt got its grace period to checkpoint.
"""

from __future__ import annotations

import enum


class JobState(str, enum.Enum):
    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    RESTARTING = "restarting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL

    @property
    def holds_gpus(self) -> bool:
        """States whose GPUs are reserved: a restarting job keeps its GPUs through the backoff so
        that another job cannot take them between two attempts."""
        return self in (JobState.STARTING, JobState.RUNNING, JobState.RESTARTING)


TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
LIVE = frozenset(JobState) - TERMINAL

ALLOWED_EDGES: dict[JobState, frozenset[JobState]] = {
    # queued: waiting for GPUs. May be cancelled, or fail before launch (staging, bad owner).
    JobState.QUEUED: frozenset({JobState.STARTING, JobState.CANCELLED, JobState.FAILED}),
    # starting: GPUs allocated, data staged, launcher spawned; running once it is alive.
    JobState.STARTING: frozenset(
        {JobState.RUNNING, JobState.RESTARTING, JobState.FAILED, JobState.CANCELLED, JobState.SUCCEEDED}
    ),
    # running: an attempt is alive. It ends in success, a restart, a give-up, or a cancel.
    JobState.RUNNING: frozenset(
        {JobState.SUCCEEDED, JobState.RESTARTING, JobState.FAILED, JobState.CANCELLED}
    ),
    # restarting: between attempts (backoff, waiting for GPUs to be free); then a new launch.
    JobState.RESTARTING: frozenset({JobState.STARTING, JobState.FAILED, JobState.CANCELLED}),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}


class IllegalTransition(Exception):
    pass


def check_edge(old: JobState, new: JobState) -> None:
    if new not in ALLOWED_EDGES[old]:
        raise IllegalTransition(f"{old.value} → {new.value} is not an allowed job transition")
