"""The machine's edges that stop an attempt and see it gone: a cancel, a GPU fault, a worker's death
(killed at once when there is no checkpoint to wait for), a lease another host took, the daemon's own stop, a hang's stack dump coming back (or not); SIGTERM, the grace, SIGKILL; the launcher's exit,
the leftovers killed until none remain, then the diagnosis or the record of the end (ending.py).
A stop's cause is stored before its SIGTERM (RecordStop): a daemon restarted meanwhile goes on with
it and never counts it as the job's failure. PURE."""

from __future__ import annotations

from dataclasses import replace

from spx.daemon.core.causes import NOT_THE_JOBS, ReasonClass, StopCause
from spx.daemon.lifecycle.actions import (
    Diagnose,
    Log,
    Note,
    RecordExit,
    RecordStop,
    RemoveCgroup,
    SaveBackoff,
    SignalKill,
    SignalTerm,
    Spawn,
    StopStaging,
)
from spx.daemon.lifecycle.ending import handed_over, record_end
from spx.daemon.lifecycle.moves import Result, finish_without_attempt, term, to, with_attempt, with_ledger
from spx.daemon.lifecycle.observations import (
    AllGone,
    CancelRequested,
    DaemonStopping,
    GpuFault,
    LauncherExited,
    LeaseLost,
    ReplayDiffered,
    StacksDumped,
    Tick,
    WorkerDied,
)
from spx.daemon.lifecycle.record import Phase, TrackedJob
from spx.daemon.state.states import JobState

# After the launcher exits on its own, leftovers (escaped grandchildren) get SIGKILL every second;
# past this long a warning says so, and the attempt is never declared over while any remain.
LEFTOVER_WARN_SECONDS = 10.0
KILL_REPEAT_SECONDS = 1.0
# A hang's stack dump comes back this long after it started, or the stop does not wait for it.
DUMP_DEADLINE_SECONDS = 60.0


def _without_launch(s: TrackedJob) -> TrackedJob:
    """A launch still waiting for its row (a Spawn the store refused) is not made any more."""
    return replace(s, pending=tuple(a for a in s.pending if not isinstance(a, Spawn)))


def cancel(s: TrackedJob, obs: CancelRequested, now: float) -> Result:
    note = Log("cancel_requested", "info", (("by", obs.by),))
    reason = f"cancelled by {obs.by}"
    launching = s.phase is Phase.PREPARING and s.clock.answered
    if launching and s.attempt.stop_cause is StopCause.CANCEL:
        return s, [note]  # cancelled already, stopped as its launch lands
    if launching and not any(isinstance(a, Spawn) for a in s.pending):
        # preparing (launching) → preparing, cancelled: the launch is under way off the loop and its
        # processes may start at any moment. The job keeps its GPUs until the launch lands and is
        # killed (starting.spawned), or fails, so no other job is placed on GPUs it may still take.
        s = with_attempt(s, stop_cause=StopCause.CANCEL, cancelled_by=obs.by)
        return s, [note, RecordStop(s.number, StopCause.CANCEL), Note(f"{reason} during its launch: stopped as it lands")]
    if s.phase in (Phase.BACKOFF, Phase.READY, Phase.PREPARING, Phase.STAGING):
        # backoff|ready|preparing|staging → done (cancelled): no process to stop (a launch the store
        # has not yet taken the row of is not made any more: its row, made or not, is ended).
        extra = [StopStaging()] if s.phase is Phase.STAGING else []
        return finish_without_attempt(_without_launch(s), JobState.CANCELLED, reason, now, note, *extra,
                                      number=s.number if launching else 0)
    if s.phase in (Phase.RUNNING, Phase.DUMPING):
        # running|dumping → stopping: SIGTERM; the workers get the grace to checkpoint. The cancel is
        # stored, so a daemon restarted before the end still cancels.
        return term(s, now, StopCause.CANCEL, cancelled_by=obs.by), [
            note, RecordStop(s.number, StopCause.CANCEL),
            Note(f"{reason}; SIGTERM, {s.limits.grace_seconds:.0f} s grace to checkpoint"), SignalTerm()]
    if s.phase in (Phase.STOPPING, Phase.EXITED, Phase.DIAGNOSING, Phase.AGREEING):
        # stopping|exited|diagnosing|agreeing: already on the way down; a cancel wins over any other cause
        # (the user's intent is that it ends for good). No second SIGTERM: torchrun's agent would
        # stop waiting for its workers' checkpoint.
        return with_attempt(s, stop_cause=StopCause.CANCEL, cancelled_by=obs.by), [
            note, RecordStop(s.number, StopCause.CANCEL)]
    return s, []


