"""The moves every handler of the machine makes: into a phase (with a fresh clock), into a stop, to the
end of a job that has no attempt to end; and the answers about the phase's slow work waiting for a
slot of its owner's lane (its deadline then waits too). PURE."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from spx.daemon.core.causes import ReasonClass, StopCause
from spx.daemon.lifecycle.actions import (
    Action,
    AgreeGeneration,
    Diagnose,
    DumpStacks,
    FindCheckpoint,
    FinishAttempt,
    Log,
)
from spx.daemon.lifecycle.observations import WorkQueued, WorkStarted
from spx.daemon.lifecycle.record import Phase, PhaseClock, TrackedJob
from spx.daemon.state.states import JobState

Result = tuple[TrackedJob, list[Action]]

# The slow work each phase waits on (its deadline is that work's).
AWAITED = {Phase.PREPARING: FindCheckpoint, Phase.DUMPING: DumpStacks, Phase.DIAGNOSING: Diagnose,
           Phase.AGREEING: AgreeGeneration}


def to(s: TrackedJob, phase: Phase, now: float) -> TrackedJob:
    """Into `phase`, its clock started now."""
    return replace(s, phase=phase, clock=PhaseClock(now=now, since=now))


def term(s: TrackedJob, now: float, cause: StopCause | None = None, **attempt: Any) -> TrackedJob:
    """Into STOPPING: SIGTERM sent now (the caller emits it); `cause` (if given) and `attempt`'s
    fields set on the attempt."""
    changes: dict[str, Any] = {"term_at": now, **attempt}
    if cause is not None:
        changes["stop_cause"] = cause
    return replace(to(s, Phase.STOPPING, now), attempt=replace(s.attempt, **changes))


def with_ledger(s: TrackedJob, **changes: Any) -> TrackedJob:
    return replace(s, ledger=replace(s.ledger, **changes))


def with_attempt(s: TrackedJob, **changes: Any) -> TrackedJob:
    return replace(s, attempt=replace(s.attempt, **changes))


def finish_without_attempt(s: TrackedJob, state: JobState, reason: str, now: float, *before: Action,
                           number: int = 0, reason_class: ReasonClass | None = None) -> Result:
    """→ DONE in `state`, GPUs released. `number` 0: no attempt row to end (none was made)."""
    finish = FinishAttempt(number=number, state=state, reason=reason, reason_class=reason_class,
                           backoff_level=s.ledger.backoff_level, no_progress_streak=s.ledger.no_progress_streak,
                           release_gpus=True)
    return to(with_ledger(s, job_state=state), Phase.DONE, now), [*before, finish]


def fail_before_attempt(s: TrackedJob, reason: str, now: float) -> Result:
    return finish_without_attempt(s, JobState.FAILED, reason, now, Log("launch_failed", "error", (("error", reason),)))


def _awaits(s: TrackedJob, action: Action) -> bool:
    kind = AWAITED.get(s.phase)
    return kind is not None and isinstance(action, kind) and getattr(action, "number", None) == s.number


def work_queued(s: TrackedJob, obs: WorkQueued, now: float) -> Result:
    # preparing|dumping|diagnosing|agreeing: the phase's slow work waits for one of its owner's
    # slots; its deadline waits with it (it counts from the work's start).
    if not _awaits(s, obs.action) or s.clock.waiting:
        return s, []
    return replace(s, clock=replace(s.clock, waiting=True)), [
        Log("waiting_for_owner_slot", "info", (("work", type(obs.action).__name__), ("detail", obs.detail)))]


def work_started(s: TrackedJob, obs: WorkStarted, now: float) -> Result:
    # … and got it: the deadline counts from now.
    if not _awaits(s, obs.action):
        return s, []
    return replace(s, clock=replace(s.clock, waiting=False, work_since=now)), []
