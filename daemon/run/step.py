"""The supervisor's state machine: one job between "GPUs allocated" and its next resting state.

PURE. Every live job the supervisor tracks (a starting, running or restarting one) is a `JobStep`
value, and advances only by

    step(state, observation, now) -> (new state, actions)

`now` is `time.monotonic()`: every delay (grace, hang, backoff, deadlines of slow work) is measured
on it, and a backoff is persisted as the seconds that remain, never as a wall-clock deadline, so a
clock jump neither fires nor freezes a restart. Observations say what the executor saw (a tick, a
heartbeat, the launcher's exit, a checkpoint found, a spawn's result, a cancel …); actions say what
it must do (find a checkpoint, spawn, signal, dump stacks, record the attempt's end …) and it feeds
each result back as another observation. So every edge is tested by scripting observations, with
no processes (tests/unit/test_step.py) — supervisord's per-tick `transition()` and torch elastic's
"the monitor returns a result, one loop decides" are the models.

Phases of the tracked job (the stored `JobState` in brackets):

    BACKOFF [restarting] --remaining reaches 0--> READY [restarting]
    READY [queued|starting|restarting] --Go--> STAGING | PREPARING [starting]
    STAGING --copier done--> PREPARING;  PREPARING --checkpoint found--> RUNNING [running]
    RUNNING --hang--> DUMPING --stacks dumped--> STOPPING;  RUNNING --cancel/daemon stop/GPU fault--> STOPPING
    STOPPING --grace over--> SIGKILL (still STOPPING);  RUNNING|DUMPING|STOPPING --launcher exited--> EXITED
    EXITED --all processes gone--> DIAGNOSING --diagnosis (or its deadline)--> record the end:
        BACKOFF (a restart) | DONE (succeeded / failed / cancelled, or the daemon stops)

A job across hosts (limits.gang) runs each attempt in a generation the hosts share
(userfs/gang_dir.py): RUNNING --another host began a newer one (GangSeen)--> STOPPING, and before
its end is recorded DIAGNOSING --> AGREEING --the others told (GenerationAgreed)--> record the end,
on this host's decision if it began the next generation, else on the host's that did.

Jobs outlive the daemon: at its start, an attempt a previous daemon left open enters (`adopted`) as
RUNNING if it still runs, STOPPING if that daemon was stopping it, EXITED if it ended meanwhile
(the exit its monitor recorded, or "lost" without one).

Store writes are actions too, and each step writes at most one transaction: `FinishAttempt` ends
the attempt row and moves the job together (only `Spawn` writes twice: its row before exec, so a crash
leaves the attempt id its processes are found by, then the pgid and "running"). What adoption after a
daemon restart needs is written when it happens: why the daemon stops an attempt (`RecordStop`: a
cancel, a hang, its own stop or restart), the launcher's exit
(`RecordExit`). A write the store cannot take now (disk full, locked) comes back as a retryable
`ActionFailed` and is re-emitted on the next tick, later writes queued behind it; a job with a write
pending is never relaunched.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from spx.daemon.contract.worker_env import EXIT_PREEMPTED
from spx.daemon.core.causes import NOT_THE_JOBS, signal_name
from spx.daemon.run.policy import AttemptOutcome, Decision, decide
from spx.daemon.run.step_types import (
    STORE_ACTIONS,
    Action,
    ActionFailed,
    ActivitySeen,
    AgreeGeneration,
    AllGone,
    CancelRequested,
    CheckpointFound,
    DaemonStopping,
    Diagnose,
    Diagnosed,
    DumpStacks,
    FindCheckpoint,
    FinishAttempt,
    GangSeen,
    GangTurn,
    GenerationAgreed,
    Go,
    GpuFault,
    HeartbeatSeen,
    JobStep,
    LauncherExited,
    Limits,
    Log,
    MarkStarting,
    Note,
    Observation,
    Phase,
    RecordExit,
    RecordStop,
    RemoveCgroup,
    SaveBackoff,
    SignalKill,
    SignalTerm,
    Spawn,
    Spawned,
    StacksDumped,
    StagingEnded,
    StartStaging,
    StopStaging,
    Tick,
)
from spx.daemon.state.states import JobState

# After the launcher exits on its own, leftovers (escaped grandchildren) get SIGKILL every second;
# past this long a warning says so, and the attempt is never declared over while any remain.
LEFTOVER_WARN_SECONDS = 10.0
KILL_REPEAT_SECONDS = 1.0
# Slow work off the loop comes back by these deadlines, or is given up on.
DUMP_DEADLINE_SECONDS = 60.0
DIAGNOSE_DEADLINE_SECONDS = 30.0
CHECKPOINT_DEADLINE_SECONDS = 120.0
# After its "finished" heartbeat (training done, final checkpoint complete) an attempt gets this long
# to exit; one that does not (seen: torch's gloo teardown deadlocking in the interpreter's exit) is a
# hang at exit — stacks dumped, killed — and succeeded: its work is done.
FINISHED_EXIT_SECONDS = 60.0
# Without `restart.hang_timeout_seconds` the hang timeout is calibrated from the attempt's own step
# intervals (as seen through the heartbeat, so at most one per second): max(floor, factor × p99 of
# the recent ones, 2 × the longest), never above the ceiling, and the ceiling until enough were seen.
# The first two step changes are warm-up (compile, first batches, a resume's load) and never count,
# nor does an interval that spans a checkpoint (heartbeat status "checkpointing").
AUTO_HANG_FLOOR_SECONDS = 10.0
AUTO_HANG_FACTOR = 5.0
AUTO_HANG_CEILING_SECONDS = 900.0
AUTO_HANG_MIN_INTERVALS = 5
STEP_INTERVALS_KEPT = 64
# A backoff countdown is stored this often (a daemon SIGKILLed mid-backoff loses at most this much).
BACKOFF_SAVE_SECONDS = 15.0
# Stop causes that are not the job's fault: its attempt does not count as a restart. "lost": an
# adopted attempt whose monitor is gone without a record of how it ended.
# "peer-restart": across hosts, stopped because another host began a newer generation (that host
# counted the failure, if it was one).
DAEMON_CAUSES = tuple(NOT_THE_JOBS)
# Across hosts, telling the others that an attempt ended comes back by then, or the end is recorded
# on this host's own decision alone (the others see it stop, and follow at their next beat or join).
AGREE_DEADLINE_SECONDS = 30.0




# --- constructors: where a tracked job begins --------------------------------------------------------


def placed(job_id: int, name: str, limits: Limits, job_state: JobState, gpus: tuple[int, ...], *, number: int = 0,
           restarts: int = 0, class_counts: dict[str, int] | None = None, backoff_level: int = 0,
           no_progress_streak: int = 0, backoff_remaining: float = 0.0, staged: bool = False,
           now: float = 0.0, generation: int | None = None) -> JobStep:
    """A job without a live attempt: READY, or in BACKOFF while `backoff_remaining` > 0 — a job just
    placed by the scheduler, or one found starting/restarting when the daemon starts (its stored
    remaining delay resumes)."""
    phase = Phase.BACKOFF if backoff_remaining > 0 else Phase.READY
    return JobStep(job_id=job_id, name=name, limits=limits, phase=phase, job_state=job_state, gpus=gpus,
                   number=number, restarts=restarts, class_counts=tuple(sorted((class_counts or {}).items())),
                   backoff_level=backoff_level,
                   no_progress_streak=no_progress_streak, backoff_remaining=max(0.0, backoff_remaining),
                   clock=now, phase_since=now, staged=staged, generation=generation)


def adopted(base: JobStep, number: int, started_wall: float, resumed_from_step: int | None, now: float, *,
            ran_seconds: float = 0.0, stop_cause: str | None = None,
            ended: LauncherExited | None = None, generation: int | None = None) -> tuple[JobStep, list[Action]]:
    """A job whose attempt was open when the previous daemon died (or re-exec'd itself), taken on
    as it is: jobs outlive the daemon.

    - `ended` is None: the attempt still runs. It is adopted as it is: RUNNING, heartbeat, hang
      detection and cancel go on (the hang clock restarts at the first heartbeat seen); if the old
      daemon was stopping it (`stop_cause` cancel, hang or daemon-stop: stored before its SIGTERM),
      the stop goes on, with a fresh grace and no second SIGTERM.
    - It ended while no daemon watched (`ended`: the exit the store or its monitor recorded, or
      `lost`): decided on that exit as if the daemon had never gone — a job that exited 0 meanwhile
      succeeded and is never run again; a lost one is relaunched from its checkpoint, not counted.
    `ran_seconds`: how long the attempt had run before (wall clock), so its run length still counts.
    `generation`: across hosts, the round the attempt joined (stored with its row).
    """
    state = replace(base, job_state=JobState.RUNNING, number=number, started=now - max(0.0, ran_seconds),
                    started_wall=started_wall, resumed_from_step=resumed_from_step, clock=now, phase_since=now,
                    stop_cause=stop_cause, generation=generation)
    if ended is not None:
        state, actions = _launcher_exited(state, ended, now)
        return state, [Log("adopted_after_restart", "info", (("exited", True), ("lost", ended.lost))), *actions]
    if stop_cause in ("cancel", "hang", "daemon-stop", "gpu-fault", "peer-restart"):
        return _term(state, now), [Log("adopted_after_restart", "info", (("exited", False), ("stopping", stop_cause)))]
    return _to(state, Phase.RUNNING, now, stop_cause=None), [Log("adopted_after_restart", "info", (("exited", False),))]


# --- the step ---------------------------------------------------------------------------------------


def step(s: JobStep, obs: Observation, now: float) -> tuple[JobStep, list[Action]]:
    """The only place a tracked job changes. Returns the new state and what to do."""
    elapsed = max(0.0, now - s.clock)
    s = replace(s, clock=now)
    if isinstance(obs, Tick):
        # Writes the store refused are re-emitted first, in their order.
        retry = list(s.retry)
        s, actions = _tick(replace(s, retry=()), elapsed, now)
        return s, retry + actions
    waiting = bool(s.retry)
    match obs:
        case ActionFailed():
            s, actions = _action_failed(s, obs, now)
        case CancelRequested():
            s, actions = _cancel(s, obs, now)
        case DaemonStopping():
            s, actions = _daemon_stopping(s, now)
        case _:
            handler = _HANDLERS.get((s.phase, type(obs)))
            # None: a result for something no longer asked (a checkpoint found for a job cancelled
            # meanwhile, stacks dumped after the attempt ended): nothing to do.
            s, actions = handler(s, obs, now) if handler is not None else (s, [])
    if waiting:
        # A write is pending: later writes queue behind it, so the store sees them in order (a spawn
        # never runs before its job is marked starting).
        later = tuple(a for a in actions if isinstance(a, STORE_ACTIONS))
        s = replace(s, retry=(*s.retry, *later))
        actions = [a for a in actions if not isinstance(a, STORE_ACTIONS)]
    return s, actions


def hang_timeout(s: JobStep) -> float:
    """Seconds without step progress that make this attempt hung (see AUTO_HANG_*)."""
    if s.beat_status == "finished":
        return min(s.limits.hang_timeout_seconds or AUTO_HANG_CEILING_SECONDS, FINISHED_EXIT_SECONDS)
    if s.limits.hang_timeout_seconds is not None:
        return s.limits.hang_timeout_seconds
    if len(s.step_intervals) < AUTO_HANG_MIN_INTERVALS or s.beat_status == "checkpointing":
        return AUTO_HANG_CEILING_SECONDS
    ordered = sorted(s.step_intervals)
    p99 = ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]
    return min(AUTO_HANG_CEILING_SECONDS, max(AUTO_HANG_FLOOR_SECONDS, AUTO_HANG_FACTOR * p99, 2 * s.longest_interval))


def _to(s: JobStep, phase: Phase, now: float, **changes: object) -> JobStep:
    return replace(s, phase=phase, phase_since=now, **changes)


def _tick(s: JobStep, elapsed: float, now: float) -> tuple[JobStep, list[Action]]:
    since = now - s.phase_since
    if s.phase is Phase.BACKOFF:
        # backoff → ready: the remaining delay counts down in monotonic time.
        remaining = max(0.0, s.backoff_remaining - elapsed)
        if remaining <= 0:
            return _to(s, Phase.READY, now, backoff_remaining=0.0), []
        # backoff → backoff: the countdown is stored every BACKOFF_SAVE_SECONDS, so a daemon killed
        # (not stopped) during a long backoff resumes it with at most that much added, and one
        # killed more often than the whole delay still gets the job relaunched.
        if int(remaining // BACKOFF_SAVE_SECONDS) != int(s.backoff_remaining // BACKOFF_SAVE_SECONDS):
            return replace(s, backoff_remaining=remaining), [SaveBackoff(remaining)]
        return replace(s, backoff_remaining=remaining), []
    if s.phase is Phase.PREPARING and not s.checkpoint_found and since > CHECKPOINT_DEADLINE_SECONDS:
        # preparing → done (failed): checkpoint discovery never answered (a hung network volume).
        return _fail_before_attempt(s, f"checkpoint discovery did not finish in {CHECKPOINT_DEADLINE_SECONDS:.0f} s", now)
    if (s.phase is Phase.RUNNING and s.last_progress is None and s.last_activity is not None and s.stop_cause is None
            and now - s.last_activity > (s.limits.hang_timeout_seconds or AUTO_HANG_CEILING_SECONDS)):
        # running → dumping: no heartbeat to go by, but its GPUs computed nothing and its log
        # stayed silent for the hang timeout (a hung collective, a deadlock): a hang all the same.
        idle = now - s.last_activity
        return _to(s, Phase.DUMPING, now, hang_idle=idle, stop_cause="hang"), [
            RecordStop(s.number, "hang"),
            Log("hang_detected", "warning", (("idle_seconds", round(idle, 1)), ("step", None), ("without_heartbeat", True))),
            Note(f"hang detected: no heartbeat, GPUs idle and log silent for {idle:.0f} s; dumping stacks, then SIGTERM"),
            DumpStacks(s.number),
        ]
    if s.phase is Phase.RUNNING and s.last_progress is not None and s.stop_cause is None:
        idle = now - s.last_progress
        finished = s.beat_status == "finished"
        if idle > hang_timeout(s):
            # running → dumping: no step progress for the hang timeout; stacks first, then the stop.
            return _to(s, Phase.DUMPING, now, hang_idle=idle, stop_cause="hang"), [
                RecordStop(s.number, "hang"),
                Log("hang_detected", "warning", (("idle_seconds", round(idle, 1)), ("step", s.last_step),
                                                  ("timeout_seconds", round(hang_timeout(s), 1)),
                                                  ("after_finished", finished))),
                Note(f"hang detected: not exited {idle:.0f} s after training finished; dumping stacks, then SIGTERM"
                     if finished else
                     f"hang detected: no step progress for {idle:.0f} s (at step {s.last_step}); dumping stacks, then SIGTERM"),
                DumpStacks(s.number),
            ]
    if s.phase is Phase.DUMPING and since > DUMP_DEADLINE_SECONDS:
        # dumping → stopping: the dump did not come back in time; the stop does not wait for it.
        return _term(s, now), [Log("stack_dump_timed_out", "warning"), SignalTerm()]
    grace_over = s.term_at is not None and now - s.term_at >= s.limits.grace_seconds
    if s.phase is Phase.STOPPING and grace_over and (s.kill_at is None or now - s.kill_at >= KILL_REPEAT_SECONDS):
        # stopping: the grace is over → SIGKILL (repeated each second while anything remains).
        first = s.kill_at is None
        return replace(s, kill_at=now), [*([Note(f"grace of {s.limits.grace_seconds:.0f} s over; SIGKILL")] if first else []),
                                         SignalKill()]
    if s.phase is Phase.EXITED:
        actions: list[Action] = []
        if s.kill_at is None or now - s.kill_at >= KILL_REPEAT_SECONDS:
            s = replace(s, kill_at=now)
            actions.append(SignalKill())
        if now - (s.warned_at or s.phase_since) > LEFTOVER_WARN_SECONDS:
            s = replace(s, warned_at=now)
            actions.append(Log("leftover_processes", "warning"))
        return s, actions
    if s.phase is Phase.DIAGNOSING and since > DIAGNOSE_DEADLINE_SECONDS:
        # diagnosing → recorded: the diagnosis did not come back; the attempt ends without it.
        return _record_end(s, now)
    if s.phase is Phase.AGREEING and since > AGREE_DEADLINE_SECONDS:
        # agreeing → recorded: the shared dir did not answer; this host's own decision stands.
        s2, actions = _record_end(replace(s, agreed=True), now)
        return s2, [Log("generation_not_agreed", "warning", (("detail", f"no answer in {AGREE_DEADLINE_SECONDS:.0f} s"),)),
                    *actions]
    return s, []


def _term(s: JobStep, now: float, **changes: object) -> JobStep:
    return _to(s, Phase.STOPPING, now, term_at=now, **changes)


# --- READY → the attempt ------------------------------------------------------------------------------


def _go(s: JobStep, obs: Go, now: float) -> tuple[JobStep, list[Action]]:
    actions: list[Action] = []
    if s.job_state is not JobState.STARTING:
        # ready → starting: queued (GPUs allocated) or restarting (backoff over, GPUs free).
        reason = "relaunching" if s.job_state is JobState.RESTARTING else ("GPUs allocated" if obs.gpus else "starting")
        actions.append(MarkStarting(obs.gpus, reason))
    s = replace(s, job_state=JobState.STARTING, gpus=obs.gpus)
    if s.limits.stages and not s.staged:
        # ready → staging: the working set is copied before the first attempt.
        return _to(s, Phase.STAGING, now), [*actions, StartStaging()]
    # ready → preparing: files made and the checkpoint found off the loop.
    return _to(s, Phase.PREPARING, now, number=s.number + 1, checkpoint_found=False), [*actions, FindCheckpoint(s.number + 1)]


def _staging_ended(s: JobStep, obs: StagingEnded, now: float) -> tuple[JobStep, list[Action]]:
    if obs.ok:
        # staging → preparing.
        s = replace(s, staged=True)
        return _to(s, Phase.PREPARING, now, number=s.number + 1, checkpoint_found=False), [Log("staging_done", "info", (("detail", obs.reason),)),
                                                                   FindCheckpoint(s.number + 1)]
    # staging → done (failed): the copier failed; no attempt ran.
    return _finish_without_attempt(s, JobState.FAILED, obs.reason, now, Log("staging_failed", "error", (("reason", obs.reason),)))


def _checkpoint_found(s: JobStep, obs: CheckpointFound, now: float) -> tuple[JobStep, list[Action]]:
    if obs.number != s.number:
        return s, []
    if obs.final is not None and obs.final.final is not None:
        # preparing → done: across hosts, the job already ended for good on another host (failed,
        # cancelled): it ends here too, with that host's reason.
        return _finish_without_attempt(s, obs.final.final, _on_host(obs.final), now,
                                       Log("ended_on_another_host", "warning", (("host", obs.final.by),
                                                                                ("generation", obs.final.gen))))
    if obs.generation is not None:
        s = replace(s, generation=obs.generation)
    # preparing → running (once Spawned comes back): spawn from the checkpoint found.
    streak = s.no_progress_streak
    if s.number > 1 and obs.step is not None and (s.resumed_from_step is None or obs.step > s.resumed_from_step):
        # The previous attempt left a newer checkpoint than it started from: it made progress, even
        # if no heartbeat said so (a script of its own). Without this a script that trains for
        # minutes and then keeps crashing on a bad newest checkpoint would be failed as a crash loop
        # one attempt before the crash-loop fallback (run/resume_fallback.py) resumes an older one.
        streak = 0
    return replace(s, resumed_from_step=obs.step, checkpoint_found=True, no_progress_streak=streak), [
        Spawn(s.number, obs.path, obs.step)]


def _spawned(s: JobStep, obs: Spawned, now: float) -> tuple[JobStep, list[Action]]:
    # preparing → running: the launcher exec'd; a fresh attempt's clocks start.
    return _to(s, Phase.RUNNING, now, job_state=JobState.RUNNING, started=now, started_wall=obs.wall,
               last_step=None, last_progress=None, last_activity=None, step_changes=0, step_intervals=(), longest_interval=0.0,
               last_beat_time=0.0, beat_status=None, stop_cause=None, gpu_fault=None,
               hang_idle=None, term_at=None, kill_at=None, exited_at=None, exited_wall=None, warned_at=None, exit_code=None,
               exit_signal=None, root_cause=None, oom=False, peer=None, agreed=False, missing_host=None), []


# --- the running attempt ------------------------------------------------------------------------------


def _heartbeat(s: JobStep, obs: HeartbeatSeen, now: float) -> tuple[JobStep, list[Action]]:
    # A beat counts only if written during this attempt, and once.
    if obs.time < s.started_wall or obs.time == s.last_beat_time:
        return s, []
    finishing = obs.status == "finished" and s.beat_status != "finished"
    was_checkpointing = s.beat_status == "checkpointing"
    s = replace(s, last_beat_time=obs.time, beat_status=obs.status)
    if s.last_step is None or obs.step != s.last_step or finishing:
        # running: progress — the hang clock restarts (it starts at the first heartbeat: scripts
        # that write none are supervised on exit status alone), and the interval is learned.
        if s.last_progress is not None and obs.step != s.last_step:
            s = replace(s, step_changes=s.step_changes + 1)
            if s.step_changes > 2 and not was_checkpointing:
                interval = now - s.last_progress
                s = replace(s, step_intervals=(*s.step_intervals, interval)[-STEP_INTERVALS_KEPT:],
                            longest_interval=max(s.longest_interval, interval))
        s = replace(s, last_step=obs.step, last_progress=now)
    return s, []


def _activity(s: JobStep, obs: ActivitySeen, now: float) -> tuple[JobStep, list[Action]]:
    # running, no heartbeat progress: GPUs computing or the log growing restart the idle clock
    # (it starts at the first look after the spawn).
    if obs.active or s.last_activity is None:
        return replace(s, last_activity=now), []
    return s, []


def _gang_seen(s: JobStep, obs: GangSeen, now: float) -> tuple[JobStep, list[Action]]:
    turn = obs.turn
    s = replace(s, missing_host=obs.missing)
    if (s.generation is None or turn.gen <= s.generation or s.stop_cause is not None
            or s.beat_status == "finished"):
        # Its own round still (or already being stopped, or training done here): nothing new.
        return s, []
    # running → stopping: another host ended this round (its share failed, or was stopped): this
    # host's share stops too (SIGTERM, the grace) and follows that host's decision, uncounted.
    return _term(s, now, stop_cause="peer-restart", peer=turn), [
        RecordStop(s.number, "peer-restart"),
        Log("peer_restart", "warning", (("generation", turn.gen), ("host", turn.by), ("reason", turn.reason),
                                        ("final", turn.final.value if turn.final else None))),
        Note(f"another host of the job began generation {turn.gen} ({_on_host(turn)}); "
             f"SIGTERM, {s.limits.grace_seconds:.0f} s grace, then " + ("the job ends" if turn.final else
                                                                       "a relaunch into the new generation")),
        SignalTerm()]


def _on_host(turn: GangTurn) -> str:
    return f"{turn.reason or 'no reason given'} on host {turn.by or '(unknown)'}"


def _stacks_dumped(s: JobStep, obs: StacksDumped, now: float) -> tuple[JobStep, list[Action]]:
    if obs.number != s.number:
        return s, []
    # dumping → stopping: stacks are in the log; SIGTERM, the grace, then SIGKILL.
    return _term(s, now), [SignalTerm()]


def _launcher_exited(s: JobStep, obs: LauncherExited, now: float) -> tuple[JobStep, list[Action]]:
    # running|dumping|stopping → exited: the launcher is gone; anything left of the attempt is a
    # leftover and gets SIGKILL at once (and every second until none remain).
    cause = s.stop_cause
    if obs.lost or (not obs.launched and obs.code != 0):
        # How it ended is unknown (its monitor died with it), or the exit is the shim's, not the
        # job's (the shim never exits 0 without exec'ing the job): relaunched, not counted.
        cause = cause or "lost"
    elif obs.stopped and cause is None:
        # A daemon stopped it and died before it could store why: not the job's fault.
        cause = "daemon-restart"
    s = _to(s, Phase.EXITED, now, exit_code=obs.code, exit_signal=obs.signal, exited_at=now, kill_at=now,
            stop_cause=cause, exited_wall=obs.ended_wall)
    if obs.code is None and obs.signal is None:
        return s, [SignalKill()]  # nothing known to store
    return s, [SignalKill(), RecordExit(s.number, obs.code, obs.signal, s.stop_cause)]


def _all_gone(s: JobStep, obs: AllGone, now: float) -> tuple[JobStep, list[Action]]:
    # exited → diagnosing: nothing of the attempt runs; its cgroup goes, and a failure is diagnosed
    # off the loop (root cause from the log tail, the kernel's OOM record).
    failed = s.exit_code != 0 and s.stop_cause is None
    want_root = s.exit_code != 0 and s.stop_cause not in ("cancel", *DAEMON_CAUSES)
    s = _to(s, Phase.DIAGNOSING, now)
    if not (failed or want_root):
        # exited → recorded: nothing to diagnose (success, or a stop the daemon made).
        s2, actions = _record_end(s, now)
        return s2, [RemoveCgroup(), *actions]
    return s, [RemoveCgroup(), Diagnose(s.number, root_cause=want_root, oom=failed)]


def _diagnosed(s: JobStep, obs: Diagnosed, now: float) -> tuple[JobStep, list[Action]]:
    if obs.number != s.number:
        return s, []
    # diagnosing → recorded.
    return _record_end(replace(s, root_cause=obs.root_cause, oom=obs.oom), now)


def _record_end(s: JobStep, now: float) -> tuple[JobStep, list[Action]]:
    """The attempt is over: decide (policy.decide) and write the end and the job's next state in one
    transaction. A restart goes to BACKOFF (or DONE if the daemon is stopping: the stored remaining
    delay resumes at the next start); anything else is terminal. Across hosts the end is first told
    to the other hosts (AGREEING): a failure begins the next generation, unless another host began
    it first, whose decision then applies here (not counted)."""
    s, d = _decide_end(s, now)
    if s.limits.gang and not s.agreed and s.generation is not None:
        return _agree(s, d, now)
    return _commit_end(s, d, now)


def _decide_end(s: JobStep, now: float) -> tuple[JobStep, Decision]:
    ran = now - (s.started if s.started is not None else now)
    finished_reason = None
    if s.beat_status == "finished" and s.stop_cause in ("lost", "hang"):
        # Its heartbeat says training finished (final checkpoint complete), but its exit is unknown
        # (lost) or it never exited (a hang at exit, killed): the job's work is done.
        finished_reason = ("training finished (heartbeat); it did not exit and was killed" if s.stop_cause == "hang"
                           else "training finished (heartbeat); its exit is unknown")
        s = replace(s, stop_cause=None, exit_code=0)
    if s.stop_cause == "gpu-fault" and s.gpu_fault:
        # The daemon saw the cause (the fatal XID); what the ranks printed as they died follows from it.
        s = replace(s, root_cause=s.gpu_fault + (f"; then {s.root_cause}" if s.root_cause else ""))
    if s.peer is not None and not (s.exit_code == 0 and (s.stop_cause is None or s.beat_status == "finished")):
        # Across hosts: another host began the next generation first; its decision is the job's.
        return s, _peer_decision(s, s.peer)
    code = s.exit_code
    progressed = s.progressed or (s.last_step is None and ran >= s.limits.healthy_seconds)
    if (s.missing_host is not None and not s.progressed and code != 0
            and s.stop_cause not in ("cancel", *DAEMON_CAUSES)):
        # Across hosts: this attempt trained no step while a host stayed away past the host timeout
        # (its agent waited as long at the rendezvous; a wait that long is no "healthy stretch"):
        # the job fails, naming that host.
        return s, Decision(JobState.FAILED, s.missing_host, "host-lost", backoff_level=s.backoff_level,
                           no_progress_streak=s.no_progress_streak + 1)
    outcome = AttemptOutcome(
        exit_code=code, signal=s.exit_signal, root_cause=s.root_cause,
        preempted=s.beat_status == "preempted" or code == EXIT_PREEMPTED,
        oom=s.oom, stop_cause=s.stop_cause, hang_seconds=s.hang_idle, gpu_fault=s.gpu_fault,
        progressed=progressed, ran_seconds=ran,
    )
    d = decide(outcome, s.limits.restart, s.restarts, s.backoff_level, s.no_progress_streak, s.limits.healthy_seconds,
               class_counts=dict(s.class_counts))
    if d.state is JobState.CANCELLED and s.cancelled_by:
        d = replace(d, reason=f"cancelled by {s.cancelled_by}")  # a user's decision, not a failure
    if finished_reason is not None and d.state is JobState.SUCCEEDED:
        d = replace(d, reason=finished_reason)
    return s, d


def _peer_decision(s: JobStep, turn: GangTurn) -> Decision:
    """What another host decided when it began `turn`, for this host's share: the same end, or a
    restart after the same delay — never counted here (that host counted it, once)."""
    if turn.final is not None:
        return Decision(turn.final, _on_host(turn), "peer-restart", backoff_level=s.backoff_level,
                        no_progress_streak=s.no_progress_streak)
    cap = s.limits.restart.backoff_seconds[1]
    return Decision(JobState.RESTARTING, f"restarted with the job's other hosts: {_on_host(turn)}", "peer-restart",
                    min(max(0.0, turn.delay), cap), s.backoff_level, s.no_progress_streak)


def _agree(s: JobStep, d: Decision, now: float) -> tuple[JobStep, list[Action]]:
    # diagnosing → agreeing: this host's share ended; unless it only followed another host (or
    # succeeded), its decision begins the next generation — if no other host's did first.
    bump = None
    if s.peer is None and d.state is not JobState.SUCCEEDED:
        counted = d.state is JobState.RESTARTING and s.stop_cause not in DAEMON_CAUSES
        bump = GangTurn(gen=(s.generation or 0) + 1, reason=d.reason, counted=counted, delay=d.delay_seconds,
                        final=d.state if d.state.terminal else None)
    return _to(s, Phase.AGREEING, now), [AgreeGeneration(s.number, s.generation, bump)]


def _agreed(s: JobStep, obs: GenerationAgreed, now: float) -> tuple[JobStep, list[Action]]:
    if obs.number != s.number:
        return s, []
    # agreeing → recorded: on this host's decision, or on the one another host took first.
    s = replace(s, agreed=True)
    if (not obs.won and obs.turn is not None and s.peer is None and s.generation is not None
            and obs.turn.gen > s.generation):
        s = replace(s, peer=obs.turn)
    return _record_end(s, now)


def _commit_end(s: JobStep, d: Decision, now: float) -> tuple[JobStep, list[Action]]:
    terminal = d.state.terminal
    finish = FinishAttempt(
        number=s.number, state=d.state, reason=d.reason, reason_class=d.reason_class, exit_code=s.exit_code,
        signal=s.exit_signal, max_step=s.last_step, root_cause=s.root_cause,
        backoff_remaining=d.delay_seconds, backoff_level=d.backoff_level, no_progress_streak=d.no_progress_streak,
        release_gpus=terminal, ended_wall=s.exited_wall,
    )
    counted = d.state is JobState.RESTARTING and s.stop_cause not in DAEMON_CAUSES and s.peer is None
    log = Log("attempt_ended", "info", (
        ("exit_code", s.exit_code), ("signal", signal_name(s.exit_signal) if s.exit_signal else None), ("reason", d.reason),
        ("next_state", d.state.value), ("delay_seconds", d.delay_seconds), ("last_step", s.last_step),
        ("root_cause", s.root_cause)))
    if counted and d.reason_class:
        counts = dict(s.class_counts)
        counts[d.reason_class] = counts.get(d.reason_class, 0) + 1
        s = replace(s, class_counts=tuple(sorted(counts.items())))
    s = replace(s, job_state=d.state, backoff_level=d.backoff_level, no_progress_streak=d.no_progress_streak,
                restarts=s.restarts + (1 if counted else 0), backoff_remaining=d.delay_seconds)
    if terminal or s.daemon_stopping:
        # recorded → done: terminal, or a restart the next daemon resumes.
        return _to(s, Phase.DONE, now), [finish, log]
    # recorded → backoff (→ ready at once when the delay is 0).
    return _to(s, Phase.BACKOFF if d.delay_seconds > 0 else Phase.READY, now), [finish, log]


# --- stops ---------------------------------------------------------------------------------------------


def _cancel(s: JobStep, obs: CancelRequested, now: float) -> tuple[JobStep, list[Action]]:
    note = Log("cancel_requested", "info", (("by", obs.by),))
    if s.phase in (Phase.BACKOFF, Phase.READY, Phase.PREPARING, Phase.STAGING):
        # backoff|ready|preparing|staging → done (cancelled): no process to stop.
        extra = [StopStaging()] if s.phase is Phase.STAGING else []
        return _finish_without_attempt(s, JobState.CANCELLED, f"cancelled by {obs.by}", now, note, *extra)
    if s.phase in (Phase.RUNNING, Phase.DUMPING):
        # running|dumping → stopping: SIGTERM; the workers get the grace to checkpoint. The cancel is
        # stored, so a daemon restarted before the end still cancels.
        return _term(replace(s, cancelled_by=obs.by), now, stop_cause="cancel"), [
            note, RecordStop(s.number, "cancel"),
            Note(f"cancelled by {obs.by}; SIGTERM, {s.limits.grace_seconds:.0f} s grace to checkpoint"), SignalTerm()]
    if s.phase in (Phase.STOPPING, Phase.EXITED, Phase.DIAGNOSING, Phase.AGREEING):
        # stopping|exited|diagnosing|agreeing: already on the way down; a cancel wins over any other cause
        # (the user's intent is that it ends for good). No second SIGTERM: torchrun's agent would
        # stop waiting for its workers' checkpoint.
        return replace(s, stop_cause="cancel", cancelled_by=obs.by), [note, RecordStop(s.number, "cancel")]
    return s, []


def _gpu_fault(s: JobStep, obs: GpuFault, now: float) -> tuple[JobStep, list[Action]]:
    if obs.gpu not in s.gpus or s.stop_cause is not None:
        # Not its GPU, or already being stopped (a cancel, a hang, an earlier fault): nothing new.
        return s, []
    # running|dumping → stopping: a fatal fault on one of its GPUs (quarantined already): SIGTERM and
    # the grace, like a hang's stop; class gpu-fault, restarted on healthy GPUs without counting.
    return _term(s, now, stop_cause="gpu-fault", gpu_fault=obs.detail), [
        RecordStop(s.number, "gpu-fault"),
        Log("gpu_fault_stop", "warning", (("gpu", obs.gpu), ("detail", obs.detail))),
        Note(f"gpu-fault: {obs.detail}; GPU {obs.gpu} quarantined; SIGTERM, {s.limits.grace_seconds:.0f} s grace, "
             "then a restart on healthy GPUs"),
        SignalTerm()]


def _daemon_stopping(s: JobStep, now: float) -> tuple[JobStep, list[Action]]:
    s = replace(s, daemon_stopping=True)
    if s.phase is Phase.BACKOFF:
        # backoff → done: the remaining delay is stored; the next daemon resumes it.
        return _to(s, Phase.DONE, now), [SaveBackoff(s.backoff_remaining)]
    if s.phase in (Phase.READY, Phase.PREPARING):
        # ready|preparing → done: nothing runs; the job stays starting/restarting for the next daemon.
        return _to(s, Phase.DONE, now), []
    if s.phase is Phase.STAGING:
        # staging → done: staging resumes where it stopped at the next start.
        return _to(s, Phase.DONE, now), [StopStaging()]
    if s.phase in (Phase.RUNNING, Phase.DUMPING):
        # running|dumping → stopping: SIGTERM and the grace, as for a cancel; resumed on next start.
        return _term(s, now, stop_cause="daemon-stop"), [
            RecordStop(s.number, "daemon-stop"),
            Note(f"the daemon is stopping; SIGTERM, {s.limits.grace_seconds:.0f} s grace; resumes on its next start"),
            SignalTerm()]
    return s, []


def _finish_without_attempt(s: JobStep, state: JobState, reason: str, now: float, *before: Action) -> tuple[JobStep, list[Action]]:
    finish = FinishAttempt(number=0, state=state, reason=reason, backoff_level=s.backoff_level,
                           no_progress_streak=s.no_progress_streak, release_gpus=True)
    return _to(replace(s, job_state=state), Phase.DONE, now), [*before, finish]


def _fail_before_attempt(s: JobStep, reason: str, now: float) -> tuple[JobStep, list[Action]]:
    return _finish_without_attempt(s, JobState.FAILED, reason, now, Log("launch_failed", "error", (("error", reason),)))


def _action_failed(s: JobStep, obs: ActionFailed, now: float) -> tuple[JobStep, list[Action]]:
    a = obs.action
    if obs.retry and isinstance(a, STORE_ACTIONS):
        # any phase: the store cannot take the write now; it is re-emitted on the next tick, and
        # the job is not relaunched until it is in.
        return replace(s, retry=(*s.retry, a)), [Log("store_write_deferred", "warning", (("error", obs.error),))]
    if isinstance(a, FindCheckpoint) and s.phase is Phase.PREPARING and a.number == s.number:
        # preparing → done (failed): the attempt's files cannot be made or read (the owner is gone,
        # a path is not theirs, discovery failed): no attempt can run.
        return _fail_before_attempt(s, f"cannot prepare the attempt: {obs.error}", now)
    if isinstance(a, Spawn) and s.phase is Phase.PREPARING and a.number == s.number:
        # preparing → done (failed): the launch itself failed; the attempt row ends with it.
        finish = FinishAttempt(number=s.number, state=JobState.FAILED, reason=f"launch failed: {obs.error}",
                               reason_class="launch", backoff_level=s.backoff_level,
                               no_progress_streak=s.no_progress_streak, release_gpus=True)
        return _to(replace(s, job_state=JobState.FAILED), Phase.DONE, now), [
            Log("launch_failed", "error", (("error", obs.error),)), finish]
    if isinstance(a, StartStaging) and s.phase is Phase.STAGING:
        # staging → done (failed): the copier could not be started.
        reason = f"staging failed: {obs.error}"
        return _finish_without_attempt(s, JobState.FAILED, reason, now, Log("staging_failed", "error", (("reason", reason),)))
    if isinstance(a, DumpStacks) and s.phase is Phase.DUMPING:
        # dumping → stopping: no stacks (py-spy failed); the stop goes on.
        return _term(s, now), [Log("stack_dump_failed", "warning", (("error", obs.error),)), SignalTerm()]
    if isinstance(a, Diagnose) and s.phase is Phase.DIAGNOSING:
        # diagnosing → recorded, without a diagnosis.
        return _record_end(s, now)
    if isinstance(a, AgreeGeneration) and s.phase is Phase.AGREEING and a.number == s.number:
        # agreeing → recorded on this host's own decision: the shared dir refused (the others see
        # the share stop, and follow at their next beat or join).
        s2, actions = _record_end(replace(s, agreed=True), now)
        return s2, [Log("generation_not_agreed", "warning", (("error", obs.error),)), *actions]
    if isinstance(a, FinishAttempt | MarkStarting | SaveBackoff):
        # A write the store refused for good (not a full disk: a bug, a broken row) — the job's
        # record cannot be trusted any more; it is given up on in memory, loudly.
        return _to(s, Phase.DONE, now), [Log("store_write_failed", "error", (("error", obs.error),
                                                                            ("action", type(a).__name__)))]
    # Signals, notes, cgroup removal: logged; escalation goes on by the clock.
    return s, [Log("action_failed", "warning", (("action", type(a).__name__), ("error", obs.error)))]


def fault(s: JobStep, error: str, now: float) -> tuple[JobStep, list[Action]]:
    """Containment: the daemon itself raised while handling this job (a bug, an unexpected error).
    The job fails with the error as its reason; whatever of its attempt still runs is killed."""
    reason = f"daemon error: {error}"
    actions: list[Action] = [Log("job_fault", "error", (("error", error),))]
    if s.phase.has_processes or s.phase in (Phase.DIAGNOSING, Phase.AGREEING):
        actions += [SignalKill(), RemoveCgroup()]
    if s.phase is Phase.STAGING:
        actions.append(StopStaging())
    actions.append(FinishAttempt(number=s.number if (s.phase.has_processes or s.phase in (Phase.DIAGNOSING, Phase.AGREEING)) else 0,
                                 state=JobState.FAILED, reason=reason, reason_class="daemon-error",
                                 exit_code=s.exit_code, signal=s.exit_signal, max_step=s.last_step,
                                 backoff_level=s.backoff_level, no_progress_streak=s.no_progress_streak,
                                 release_gpus=True))
    return _to(replace(s, job_state=JobState.FAILED, retry=()), Phase.DONE, now), actions


_HANDLERS: dict[tuple[Phase, type], Callable[..., tuple[JobStep, list[Action]]]] = {
    (Phase.READY, Go): _go,
    (Phase.STAGING, StagingEnded): _staging_ended,
    (Phase.PREPARING, CheckpointFound): _checkpoint_found,
    (Phase.PREPARING, Spawned): _spawned,
    **{(p, HeartbeatSeen): _heartbeat for p in (Phase.RUNNING, Phase.DUMPING, Phase.STOPPING, Phase.EXITED)},
    (Phase.RUNNING, ActivitySeen): _activity,
    (Phase.DUMPING, StacksDumped): _stacks_dumped,
    **{(p, GpuFault): _gpu_fault for p in (Phase.RUNNING, Phase.DUMPING)},
    **{(p, LauncherExited): _launcher_exited for p in (Phase.RUNNING, Phase.DUMPING, Phase.STOPPING)},
    (Phase.EXITED, AllGone): _all_gone,
    (Phase.DIAGNOSING, Diagnosed): _diagnosed,
    (Phase.RUNNING, GangSeen): _gang_seen,
    (Phase.AGREEING, GenerationAgreed): _agreed,
}

