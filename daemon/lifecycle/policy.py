"""What to do after an attempt ends: succeed, restart after a backoff, or give up — and why.

Pure: the job's state machine gathers an `AttemptOutcome` from what it observed of the attempt
(its exit, heartbeat, stop cause, diagnosis), and this module decides. Each failed attempt gets a failure class (`failure_class`), and the spec's
`restart.on_failure` sets a rule per class (always / never / counted / {max, within_first_seconds}),
on top of max_restarts, the exit codes and the crash-loop guard. The restart policy is therefore
tested by scripting outcomes, without processes (the torch elastic agent's design; unlike it, restarts back off and stop on a crash loop).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from spx.daemon.contract.worker_env import Divergence
from spx.daemon.core.causes import ReasonClass, StopCause, cause_class, signal_name
from spx.daemon.core.restart_spec import ClassLimit, ClassRule, Restart
from spx.daemon.state.states import JobState

CRASH_LOOP_ATTEMPTS = 3


@dataclass(frozen=True)
class AttemptOutcome:
    """How an attempt ended, as observed.

    `stop_cause` is set when the daemon itself stopped the attempt, or does not know how it ended
    (core.causes.StopCause; for a gpu-fault, `gpu_fault` says which). `progressed` is true if the attempt moved the step past where it
    resumed (or wrote a new checkpoint, or, for scripts without a heartbeat, stayed up for a healthy
    stretch).
    """

    exit_code: int | None
    signal: int | None
    root_cause: str | None = None  # rootcause.root_cause_of's line for a failed attempt, if found
    preempted: bool = False
    oom: bool = False
    stop_cause: StopCause | None = None
    hang_seconds: float | None = None
    gpu_fault: str | None = None  # stop_cause "gpu-fault": what the daemon saw, e.g. "XID 79 on GPU 3 (...)"
    progressed: bool = False
    ran_seconds: float = 0.0
    diverged: Divergence | None = None  # its heartbeat said it diverged (the trainer's, or the daemon's NaN rule)
    corrupted: tuple[int, str] | None = None  # stop_cause corruption: (step, what) a replay found different
    # stop_cause worker-died: which worker ended how ("worker rank 1 (pid 4242) killed by SIGKILL");
    # `exit_code`/`signal` are then that worker's
    worker: str | None = None


@dataclass(frozen=True)
class Decision:
    """The next job state, the reason shown to users, the failure class of the attempt (the
    `reason` label of spx_job_restarts_total), and the backoff bookkeeping for the next attempt."""

    state: JobState
    reason: str
    reason_class: ReasonClass | None
    delay_seconds: float = 0.0
    backoff_level: int = 0
    no_progress_streak: int = 0


def backoff_delay(level: int, first: float, cap: float) -> float:
    """Capped exponential: first, 2·first, 4·first, … never above cap."""
    return min(cap, first * (2 ** max(0, level)))


# Restarts of these classes are resumptions, not failures of the job's code: no crash-loop guard.
_EXTERNAL = (ReasonClass.PREEMPTED, ReasonClass.GPU_FAULT)


def failure_class(outcome: AttemptOutcome) -> ReasonClass:
    """The failure class of an attempt that did not succeed (the `reason` label of
    spx_job_restarts_total): what the daemon saw (hang, preemption, the kernel's OOM kill, a
    signal) first, else the class `rootcause` found for the root rank's error in the log, else
    "crash". A GPU fault, OOM or CUDA error in the log wins over the signal that followed it."""
    if outcome.stop_cause == StopCause.HANG:
        return ReasonClass.HANG
    if outcome.stop_cause == StopCause.GPU_FAULT:
        return ReasonClass.GPU_FAULT
    if outcome.diverged is not None:
        # Before preempted: the daemon's own NaN rule stops the attempt with SIGTERM, on which
        # spx.trainer checkpoints and says "preempted".
        return ReasonClass.DIVERGENCE
    if outcome.preempted:
        return ReasonClass.PREEMPTED
    if outcome.oom:
        return ReasonClass.OOM
    tagged = cause_class(outcome.root_cause)
    if tagged in (ReasonClass.GPU_FAULT, ReasonClass.OOM, ReasonClass.CUDA):
        return tagged
    if outcome.signal is not None:
        return ReasonClass.SIGNAL
    return tagged or ReasonClass.CRASH


def classify(outcome: AttemptOutcome) -> tuple[ReasonClass, str]:
    """(failure class, human reason) of an attempt that did not succeed. The reason says what was
    seen (exit code, signal, hang, preemption, OOM kill); the class and the root cause line say why."""
    cls = failure_class(outcome)
    if cls == ReasonClass.HANG:
        return cls, f"hang: no step progress for {outcome.hang_seconds or 0:.0f} s"
    if outcome.stop_cause == StopCause.GPU_FAULT:
        return cls, f"gpu-fault: {outcome.gpu_fault or 'a fatal GPU error'}; stopped by the daemon"
    if outcome.diverged is not None:
        return cls, divergence_reason(outcome.diverged)
    if cls == ReasonClass.PREEMPTED:
        return cls, "preempted: checkpointed on SIGTERM and exited"
    if outcome.oom:
        return cls, "killed by the kernel's OOM killer"
    if outcome.worker is not None:
        return cls, f"{outcome.worker}; the daemon ended the attempt at once"
    if outcome.signal is not None:
        return cls, f"killed by {signal_name(outcome.signal)}"
    return cls, f"exit code {outcome.exit_code}"


DIVERGED_AT = "diverged at step "


def divergence_reason(d: Divergence) -> str:
    """An attempt's reason when it diverged: "diverged at step 37: loss NaN" (`divergence_of` reads it)."""
    return f"{DIVERGED_AT}{d.step}: {d.describe()}"


