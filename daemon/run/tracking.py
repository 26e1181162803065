"""Where a tracked job's record comes from: the store's row and attempts, made into the machine's
value (lifecycle.record.TrackedJob) — when the scheduler starts a queued job, and at daemon start
for every job the store holds as starting, running or restarting (`recovered`: an attempt still
running is taken on as it is, one that ended while no daemon watched is decided on its recorded
exit, a backoff resumes with its stored remaining seconds)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from spx.daemon.core.config import DaemonConfig
from spx.daemon.core.log import get_logger
from spx.daemon.lifecycle import machine
from spx.daemon.lifecycle.actions import Action
from spx.daemon.lifecycle.observations import LauncherExited
from spx.daemon.lifecycle.record import Limits, TrackedJob
from spx.daemon.lifecycle.resume_fallback import past_attempt, remember
from spx.daemon.run.worker_watch import WORKER_LAUNCHERS
from spx.daemon.staging.runner import staging_done
from spx.daemon.state.attempts_table import AttemptRow
from spx.daemon.state.jobs_table import JobRow
from spx.daemon.state.states import JobState
from spx.daemon.state.store import Store

log = get_logger()

STANDBY_LAUNCHERS = ("torchrun", "deepspeed")  # a `python -m` launcher of their own (run/standby.py)


class Adopter(Protocol):
    def adopt(self, job: JobRow, row: AttemptRow) -> LauncherExited | None: ...
    def adopt_lost(self, job: JobRow, number: int) -> None: ...


def worker_deaths_end(job: JobRow) -> bool:
    """Does a worker's abnormal death end the attempt at once when no survivor can checkpoint (no
    heartbeat, or ranks on several hosts: lifecycle.stopping.worker_died)? For a launcher with rank
    workers (torchrun, DeepSpeed; run with no in-launcher restarts, so a dead worker is the attempt's
    end anyway), and only where every exit code restarts: the launcher would have exited 1 whatever
    the worker's code, and `restart.on_exit_codes` is read on that exit, so a job that lists its codes
    keeps it. Across hosts the other hosts' shares learn of it as before: their collectives fail, or
    the next generation tells them."""
    return job.spec.launcher in WORKER_LAUNCHERS and job.spec.restart.on_exit_codes == "any"


def limits_of(job: JobRow, cfg: DaemonConfig) -> Limits:
    return Limits(grace_seconds=job.spec.stop.grace_seconds, hang_timeout_seconds=job.spec.restart.hang_timeout_seconds,
                  healthy_seconds=cfg.healthy_seconds, restart=job.spec.restart,
                  stages=job.spec.data.stage is not None, gang=job.spec.nodes.count > 1,
                  standby=cfg.launch_standby and job.spec.launcher in STANDBY_LAUNCHERS,
                  worker_deaths_end=worker_deaths_end(job),
                  replay_of=job.spec.replay.of if job.spec.replay is not None else None)


def placed(job: JobRow, cfg: DaemonConfig, store: Store, gpus: tuple[int, ...], now: float,
           recovering: bool = False) -> TrackedJob:
    """The record of a job the scheduler placed, or (`recovering`) one found starting, running or
    restarting at daemon start: its stored backoff resumes, its attempts' last generation is its own."""
    attempts = store.attempts.for_job(job.id)
    faults = store.attempts.faults_by_class(job.id)
    history: tuple = ()
    for row in attempts:
        history = remember(history, past_attempt(row))
    return machine.placed(job.id, job.name, limits_of(job, cfg), job.state, gpus, number=len(attempts),
                          restarts=sum(faults.values()), class_counts=faults, backoff_level=job.backoff_level,
                          no_progress_streak=job.no_progress_streak,
                          backoff_remaining=job.backoff_remaining if recovering and job.state is JobState.RESTARTING
                          else 0.0, staged=staging_done(job.staging), now=now,
                          generation=attempts[-1].generation if recovering and attempts else None, history=history)


def recovered(job: JobRow, cfg: DaemonConfig, store: Store, executor: Adopter, now: float,
              wall: Callable[[], float] = time.time) -> tuple[TrackedJob, list[Action], bool]:
    """At daemon start, a job the store holds as starting, running or restarting: its record, the
    actions that begin it, and whether an attempt of it was found still running (adopted as it is)."""
    base = placed(job, cfg, store, tuple(job.gpus), now, recovering=True)
    open_att = store.attempts.open_for(job.id)
    if open_att is None and job.state is JobState.RUNNING:
        # Running without an open attempt (its row never made it): nothing to find; lost, and
        # relaunched through the machine (so a store that refuses the write now gets it retried).
        executor.adopt_lost(job, base.number)
        record, actions = machine.adopted(base, base.number, wall(), None, now,
                                          ended=LauncherExited(None, None, lost=True))
        return record, actions, False
    if open_att is None:
        log.info("resumed_after_restart", job=job.name, attempt=None, state=job.state.value,
                 backoff_remaining=round(base.ledger.backoff_remaining, 1))
        return base, [], False
    ended = executor.adopt(job, open_att)
    if open_att.exited is not None:  # the old daemon saw its launcher exit and stored how
        ended = LauncherExited(open_att.exit_code, open_att.signal, ended_wall=open_att.exited)
    record, actions = machine.adopted(base, open_att.number, open_att.start, open_att.resumed_from_step, now,
                                      ran_seconds=wall() - open_att.start, stop_cause=open_att.stop_cause,
                                      ended=ended, generation=open_att.generation,
                                      resumed_from=open_att.resumed_from)
    return record, actions, ended is None
