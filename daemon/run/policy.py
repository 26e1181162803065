"""What to do after an attempt ends: succeed, restart after a backoff, or give up — and why.

Pure: the supervisor gathers an `AttemptOutcome` from the processes and the heartbeat, and this
module decides. The restart policy is therefore tested by scripting outcomes, without processes
(the torch elastic agent's design; unlike it, restarts back off and stop on a crash loop).
"""

from __future__ import annotations

from dataclasses import dataclass

from spx.daemon.intake.spec import Restart
from spx.daemon.run.proctree import signal_name
from spx.daemon.state.states import JobState

CRASH_LOOP_ATTEMPTS = 3


@dataclass(frozen=True)
class AttemptOutcome:
    """How an attempt ended, as observed.

    `stop_cause` is set when the daemon itself stopped the attempt, or does not know how it ended:
    "cancel", "daemon-stop" (the daemon is shutting down), "daemon-restart" (a daemon stopped it and
    died before storing why), "lost" (adopted after a daemon restart, its monitor gone without a
    record of its end) or "hang". `progressed` is true if the attempt moved the step past where it
    resumed (or wrote a new checkpoint, or, for scripts without a heartbeat, stayed up for a healthy
    stretch).
    """

    exit_code: int | None
    signal: int | None
    root_cause: str | None = None  # rootcause.root_cause_of's line for a failed attempt, if found
    preempted: bool = False
    oom: bool = False
    stop_cause: str | None = None
    hang_seconds: float | None = None
    progressed: bool = False
    ran_seconds: float = 0.0


@dataclass(frozen=True)
class Decision:
    """The next job state, the reason shown to users, the failure class of the attempt (the
    `reason` label of spx_job_restarts_total), and the backoff bookkeeping for the next attempt."""

    state: JobState
    reason: str
    reason_class: str | None
    delay_seconds: float = 0.0
    backoff_level: int = 0
    no_progress_streak: int = 0


def backoff_delay(level: int, first: float, cap: float) -> float:
    """Capped exponential: first, 2·first, 4·first, … never above cap."""
    return min(cap, first * (2 ** max(0, level)))


def classify(outcome: AttemptOutcome) -> tuple[str, str]:
    """(failure class, human reason) of an attempt that did not succeed."""
    if outcome.stop_cause == "hang":
        return "hang", f"hang: no step progress for {outcome.hang_seconds or 0:.0f} s"
    if outcome.preempted:
        return "preempted", "preempted: checkpointed on SIGTERM and exited"
    if outcome.oom:
        return "oom", "killed by the kernel's OOM killer"
    if outcome.signal is not None:
        return "signal", f"killed by {signal_name(outcome.signal)}"
    return "crash", f"exit code {outcome.exit_code}"


def decide(
    outcome: AttemptOutcome,
    policy: Restart,
    restarts_done: int,
    backoff_level: int,
    no_progress_streak: int,
    healthy_seconds: float,
) -> Decision:
    """`restarts_done`: earlier attempts of this job that ended by its own fault. Attempts a daemon
    stop or restart ended are not counted (here or in the crash-loop streak): they are not the job's."""
    if outcome.stop_cause == "cancel":
        return Decision(JobState.CANCELLED, "cancelled", "cancelled")
    if outcome.stop_cause in ("daemon-stop", "daemon-restart"):
        # Not the job's fault: resume without counting it as a failure.
        why = "daemon stopped; resumes on next start" if outcome.stop_cause == "daemon-stop" else "daemon restarted"
        return Decision(JobState.RESTARTING, why, "daemon-restart", 0.0, backoff_level, no_progress_streak)
    if outcome.stop_cause == "lost":
        # Its monitor is gone without a record (killed with it, or the launch never got going): how
        # it ended is unknown, so it is not counted; it resumes from its checkpoint.
        return Decision(JobState.RESTARTING, "lost: the attempt ended while no daemon watched and left no "
                        "record of how; relaunched from its checkpoint", "lost", 0.0, backoff_level, no_progress_streak)
    if outcome.exit_code == 0 and outcome.stop_cause is None:
        return Decision(JobState.SUCCEEDED, "exit code 0", None)

    cls, why = classify(outcome)
    if (
        cls == "crash"
        and policy.on_exit_codes != "any"
        and outcome.exit_code not in policy.on_exit_codes
    ):
        return Decision(JobState.FAILED, f"{why}, which restart.on_exit_codes does not restart", cls)
    streak = 0 if outcome.progressed else no_progress_streak + 1
    if streak >= CRASH_LOOP_ATTEMPTS:
        return Decision(
            JobState.FAILED,
            f"crash loop: {streak} attempts in a row made no step progress (last: {why})",
            cls, no_progress_streak=streak,
        )
    if restarts_done >= policy.max_restarts:
        return Decision(
            JobState.FAILED, f"gave up after {restarts_done} restarts (restart.max_restarts; last: {why})",
            cls, no_progress_streak=streak,
        )
    level = 0 if outcome.ran_seconds >= healthy_seconds else backoff_level
    first, cap = policy.backoff_seconds
    delay = backoff_delay(level, first, cap)
    return Decision(JobState.RESTARTING, why, cls, delay, level + 1, streak)