def gpu_fault(s: TrackedJob, obs: GpuFault, now: float) -> Result:
    if obs.gpu not in s.ledger.gpus or s.attempt.stop_cause is not None:
        # Not its GPU, or already being stopped (a cancel, a hang, an earlier fault): nothing new.
        return s, []
    # running|dumping → stopping: a fatal fault on one of its GPUs (quarantined already): SIGTERM and
    # the grace, like a hang's stop; class gpu-fault, restarted on healthy GPUs without counting.
    return term(s, now, StopCause.GPU_FAULT, gpu_fault=obs.detail), [
        RecordStop(s.number, StopCause.GPU_FAULT),
        Log("gpu_fault_stop", "warning", (("gpu", obs.gpu), ("detail", obs.detail))),
        Note(f"gpu-fault: {obs.detail}; GPU {obs.gpu} quarantined; SIGTERM, {s.limits.grace_seconds:.0f} s grace, "
             "then a restart on healthy GPUs"),
        SignalTerm()]


def worker_died(s: TrackedJob, obs: WorkerDied, now: float) -> Result:
    what = obs.worker.describe()
    log = Log("worker_died", "warning", (("pid", obs.worker.pid), ("rank", obs.worker.rank),
                                         ("exit_code", obs.worker.code), ("signal", obs.worker.signal)))
    a = s.attempt
    jit_possible = a.beat_status is not None and not s.limits.gang
    if a.stop_cause is not None or jit_possible or not s.limits.worker_deaths_end:
        # A heartbeat writer on one host: its surviving ranks may be writing a just-in-time
        # checkpoint, which its launcher waits for; or a launcher this does not apply to. Its
        # launcher's exit ends it.
        return s, [log]
    # running → stopping: a worker died and no survivor can save a checkpoint — the attempt writes no
    # heartbeat, or its ranks span hosts (each host keeps its ranks' step state, so no survivor holds
    # every rank's: trainer/jit.py) — and its launcher would only tear the other ranks down slowly
    # first: SIGKILL to the whole attempt at once.
    why = "its ranks span hosts, so no survivor can save a just-in-time checkpoint" if s.limits.gang \
        else "no heartbeat, so nothing to checkpoint"
    s = term(s, now, StopCause.WORKER_DIED, worker=obs.worker, kill_at=now)
    return s, [RecordStop(s.number, StopCause.WORKER_DIED), log,
               Note(f"{what}; {why}: SIGKILL to the attempt at once"), SignalKill()]


def replay_differed(s: TrackedJob, obs: ReplayDiffered, now: float) -> Result:
    """What the job trained from `obs.step` on came from a GPU that computes wrong numbers (a replay on
    other GPUs differed): the next attempt's discovery sets those checkpoints aside (ledger.reject)."""
    s = with_ledger(s, reject=(obs.step, obs.what))
    log = Log("replay_differed", "error", (("step", obs.step), ("detail", obs.what)))
    if s.phase in (Phase.RUNNING, Phase.DUMPING) and s.attempt.stop_cause is None:
        # running|dumping → stopping: SIGKILL at once (nothing it trained since is worth a checkpoint);
        # relaunched, uncounted, from the newest checkpoint before the step.
        s = term(s, now, StopCause.CORRUPTION, corrupted=(obs.step, obs.what), kill_at=now)
        return s, [RecordStop(s.number, StopCause.CORRUPTION), log,
                   Note(f"a replay on other GPUs differs at step {obs.step}: {obs.what}; SIGKILL, then a relaunch "
                        f"from the newest checkpoint before step {obs.step}"), SignalKill()]
    # Between attempts, or already on the way down: the next attempt's discovery does it.
    return s, [log]