def divergence_of(reason: str | None) -> tuple[int, str] | None:
    """(step, what) of a `divergence_reason`, e.g. (37, "loss NaN"); None for any other reason."""
    return _step_and_what(reason, DIVERGED_AT)


CORRUPTED_AT = "a replay on other GPUs differs at step "


def corruption_reason(step: int, what: str) -> str:
    """An attempt's reason when a replay differed: "a replay on other GPUs differs at step 25: rank 1's
    gradient norm 0.8312, recorded 0.8311" (`corruption_of` reads it)."""
    return f"{CORRUPTED_AT}{step}: {what}"


def corruption_of(reason: str | None) -> tuple[int, str] | None:
    """(step, what) of a `corruption_reason`; None for any other reason."""
    return _step_and_what(reason, CORRUPTED_AT)


def _step_and_what(reason: str | None, prefix: str) -> tuple[int, str] | None:
    """(step, what) of a stored reason `prefix + "STEP: WHAT"` (how a rollback survives a daemon restart)."""
    if not reason or not reason.startswith(prefix):
        return None
    step, _, what = reason[len(prefix):].partition(": ")
    return (int(step), what) if step.isdigit() and len(step) < 16 else None


def _restarted(
    outcome: AttemptOutcome, policy: Restart, cls: ReasonClass, why: str, earlier: int, class_earlier: int, rule: ClassRule,
) -> str | None:
    """None if the rules allow a restart of this `cls` failure, else why the job fails."""
    if rule == "never":
        return f"{why}; restart.on_failure.{cls} is never"
    if rule == "always":
        return None
    early = isinstance(rule, ClassLimit) and (rule.within_first_seconds is None
                                              or outcome.ran_seconds < rule.within_first_seconds)
    if isinstance(rule, ClassLimit) and early and class_earlier >= rule.max:
        soon = f" within {rule.within_first_seconds:.0f} s of its start" if rule.within_first_seconds is not None else ""
        return (f"gave up: {why}{soon}, after {class_earlier} earlier {cls} failure"
                f"{'' if class_earlier == 1 else 's'} (restart.on_failure.{cls}.max: {rule.max})")
    if earlier >= policy.max_restarts:
        return f"gave up after {earlier} restarts (restart.max_restarts; last: {why})"
    return None


