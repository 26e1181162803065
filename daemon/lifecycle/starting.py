"""The machine's edges before an attempt runs: the backoff counts down, the scheduler says Go, the
working set is staged, the attempt's files are made and its checkpoint found (off the loop, as the
user; the crash-loop fallback says which one to pass over, a divergence rollback which step it must
precede), and it is launched (a rollback's with the data window since its checkpoint skipped). PURE."""

from __future__ import annotations

from dataclasses import replace

from spx.daemon.core.causes import StopCause
from spx.daemon.lifecycle import across_hosts
from spx.daemon.lifecycle.actions import (
    Action,
    FindCheckpoint,
    Log,
    MarkStarting,
    Note,
    RecordRunning,
    RecordStop,
    SaveBackoff,
    SignalKill,
    Spawn,
    StartStaging,
)
from spx.daemon.lifecycle.moves import (
    Result,
    fail_before_attempt,
    finish_without_attempt,
    term,
    to,
    with_ledger,
)
from spx.daemon.lifecycle.observations import CheckpointFound, Go, Spawned, StagingEnded, Tick
from spx.daemon.lifecycle.record import Attempt, HangCalibration, Phase, Resume, TrackedJob
from spx.daemon.lifecycle.resume_fallback import checkpoint_to_avoid
from spx.daemon.lifecycle.rollback import divergence_args, rollback_after
from spx.daemon.state.states import JobState

# Checkpoint discovery comes back this long after it started, or the job fails (a hung network volume).
CHECKPOINT_DEADLINE_SECONDS = 120.0
# A backoff countdown is stored this often (a daemon SIGKILLed mid-backoff loses at most this much).
BACKOFF_SAVE_SECONDS = 15.0