def lease_lost(s: TrackedJob, obs: LeaseLost, now: float) -> Result:
    """Another host runs the job now. It ends here cancelled, not failed: nothing went wrong with the
    job (the end marker is that host's to write: this host's never ends it there, spx_dir.mark_ended)."""
    reason = handed_over(obs.holder)
    note = Log("lease_lost", "error", (("holder", obs.holder),))
    if s.phase in (Phase.BACKOFF, Phase.READY, Phase.PREPARING, Phase.STAGING):
        # backoff|ready|preparing|staging → done (cancelled): nothing of it runs here.
        extra = [StopStaging()] if s.phase is Phase.STAGING else []
        launching = s.phase is Phase.PREPARING and s.clock.answered
        return finish_without_attempt(_without_launch(s), JobState.CANCELLED, reason, now, note, *extra,
                                      number=s.number if launching else 0, reason_class=ReasonClass.LEASE_LOST)
    if s.phase in (Phase.RUNNING, Phase.DUMPING):
        # running|dumping → stopping: SIGTERM and the grace; what it saves meanwhile is fenced (its
        # lease generation is not the lease's any more: spx.trainer publishes nothing, exits 77).
        return term(s, now, StopCause.LEASE_LOST, handed_to=obs.holder), [
            note, RecordStop(s.number, StopCause.LEASE_LOST),
            Note(f"{reason}; SIGTERM, {s.limits.grace_seconds:.0f} s grace (no checkpoint of it is published here)"),
            SignalTerm()]
    if s.phase in (Phase.STOPPING, Phase.EXITED, Phase.DIAGNOSING) and s.attempt.stop_cause not in (
            StopCause.CANCEL, StopCause.LEASE_LOST):
        # stopping|exited|diagnosing: already on the way down; it ends as handed over, not relaunched.
        return with_attempt(s, stop_cause=StopCause.LEASE_LOST, handed_to=obs.holder), [
            note, RecordStop(s.number, StopCause.LEASE_LOST)]
    return s, []


def daemon_stopping(s: TrackedJob, obs: DaemonStopping, now: float) -> Result:
    s = with_ledger(s, daemon_stopping=True)
    if s.phase is Phase.BACKOFF:
        # backoff → done: the remaining delay is stored; the next daemon resumes it.
        return to(s, Phase.DONE, now), [SaveBackoff(s.ledger.backoff_remaining)]
    if s.phase in (Phase.READY, Phase.PREPARING):
        # ready|preparing → done: nothing runs; the job stays starting/restarting for the next daemon
        # (a launch under way is ended when it lands; the next daemon finds its row and relaunches).
        return to(_without_launch(s), Phase.DONE, now), []
    if s.phase is Phase.STAGING:
        # staging → done: staging resumes where it stopped at the next start.
        return to(s, Phase.DONE, now), [StopStaging()]
    if s.phase in (Phase.RUNNING, Phase.DUMPING):
        # running|dumping → stopping: SIGTERM and the grace, as for a cancel; resumed on next start.
        return term(s, now, StopCause.DAEMON_STOP), [
            RecordStop(s.number, StopCause.DAEMON_STOP),
            Note(f"the daemon is stopping; SIGTERM, {s.limits.grace_seconds:.0f} s grace; resumes on its next start"),
            SignalTerm()]
    return s, []