def decide(
    outcome: AttemptOutcome,
    policy: Restart,
    restarts_done: int,
    backoff_level: int,
    no_progress_streak: int,
    healthy_seconds: float,
    class_counts: Mapping[str, int] | None = None,
) -> Decision:
    """`restarts_done`: earlier attempts of this job that ended by its own fault. Attempts a daemon
    stop or restart ended are not counted (here or in the crash-loop streak): they are not the job's.

    `class_counts`: those earlier attempts by failure class (the store's reason_class). With it,
    attempts of an `always` class are taken out of `restarts_done`, and a class's `max` counts its
    own attempts; without it (None), every earlier fault counts against a class's `max` too (a
    cautious reading: it can only fail a job sooner, never restart it more)."""
    if outcome.stop_cause == StopCause.CANCEL:
        return Decision(JobState.CANCELLED, "cancelled", ReasonClass.CANCELLED)
    if outcome.stop_cause in (StopCause.DAEMON_STOP, StopCause.DAEMON_RESTART):
        # Not the job's fault: resume without counting it as a failure.
        why = ("daemon stopped; resumes on next start" if outcome.stop_cause == StopCause.DAEMON_STOP
               else "daemon restarted")
        return Decision(JobState.RESTARTING, why, ReasonClass.DAEMON_RESTART, 0.0, backoff_level, no_progress_streak)
    if outcome.stop_cause == StopCause.PEER_RESTART:
        # Across hosts: stopped because another host began a newer generation (a daemon restarted
        # meanwhile, so that host's decision is not known here): it counted the failure, if any.
        return Decision(JobState.RESTARTING, "restarted with the job's other hosts", ReasonClass.PEER_RESTART, 0.0,
                        backoff_level, no_progress_streak)
    if outcome.stop_cause == StopCause.CORRUPTION:
        # A GPU computed wrong numbers (a replay differed): not the job's fault, relaunched at once
        # from before them (rollback.py), uncounted.
        step, what = outcome.corrupted or (0, "a replay differed")
        return Decision(JobState.RESTARTING, corruption_reason(step, what), ReasonClass.CORRUPTION, 0.0,
                        backoff_level, no_progress_streak)
    if outcome.stop_cause == StopCause.LOST:
        # Its monitor is gone without a record (killed with it, or the launch never got going): how
        # it ended is unknown, so it is not counted; it resumes from its checkpoint.
        return Decision(JobState.RESTARTING, "lost: the attempt ended while no daemon watched and left no "
                        "record of how; relaunched from its checkpoint", ReasonClass.LOST, 0.0, backoff_level,
                        no_progress_streak)
    if outcome.exit_code == 0 and outcome.stop_cause is None:
        return Decision(JobState.SUCCEEDED, "exit code 0", None)

    cls, why = classify(outcome)
    rule = policy.on_failure.get(cls, "counted")
    if (
        policy.on_exit_codes != "any"
        and cls not in (ReasonClass.HANG, ReasonClass.PREEMPTED, ReasonClass.GPU_FAULT, ReasonClass.DIVERGENCE)
        and not outcome.oom
        and outcome.signal is None
        and outcome.exit_code not in policy.on_exit_codes
    ):
        return Decision(JobState.FAILED, f"{why}, which restart.on_exit_codes does not restart", cls)
    streak = 0 if outcome.progressed else no_progress_streak + 1
    if streak >= CRASH_LOOP_ATTEMPTS and cls not in _EXTERNAL:
        return Decision(
            JobState.FAILED,
            f"crash loop: {streak} attempts in a row made no step progress (last: {why})",
            cls, no_progress_streak=streak,
        )
    if class_counts is None:
        earlier, class_earlier = restarts_done, restarts_done
    else:
        always = sum(n for c, n in class_counts.items() if policy.on_failure.get(c) == "always")
        earlier, class_earlier = max(0, restarts_done - always), class_counts.get(cls, 0)
    refused = _restarted(outcome, policy, cls, why, earlier, class_earlier, rule)
    if refused is not None:
        return Decision(JobState.FAILED, refused, cls, no_progress_streak=streak)
    first, cap = policy.backoff_seconds
    if outcome.ran_seconds >= healthy_seconds:
        # A failure after a healthy stretch is no crash loop: relaunch at once (every second of
        # backoff is a second of every GPU idle), and a quick failure after that starts at `first`.
        return Decision(JobState.RESTARTING, why, cls, 0.0, 0, streak)
    delay = backoff_delay(backoff_level, first, cap)
    return Decision(JobState.RESTARTING, why, cls, delay, backoff_level + 1, streak)
