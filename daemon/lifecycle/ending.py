"""The machine's edges at an attempt's end: the diagnosis comes back (or its deadline passes), the
restart policy decides (policy.decide), and the end is recorded — the attempt row ended and the job
moved in ONE store transaction (FinishAttempt) — into BACKOFF (a restart), or DONE. Across hosts the
end is first agreed with the other hosts (AGREEING, across_hosts.py) and recorded once answered.
PURE."""

from __future__ import annotations

from dataclasses import replace

from spx.daemon.contract.worker_env import EXIT_PREEMPTED
from spx.daemon.core.causes import NOT_THE_JOBS, ReasonClass, StopCause, signal_name
from spx.daemon.lifecycle import across_hosts
from spx.daemon.lifecycle.actions import FinishAttempt, Log, RecordVerdict
from spx.daemon.lifecycle.moves import Result, to, with_attempt
from spx.daemon.lifecycle.observations import Diagnosed, GenerationAgreed, Tick
from spx.daemon.lifecycle.policy import AttemptOutcome, Decision, decide
from spx.daemon.lifecycle.record import Phase, TrackedJob, counted_classes
from spx.daemon.lifecycle.resume_fallback import PastAttempt, remember
from spx.daemon.state.states import JobState

# The diagnosis (root cause, OOM) comes back by then, or the attempt ends without it.
DIAGNOSE_DEADLINE_SECONDS = 30.0


def diagnosed(s: TrackedJob, obs: Diagnosed, now: float) -> Result:
    if obs.number != s.number:
        return s, []
    # diagnosing → recorded.
    return record_end(with_attempt(s, root_cause=obs.root_cause, oom=obs.oom), now)


def tick_diagnosing(s: TrackedJob, obs: Tick, now: float) -> Result:
    if s.clock.overdue(now, DIAGNOSE_DEADLINE_SECONDS):
        # diagnosing → recorded: the diagnosis did not come back; the attempt ends without it.
        return record_end(s, now)
    return s, []


def agreed(s: TrackedJob, obs: GenerationAgreed, now: float) -> Result:
    if obs.number != s.number:
        return s, []
    # agreeing → recorded: on this host's decision, or on the one another host took first.
    return record_end(across_hosts.take_agreement(s, obs), now)


def tick_agreeing(s: TrackedJob, obs: Tick, now: float) -> Result:
    if s.clock.overdue(now, across_hosts.AGREE_DEADLINE_SECONDS):
        # agreeing → recorded: the shared dir did not answer; this host's own decision stands.
        s2, actions = record_end(replace(s, share=replace(s.share, agreed=True)), now)
        return s2, [Log("generation_not_agreed", "warning",
                        (("detail", f"no answer in {across_hosts.AGREE_DEADLINE_SECONDS:.0f} s"),)), *actions]
    return s, []


def handed_over(holder: str | None) -> str:
    """The reason of a job another host took over (LeaseLost)."""
    return (f"handed over to host {holder or '(another host)'}: its lease was taken while this host could not "
            "renew it")


def record_end(s: TrackedJob, now: float) -> Result:
    """The attempt is over: decide (policy.decide) and write the end and the job's next state in one
    transaction. A restart goes to BACKOFF (or DONE if the daemon is stopping: the stored remaining
    delay resumes at the next start); anything else is terminal. Across hosts the end is first told
    to the other hosts (AGREEING): a failure begins the next generation, unless another host began
    it first, whose decision then applies here (not counted)."""
    s, d = decide_end(s, now)
    if across_hosts.must_agree(s):
        return across_hosts.agree(s, d, now)
    return commit_end(s, d, now)