def stacks_dumped(s: TrackedJob, obs: StacksDumped, now: float) -> Result:
    if obs.number != s.number:
        return s, []
    # dumping → stopping: stacks are in the log; SIGTERM, the grace, then SIGKILL.
    return term(s, now), [SignalTerm()]


def tick_dumping(s: TrackedJob, obs: Tick, now: float) -> Result:
    if s.clock.overdue(now, DUMP_DEADLINE_SECONDS):
        # dumping → stopping: the dump did not come back in time; the stop does not wait for it.
        return term(s, now), [Log("stack_dump_timed_out", "warning"), SignalTerm()]
    return s, []


def tick_stopping(s: TrackedJob, obs: Tick, now: float) -> Result:
    a = s.attempt
    grace_over = a.term_at is not None and now - a.term_at >= s.limits.grace_seconds
    if grace_over and (a.kill_at is None or now - a.kill_at >= KILL_REPEAT_SECONDS):
        # stopping: the grace is over → SIGKILL (repeated each second while anything remains).
        first = a.kill_at is None
        return with_attempt(s, kill_at=now), [
            *([Note(f"grace of {s.limits.grace_seconds:.0f} s over; SIGKILL")] if first else []), SignalKill()]
    return s, []


def launcher_exited(s: TrackedJob, obs: LauncherExited, now: float) -> Result:
    # running|dumping|stopping → exited: the launcher is gone; anything left of the attempt is a
    # leftover and gets SIGKILL at once (and every second until none remain).
    cause = s.attempt.stop_cause
    if obs.lost or (not obs.launched and obs.code != 0):
        # How it ended is unknown (its monitor died with it), or the exit is the shim's, not the
        # job's (the shim never exits 0 without exec'ing the job): relaunched, not counted.
        cause = cause or StopCause.LOST
    elif obs.stopped and cause is None:
        # A daemon stopped it and died before it could store why: not the job's fault.
        cause = StopCause.DAEMON_RESTART
    s = replace(to(s, Phase.EXITED, now), attempt=replace(
        s.attempt, exit_code=obs.code, exit_signal=obs.signal, exited_at=now, kill_at=now, stop_cause=cause,
        exited_wall=obs.ended_wall))
    if obs.code is None and obs.signal is None:
        return s, [SignalKill()]  # nothing known to store
    return s, [SignalKill(), RecordExit(s.number, obs.code, obs.signal, cause)]


def tick_exited(s: TrackedJob, obs: Tick, now: float) -> Result:
    actions: list = []
    a = s.attempt
    if a.kill_at is None or now - a.kill_at >= KILL_REPEAT_SECONDS:
        s = with_attempt(s, kill_at=now)
        actions.append(SignalKill())
    if now - (a.warned_at or s.clock.since) > LEFTOVER_WARN_SECONDS:
        s = with_attempt(s, warned_at=now)
        actions.append(Log("leftover_processes", "warning"))
    return s, actions


def all_gone(s: TrackedJob, obs: AllGone, now: float) -> Result:
    # exited → diagnosing: nothing of the attempt runs; its cgroup goes, and a failure is diagnosed
    # off the loop (root cause from the log tail, the kernel's OOM record).
    a = s.attempt
    # A worker's death is the job's failure as much as the launcher's own nonzero exit is.
    failed = a.exit_code != 0 and a.stop_cause in (None, StopCause.WORKER_DIED)
    want_root = a.exit_code != 0 and a.stop_cause != StopCause.CANCEL and a.stop_cause not in NOT_THE_JOBS
    s = to(s, Phase.DIAGNOSING, now)
    if not (failed or want_root):
        # exited → recorded: nothing to diagnose (success, or a stop the daemon made).
        s2, actions = record_end(s, now)
        return s2, [RemoveCgroup(), *actions]
    return s, [RemoveCgroup(), Diagnose(s.number, root_cause=want_root, oom=failed, worker=a.worker)]