def tick_backoff(s: TrackedJob, obs: Tick, now: float) -> Result:
    # backoff → ready: the remaining delay counts down in monotonic time.
    before = s.ledger.backoff_remaining
    remaining = max(0.0, before - max(0.0, now - s.clock.now))
    if remaining <= 0:
        return to(with_ledger(s, backoff_remaining=0.0), Phase.READY, now), []
    # backoff → backoff: the countdown is stored every BACKOFF_SAVE_SECONDS, so a daemon killed
    # (not stopped) during a long backoff resumes it with at most that much added, and one
    # killed more often than the whole delay still gets the job relaunched.
    s = with_ledger(s, backoff_remaining=remaining)
    if int(remaining // BACKOFF_SAVE_SECONDS) != int(before // BACKOFF_SAVE_SECONDS):
        return s, [SaveBackoff(remaining)]
    return s, []


def go(s: TrackedJob, obs: Go, now: float) -> Result:
    actions: list[Action] = []
    state = s.ledger.job_state
    if state is not JobState.STARTING:
        # ready → starting: queued (GPUs allocated) or restarting (backoff over, GPUs free).
        reason = "relaunching" if state is JobState.RESTARTING else ("GPUs allocated" if obs.gpus else "starting")
        actions.append(MarkStarting(obs.gpus, reason))
    s = with_ledger(s, job_state=JobState.STARTING, gpus=obs.gpus)
    if s.limits.stages and not s.ledger.staged:
        # ready → staging: the working set is copied before the first attempt.
        return to(s, Phase.STAGING, now), [*actions, StartStaging()]
    return _prepare(s, now, actions)


def _prepare(s: TrackedJob, now: float, actions: list[Action]) -> Result:
    # → preparing: files made and the checkpoint found off the loop (the launcher, where it may,
    # starting meanwhile); two failures in a row on one checkpoint pass over it (resume_fallback);
    # after a divergence, the checkpoints at or after its step (rollback).
    number = s.number + 1
    s = to(with_ledger(s, number=number), Phase.PREPARING, now)
    gang = s.limits.gang
    return s, [*actions, FindCheckpoint(number, checkpoint_to_avoid(s.ledger.history), s.limits.standby, gang,
                                        s.share.generation if gang else None,
                                        rollback_after(s.ledger.history, s.limits.restart, s.ledger.reject))]


def staging_ended(s: TrackedJob, obs: StagingEnded, now: float) -> Result:
    if obs.ok:
        # staging → preparing.
        return _prepare(with_ledger(s, staged=True), now, [Log("staging_done", "info", (("detail", obs.reason),))])
    # staging → done (failed): the copier failed; no attempt ran.
    return finish_without_attempt(s, JobState.FAILED, obs.reason, now,
                                  Log("staging_failed", "error", (("reason", obs.reason),)))


def checkpoint_found(s: TrackedJob, obs: CheckpointFound, now: float) -> Result:
    if obs.number != s.number:
        return s, []
    if obs.final is not None and obs.final.final is not None:
        # preparing → done: across hosts, the job already ended for good on another host (failed,
        # cancelled): it ends here too, with that host's reason.
        return finish_without_attempt(s, obs.final.final, across_hosts.on_host(obs.final), now,
                                      Log("ended_on_another_host", "warning", (("host", obs.final.by),
                                                                               ("generation", obs.final.gen))))
    if obs.generation is not None:
        s = replace(s, share=replace(s.share, generation=obs.generation))
    streak, last = s.ledger.no_progress_streak, s.attempt.resume.step
    if s.number > 1 and obs.step is not None and (last is None or obs.step > last):
        # The previous attempt left a newer checkpoint than it started from: it made progress, even
        # if no heartbeat said so (a script of its own). Without this a script that trains for
        # minutes and then keeps crashing on a bad newest checkpoint would be failed as a crash loop
        # one attempt before the crash-loop fallback (resume_fallback.py) resumes an older one.
        streak = 0
    # preparing (answered) → running, once Spawned comes back: launched from the checkpoint found,
    # skipping the data since it up to the divergent step when this is a rollback.
    # The discovery set aside what a replay found wrong (ledger.reject): done with it.
    s = replace(with_ledger(s, no_progress_streak=streak, reject=None), clock=replace(s.clock, answered=True),
                attempt=replace(s.attempt, resume=Resume(obs.path, obs.step, obs.fell_back)))
    rollback = rollback_after(s.ledger.history, s.limits.restart)
    skip = rollback.skipped(obs.step if obs.path is not None else None) if rollback is not None else ()
    return s, [Spawn(s.number, obs.path, obs.step, skip, divergence_args(s.limits.restart, s.ledger.class_counts))]


def tick_preparing(s: TrackedJob, obs: Tick, now: float) -> Result:
    if s.clock.overdue(now, CHECKPOINT_DEADLINE_SECONDS):
        # preparing → done (failed): checkpoint discovery never answered (a hung network volume).
        return fail_before_attempt(s, f"checkpoint discovery did not finish in {CHECKPOINT_DEADLINE_SECONDS:.0f} s", now)
    return s, []


def spawned(s: TrackedJob, obs: Spawned, now: float) -> Result:
    # preparing → running: the launcher exec'd. A fresh attempt (only the resume point it was
    # launched from carries over), a fresh hang calibration and share: nothing of the last
    # attempt's stop, exit or diagnosis survives into this one. Its pid and "running" are stored.
    cancelled_by = s.attempt.cancelled_by if s.attempt.stop_cause is StopCause.CANCEL else None
    s = replace(to(with_ledger(s, job_state=JobState.RUNNING), Phase.RUNNING, now),
                attempt=Attempt(resume=s.attempt.resume, started=now, started_wall=obs.wall),
                hang=HangCalibration(), share=s.share.fresh())
    running = RecordRunning(s.number, obs.pid, obs.boot_id, obs.start_ticks, obs.reason, obs.wall)
    if cancelled_by is not None:
        # preparing → running → stopping: cancelled while it launched (its GPUs kept meanwhile).
        # Nothing has trained yet, so no grace: SIGKILL to the attempt; it ends cancelled.
        s = term(s, now, StopCause.CANCEL, cancelled_by=cancelled_by, kill_at=now)
        return s, [running, RecordStop(s.number, StopCause.CANCEL),
                   Note(f"cancelled by {cancelled_by} during its launch: SIGKILL as it landed"), SignalKill()]
    return s, [running]