def decide_end(s: TrackedJob, now: float) -> tuple[TrackedJob, Decision]:
    a = s.attempt
    ran = now - (a.started if a.started is not None else now)
    finished_reason = None
    if a.beat_status == "finished" and a.stop_cause in (StopCause.LOST, StopCause.HANG):
        # Its heartbeat says training finished (final checkpoint complete), but its exit is unknown
        # (lost) or it never exited (a hang at exit, killed): the job's work is done.
        finished_reason = ("training finished (heartbeat); it did not exit and was killed"
                           if a.stop_cause == StopCause.HANG else "training finished (heartbeat); its exit is unknown")
        s = with_attempt(s, stop_cause=None, exit_code=0)
        a = s.attempt
    if a.stop_cause == StopCause.GPU_FAULT and a.gpu_fault:
        # The daemon saw the cause (the fatal XID); what the ranks printed as they died follows from it.
        s = with_attempt(s, root_cause=a.gpu_fault + (f"; then {a.root_cause}" if a.root_cause else ""))
        a = s.attempt
    if a.stop_cause == StopCause.LEASE_LOST:
        # Another host runs the job now (LeaseLost): it ends here, never relaunched, uncounted.
        return s, Decision(JobState.CANCELLED, handed_over(a.handed_to), ReasonClass.LEASE_LOST,
                           backoff_level=s.ledger.backoff_level, no_progress_streak=s.ledger.no_progress_streak)
    if s.share.peer is not None and not (a.exit_code == 0 and (a.stop_cause is None or a.beat_status == "finished")):
        # Across hosts: another host began the next generation first; its decision is the job's.
        return s, across_hosts.peer_decision(s, s.share.peer)
    lost_host = across_hosts.host_lost(s)
    if lost_host is not None:
        return s, lost_host
    code, sig = a.exit_code, a.exit_signal
    if a.stop_cause == StopCause.WORKER_DIED and a.worker is not None:
        # The daemon killed the attempt for its worker's death: that death is how the attempt ended.
        code, sig = a.worker.code, a.worker.signal
    outcome = AttemptOutcome(
        exit_code=code, signal=sig, root_cause=a.root_cause,
        preempted=a.beat_status == "preempted" or a.exit_code == EXIT_PREEMPTED, diverged=a.diverged,
        corrupted=a.corrupted,
        oom=a.oom, stop_cause=a.stop_cause, hang_seconds=a.hang_idle, gpu_fault=a.gpu_fault,
        progressed=a.progressed or (a.last_step is None and ran >= s.limits.healthy_seconds), ran_seconds=ran,
        worker=a.worker.describe() if a.stop_cause == StopCause.WORKER_DIED and a.worker is not None else None,
    )
    ledger = s.ledger
    d = decide(outcome, s.limits.restart, ledger.restarts, ledger.backoff_level, ledger.no_progress_streak,
               s.limits.healthy_seconds, class_counts=dict(ledger.class_counts))
    if d.state is JobState.CANCELLED and a.cancelled_by:
        d = replace(d, reason=f"cancelled by {a.cancelled_by}")  # a user's decision, not a failure
    if finished_reason is not None and d.state is JobState.SUCCEEDED:
        d = replace(d, reason=finished_reason)
    return s, d


def commit_end(s: TrackedJob, d: Decision, now: float) -> Result:
    a, ledger = s.attempt, s.ledger
    terminal = d.state.terminal
    finish = FinishAttempt(
        number=s.number, state=d.state, reason=d.reason, reason_class=d.reason_class, exit_code=a.exit_code,
        signal=a.exit_signal, max_step=a.last_step, root_cause=a.root_cause,
        backoff_remaining=d.delay_seconds, backoff_level=d.backoff_level, no_progress_streak=d.no_progress_streak,
        release_gpus=terminal, ended_wall=a.exited_wall,
    )
    counted = d.state is JobState.RESTARTING and a.stop_cause not in NOT_THE_JOBS and s.share.peer is None
    # The level says what the operator must look at: `journalctl -p err` lists the jobs that failed,
    # `-p warning` also every relaunch.
    level = "error" if d.state is JobState.FAILED else "warning" if d.state is JobState.RESTARTING else "info"
    log = Log("attempt_ended", level, (
        ("exit_code", a.exit_code), ("signal", signal_name(a.exit_signal) if a.exit_signal else None),
        ("reason", d.reason), ("next_state", d.state.value), ("delay_seconds", d.delay_seconds),
        ("last_step", a.last_step), ("root_cause", a.root_cause)))
    diverged = ((a.diverged.step, a.diverged.describe())
                if a.diverged is not None and d.reason_class is ReasonClass.DIVERGENCE else None)
    past = PastAttempt(s.number, True, d.reason_class, a.resume.path, a.resume.step, a.last_step, a.resume.fell_back,
                       diverged, a.corrupted if d.reason_class is ReasonClass.CORRUPTION else None)
    s = replace(s, ledger=replace(
        ledger, job_state=d.state, backoff_level=d.backoff_level, no_progress_streak=d.no_progress_streak,
        restarts=ledger.restarts + (1 if counted else 0), backoff_remaining=d.delay_seconds,
        class_counts=counted_classes(ledger.class_counts, d.reason_class) if counted and d.reason_class
        else ledger.class_counts,
        history=remember(ledger.history, past)))
    if terminal or s.ledger.daemon_stopping:
        # recorded → done: terminal, or a restart the next daemon resumes. A replay job's end takes
        # its verdict to the job it verified.
        verdict = [RecordVerdict(s.number, s.limits.replay_of, a.replay, d.reason)] if (
            terminal and s.limits.replay_of is not None) else []
        return to(s, Phase.DONE, now), [finish, *verdict, log]
    # recorded → backoff (→ ready at once when the delay is 0).
    return to(s, Phase.BACKOFF if d.delay_seconds > 0 else Phase.READY, now), [finish, log]
