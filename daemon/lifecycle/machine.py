"""The job's state machine: one job between "GPUs allocated" and its next resting state.

PURE. Every live job the supervisor tracks (a starting, running or restarting one) is a `TrackedJob`
value (record.py), and advances only by

    advance(job, observation, now) -> (new job, actions)

`now` is `time.monotonic()`: every delay (grace, hang, backoff, deadlines of slow work) is measured
on it, and a backoff is persisted as the seconds that remain, never as a wall-clock deadline, so a
clock jump neither fires nor freezes a restart. Observations (observations.py) say what the executor
saw; actions (actions.py) say what it must do, and it feeds each result back as another observation.
So every edge is tested by scripting observations, with no processes (tests/unit/test_lifecycle_*.py)
— supervisord's per-tick `transition()` and torch elastic's "the monitor returns a result, one loop
decides" are the models.

Phases (the stored `JobState` in brackets):

    BACKOFF [restarting] --remaining reaches 0--> READY [restarting]
    READY [queued|starting|restarting] --Go--> STAGING | PREPARING [starting]
    STAGING --copier done--> PREPARING;  PREPARING --checkpoint found, launched--> RUNNING [running]
    RUNNING --hang--> DUMPING --stacks dumped--> STOPPING;  RUNNING --cancel/daemon stop/GPU fault--> STOPPING
    RUNNING --a worker died, no survivor can checkpoint--> STOPPING (SIGKILL at once)
    STOPPING --grace over--> SIGKILL (still STOPPING);  RUNNING|DUMPING|STOPPING --launcher exited--> EXITED
    EXITED --all processes gone--> DIAGNOSING --diagnosis (or its deadline)--> record the end:
        BACKOFF (a restart) | DONE (succeeded / failed / cancelled, or the daemon stops)
    across hosts: RUNNING --another host began a newer generation--> STOPPING;
        DIAGNOSING --> AGREEING --the others told--> record the end

`HANDLERS` is the whole machine: (phase, observation type) → handler, a Tick handler for every phase
among them; handlers live in modules by what they hold (starting, running, stopping, ending,
across_hosts, failures). A pair not in the table is a result for something no longer asked (a
checkpoint found for a job cancelled meanwhile, stacks dumped after the attempt ended): nothing to do.

Jobs outlive the daemon: at its start, an attempt a previous daemon left open enters (`adopted`) as
RUNNING if it still runs, STOPPING if that daemon was stopping it, EXITED if it ended meanwhile (the
exit its monitor recorded, or "lost" without one).

Store writes are actions too, and each handler writes at most one transaction: FinishAttempt ends
the attempt row and moves the job together. What adoption after a daemon restart needs is written
when it happens (RecordStop before a SIGTERM, RecordExit when the launcher's exit is seen). A write
the store cannot take now comes back as a retryable ActionFailed and waits in `pending`: re-emitted
first on the next tick, later writes queued behind it, no relaunch while one waits (failures.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from spx.daemon.core.causes import CONTINUED_STOPS, StopCause
from spx.daemon.lifecycle import ending, failures, running, starting, stopping
from spx.daemon.lifecycle.across_hosts import gang_seen
from spx.daemon.lifecycle.actions import STORE_ACTIONS, Action, Log
from spx.daemon.lifecycle.moves import Result, term, to, work_queued, work_started
from spx.daemon.lifecycle.observations import (
    ActionFailed,
    ActivitySeen,
    AllGone,
    CancelRequested,
    CheckpointFound,
    DaemonStopping,
    Diagnosed,
    GangSeen,
    GenerationAgreed,
    Go,
    GpuFault,
    HeartbeatSeen,
    LauncherExited,
    LeaseLost,
    Observation,
    ReplayDiffered,
    Spawned,
    StacksDumped,
    StagingEnded,
    Tick,
    WorkerDied,
    WorkQueued,
    WorkStarted,
)
from spx.daemon.lifecycle.record import (
    Attempt,
    Identity,
    Ledger,
    Limits,
    Phase,
    PhaseClock,
    Resume,
    Share,
    TrackedJob,
)
from spx.daemon.lifecycle.resume_fallback import PastAttempt
from spx.daemon.state.states import JobState

# Each handler takes the observation type its table entry names (the table is what guarantees it).
Handler = Callable[[TrackedJob, Any, float], Result]


def _nothing(s: TrackedJob, obs: object, now: float) -> Result:
    return s, []


_EVERY_PHASE: dict[type, Handler] = {CancelRequested: stopping.cancel, DaemonStopping: stopping.daemon_stopping,
                                      LeaseLost: stopping.lease_lost, ReplayDiffered: stopping.replay_differed,
                                      ActionFailed: failures.action_failed}
# The phases waiting on slow work (moves.AWAITED): it may wait for a slot of its owner's lane first.
_SLOW_WORK: dict[type, Handler] = {WorkQueued: work_queued, WorkStarted: work_started}
# What each phase answers (besides _EVERY_PHASE): its Tick handler first, then the rest.
_BY_PHASE: dict[Phase, dict[type, Handler]] = {
    Phase.BACKOFF: {Tick: starting.tick_backoff},
    Phase.READY: {Tick: _nothing, Go: starting.go},
    Phase.STAGING: {Tick: _nothing, StagingEnded: starting.staging_ended},
    Phase.PREPARING: {Tick: starting.tick_preparing, CheckpointFound: starting.checkpoint_found,
                      Spawned: starting.spawned, **_SLOW_WORK},
    Phase.RUNNING: {Tick: running.tick_running, HeartbeatSeen: running.heartbeat, ActivitySeen: running.activity,
                    GangSeen: gang_seen, GpuFault: stopping.gpu_fault, WorkerDied: stopping.worker_died,
                    LauncherExited: stopping.launcher_exited},
    Phase.DUMPING: {Tick: stopping.tick_dumping, StacksDumped: stopping.stacks_dumped, HeartbeatSeen: running.heartbeat,
                    GpuFault: stopping.gpu_fault, LauncherExited: stopping.launcher_exited, **_SLOW_WORK},
    Phase.STOPPING: {Tick: stopping.tick_stopping, HeartbeatSeen: running.heartbeat,
                     LauncherExited: stopping.launcher_exited},
    Phase.EXITED: {Tick: stopping.tick_exited, AllGone: stopping.all_gone, HeartbeatSeen: running.heartbeat},
    Phase.DIAGNOSING: {Tick: ending.tick_diagnosing, Diagnosed: ending.diagnosed, **_SLOW_WORK},
    Phase.AGREEING: {Tick: ending.tick_agreeing, GenerationAgreed: ending.agreed, **_SLOW_WORK},
    Phase.DONE: {Tick: _nothing},
}
HANDLERS: dict[tuple[Phase, type], Handler] = {
    (phase, obs): handler for phase, answers in _BY_PHASE.items() for obs, handler in {**_EVERY_PHASE, **answers}.items()}


def advance(s: TrackedJob, obs: Observation, now: float) -> Result:
    """The only place a tracked job changes. Returns the new value and what to do."""
    retry: tuple[Action, ...] = ()
    if isinstance(obs, Tick) and s.pending:
        # Writes the store refused are re-emitted first, in their order.
        retry, s = s.pending, replace(s, pending=())
    waiting = bool(s.pending)
    handler = HANDLERS.get((s.phase, type(obs)), _nothing)
    s, actions = handler(s, obs, now)
    if waiting:
        # A write is pending: later writes queue behind it, so the store sees them in order (a spawn
        # never runs before its job is marked starting).
        s = replace(s, pending=(*s.pending, *(a for a in actions if isinstance(a, STORE_ACTIONS))))
        actions = [a for a in actions if not isinstance(a, STORE_ACTIONS)]
    return replace(s, clock=replace(s.clock, now=now)), [*retry, *actions]


# --- where a tracked job begins ---------------------------------------------------------------------


def placed(job_id: int, name: str, limits: Limits, job_state: JobState, gpus: tuple[int, ...], *, number: int = 0,
           restarts: int = 0, class_counts: dict[str, int] | None = None, backoff_level: int = 0,
           no_progress_streak: int = 0, backoff_remaining: float = 0.0, staged: bool = False,
           now: float = 0.0, generation: int | None = None, history: tuple[PastAttempt, ...] = ()) -> TrackedJob:
    """A job without a live attempt: READY, or in BACKOFF while `backoff_remaining` > 0 — a job just
    placed by the scheduler, or one found starting/restarting when the daemon starts (its stored
    remaining delay resumes). `history`: its ended attempts, as the crash-loop fallback reads them."""
    ledger = Ledger(job_state=job_state, gpus=gpus, number=number, restarts=restarts,
                    class_counts=tuple(sorted((class_counts or {}).items())), backoff_level=backoff_level,
                    no_progress_streak=no_progress_streak, backoff_remaining=max(0.0, backoff_remaining),
                    staged=staged, history=history)
    return TrackedJob(job=Identity(job_id, name, limits), phase=Phase.BACKOFF if backoff_remaining > 0 else Phase.READY,
                      ledger=ledger, clock=PhaseClock(now=now, since=now), share=Share(generation=generation))


def adopted(base: TrackedJob, number: int, started_wall: float, resumed_from_step: int | None, now: float, *,
            ran_seconds: float = 0.0, stop_cause: str | None = None, ended: LauncherExited | None = None,
            generation: int | None = None, resumed_from: str | None = None) -> Result:
    """A job whose attempt was open when the previous daemon died (or re-exec'd itself), taken on
    as it is: jobs outlive the daemon.

    - `ended` is None: the attempt still runs. It is adopted as it is: RUNNING, heartbeat, hang
      detection and cancel go on (the hang clock restarts at the first heartbeat seen); if the old
      daemon was stopping it (`stop_cause` cancel, hang, daemon-stop, gpu-fault, peer-restart:
      stored before its SIGTERM), the stop goes on, with a fresh grace and no second SIGTERM.
    - It ended while no daemon watched (`ended`: the exit the store or its monitor recorded, or
      `lost`): decided on that exit as if the daemon had never gone — a job that exited 0 meanwhile
      succeeded and is never run again; a lost one is relaunched from its checkpoint, not counted.
    `ran_seconds`: how long the attempt had run before (wall clock), so its run length still counts.
    `generation`: across hosts, the round the attempt joined (stored with its row).
    """
    cause = StopCause(stop_cause) if stop_cause else None
    s = replace(base, ledger=replace(base.ledger, job_state=JobState.RUNNING, number=number),
                clock=PhaseClock(now=now, since=now), share=Share(generation=generation),
                attempt=Attempt(resume=Resume(resumed_from, resumed_from_step), started=now - max(0.0, ran_seconds),
                                started_wall=started_wall, stop_cause=cause))
    if ended is not None:
        s, actions = stopping.launcher_exited(s, ended, now)
        return s, [Log("adopted_after_restart", "info", (("exited", True), ("lost", ended.lost))), *actions]
    if cause in CONTINUED_STOPS:
        return term(s, now), [Log("adopted_after_restart", "info", (("exited", False), ("stopping", cause)))]
    s = replace(s, attempt=replace(s.attempt, stop_cause=None))
    return to(s, Phase.RUNNING, now), [Log("adopted_after_restart", "info", (("exited", False),))]
