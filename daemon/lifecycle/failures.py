"""What the machine does when an action failed (ActionFailed), and when the daemon itself failed
while handling a job (`fault`). The one place store refusals are decided: a write the store cannot
take now waits in the job's `pending` queue (re-emitted on the next tick, later writes behind it,
no relaunch before it is in); one it refuses for good gives the job up, loudly. `in_order` is how
every executor performs a batch of actions, so the store sees the writes in the machine's order.
PURE."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from spx.daemon.core.causes import ReasonClass, StopCause
from spx.daemon.lifecycle import across_hosts
from spx.daemon.lifecycle.actions import (
    STORE_ACTIONS,
    Action,
    AgreeGeneration,
    BeatGang,
    Diagnose,
    DumpStacks,
    FindCheckpoint,
    FinishAttempt,
    Log,
    MarkStarting,
    RecordRunning,
    RemoveCgroup,
    SaveBackoff,
    SignalKill,
    SignalTerm,
    Spawn,
    StartStaging,
    StopStaging,
)
from spx.daemon.lifecycle.ending import record_end
from spx.daemon.lifecycle.moves import (
    Result,
    fail_before_attempt,
    finish_without_attempt,
    term,
    to,
    with_ledger,
)
from spx.daemon.lifecycle.observations import ActionFailed, Observation
from spx.daemon.lifecycle.record import Phase, TrackedJob
from spx.daemon.state.states import JobState


def action_failed(s: TrackedJob, obs: ActionFailed, now: float) -> Result:
    a = obs.action
    if obs.retry and isinstance(a, STORE_ACTIONS):
        # any phase: the store cannot take the write now; it is re-emitted on the next tick, and
        # the job is not relaunched until it is in.
        return replace(s, pending=(*s.pending, a)), [Log("store_write_deferred", "warning", (("error", obs.error),))]
    mine = getattr(a, "number", s.number) == s.number
    if isinstance(a, FindCheckpoint) and s.phase is Phase.PREPARING and mine:
        # preparing → done (failed): the attempt's files cannot be made or read (the owner is gone,
        # a path is not theirs, discovery failed): no attempt can run.
        return fail_before_attempt(s, f"cannot prepare the attempt: {obs.error}", now)
    if isinstance(a, Spawn) and s.phase is Phase.PREPARING and mine and s.attempt.stop_cause is StopCause.CANCEL:
        # preparing → done (cancelled): cancelled during a launch that then failed: nothing ran.
        return finish_without_attempt(s, JobState.CANCELLED, f"cancelled by {s.attempt.cancelled_by}", now,
                                      number=s.number)
    if isinstance(a, Spawn) and s.phase is Phase.PREPARING and mine:
        # preparing → done (failed): the launch itself failed; the attempt row ends with it.
        finish = FinishAttempt(number=s.number, state=JobState.FAILED, reason=f"launch failed: {obs.error}",
                               reason_class=ReasonClass.LAUNCH, backoff_level=s.ledger.backoff_level,
                               no_progress_streak=s.ledger.no_progress_streak, release_gpus=True)
        return to(with_ledger(s, job_state=JobState.FAILED), Phase.DONE, now), [
            Log("launch_failed", "error", (("error", obs.error),)), finish]
    if isinstance(a, StartStaging) and s.phase is Phase.STAGING:
        # staging → done (failed): the copier could not be started.
        reason = f"staging failed: {obs.error}"
        return finish_without_attempt(s, JobState.FAILED, reason, now,
                                      Log("staging_failed", "error", (("reason", reason),)))
    if isinstance(a, DumpStacks) and s.phase is Phase.DUMPING:
        # dumping → stopping: no stacks (py-spy failed, or did not finish); the stop goes on.
        return term(s, now), [Log("stack_dump_failed", "warning", (("error", obs.error),)), SignalTerm()]
    if isinstance(a, Diagnose) and s.phase is Phase.DIAGNOSING:
        # diagnosing → recorded, without a diagnosis.
        return record_end(s, now)
    if isinstance(a, AgreeGeneration) and s.phase is Phase.AGREEING and mine:
        # agreeing → recorded on this host's own decision: the shared dir refused (the others see
        # the share stop, and follow at their next beat or join).
        s2, actions = record_end(replace(s, share=replace(s.share, agreed=True)), now)
        return s2, [Log("generation_not_agreed", "warning", (("error", obs.error),)), *actions]
    if isinstance(a, BeatGang):
        return across_hosts.beat_failed(s, obs.error)
    if isinstance(a, RecordRunning) and s.phase.has_processes:
        # An attempt the store refuses for good to record as running would run unrecorded: it is
        # killed and the job fails, as for any fault of the daemon's.
        return fault(s, f"cannot record the attempt as running: {obs.error}", now)
    if isinstance(a, FinishAttempt | MarkStarting | SaveBackoff):
        # A write the store refused for good (not a full disk: a bug, a broken row) — the job's
        # record cannot be trusted any more; it is given up on in memory, loudly.
        return to(s, Phase.DONE, now), [Log("store_write_failed", "error", (("error", obs.error),
                                                                           ("action", type(a).__name__)))]
    # Signals, notes, cgroup removal, a standby: logged; escalation goes on by the clock.
    return s, [Log("action_failed", "warning", (("action", type(a).__name__), ("error", obs.error)))]


def fault(s: TrackedJob, error: str, now: float) -> Result:
    """Containment: the daemon itself raised while handling this job (a bug, an unexpected error).
    The job fails with the error as its reason; whatever of its attempt still runs is killed (a
    launch under way is ended by the executor when it lands: the job is forgotten)."""
    actions: list[Action] = [Log("job_fault", "error", (("error", error),))]
    attempt_open = s.phase.has_processes or s.phase.ending
    if attempt_open:
        actions += [SignalKill(), RemoveCgroup()]
    if s.phase is Phase.STAGING:
        actions.append(StopStaging())
    launching = s.phase is Phase.PREPARING and s.clock.answered
    a = s.attempt
    actions.append(FinishAttempt(number=s.number if attempt_open or launching else 0, state=JobState.FAILED,
                                 reason=f"daemon error: {error}", reason_class=ReasonClass.DAEMON_ERROR,
                                 exit_code=a.exit_code, signal=a.exit_signal, max_step=a.last_step,
                                 backoff_level=s.ledger.backoff_level, no_progress_streak=s.ledger.no_progress_streak,
                                 release_gpus=True))
    return to(replace(with_ledger(s, job_state=JobState.FAILED), pending=()), Phase.DONE, now), actions


def in_order(actions: list[Action], perform: Callable[[Action], list[Observation]]) -> list[Observation]:
    """`actions` performed one after the other; after a store write answered as refused (a retryable
    ActionFailed), none of the batch's later writes is made — each is answered as refused too, and
    waits in `pending` behind the first."""
    out: list[Observation] = []
    refused = False
    for a in actions:
        if refused and isinstance(a, STORE_ACTIONS):
            out.append(ActionFailed(a, "waiting for an earlier write", retry=True))
            continue
        results = perform(a)
        refused = refused or any(isinstance(r, ActionFailed) and r.retry for r in results)
        out.extend(results)
    return out
