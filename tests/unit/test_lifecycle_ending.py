"""The job state machine at an attempt's end (lifecycle/ending.py): the diagnosis, the restart
policy's decision, the record of the end, the backoff, the crash-loop guard and the counts per
failure class — one test per edge, by scripting observations."""

from __future__ import annotations

import signal
from dataclasses import replace

from lifecycle_script import LIMITS, WALL0, ended, hung, only, running

from spx.daemon.core.restart_spec import Restart
from spx.daemon.lifecycle.actions import (
    Diagnose,
    FinishAttempt,
    RecordExit,
    RemoveCgroup,
    SignalKill,
)
from spx.daemon.lifecycle.ending import DIAGNOSE_DEADLINE_SECONDS
from spx.daemon.lifecycle.machine import advance
from spx.daemon.lifecycle.observations import (
    ActionFailed,
    AllGone,
    CheckpointFound,
    DaemonStopping,
    Diagnosed,
    Go,
    HeartbeatSeen,
    LauncherExited,
    Spawned,
    StacksDumped,
    Tick,
)
from spx.daemon.lifecycle.record import Phase, TrackedJob
from spx.daemon.state.states import JobState


def test_hang_then_term_grace_kill_gone_restarts_with_backoff():
    s, _ = advance(hung(), StacksDumped(1), 70.0)
    s, _ = advance(s, Tick(), 100.0)
    s, actions = advance(s, LauncherExited(None, signal.SIGKILL), 100.2)
    assert s.phase is Phase.EXITED and actions == [SignalKill(), RecordExit(1, None, signal.SIGKILL, "hang")]
    s, actions = advance(s, AllGone(), 100.4)
    assert s.phase is Phase.DIAGNOSING and actions == [RemoveCgroup(), Diagnose(1, root_cause=True, oom=False)]
    s, actions = advance(s, Diagnosed(1, None, False), 101.0)
    finish = only(actions, FinishAttempt)
    assert (finish.state, finish.reason_class, finish.backoff_remaining) == (JobState.RESTARTING, "hang", 10)
    assert finish.reason.startswith("hang: no step progress for 61 s") and finish.max_step == 8
    assert s.phase is Phase.BACKOFF and s.ledger.restarts == 1


def test_exit_0_to_succeeded():
    s, actions = ended(running(), 30.0, code=0)
    finish = only(actions, FinishAttempt)
    assert s.phase is Phase.DONE and (finish.state, finish.reason, finish.release_gpus) == (
        JobState.SUCCEEDED, "exit code 0", True)
    assert actions[0] == RemoveCgroup() and not any(isinstance(a, Diagnose) for a in actions)


def test_crash_is_diagnosed_off_the_loop_then_backs_off_with_remaining_seconds():
    s, actions = ended(running(), 30.0, code=1)
    assert s.phase is Phase.DIAGNOSING and only(actions, Diagnose) == Diagnose(1, root_cause=True, oom=True)
    s, actions = advance(s, Diagnosed(1, "ValueError: lr must be positive", False), 30.5)
    finish = only(actions, FinishAttempt)
    assert (finish.state, finish.reason, finish.root_cause) == (JobState.RESTARTING, "exit code 1",
                                                                "ValueError: lr must be positive")
    assert finish.backoff_remaining == 10 and not finish.release_gpus, "a restarting job keeps its GPUs"
    assert s.phase is Phase.BACKOFF and s.ledger.backoff_remaining == 10


def test_oom_diagnosis_classes_the_failure():
    s, _ = ended(running(), 30.0, code=None, sig=signal.SIGKILL)
    s, actions = advance(s, Diagnosed(1, None, True), 31.0)
    assert only(actions, FinishAttempt).reason_class == "oom"


def test_diagnosing_to_recorded_when_the_diagnosis_never_comes():
    s, _ = ended(running(), 30.0, code=1)
    s, actions = advance(s, Tick(), 30.0 + DIAGNOSE_DEADLINE_SECONDS + 1)
    assert only(actions, FinishAttempt).root_cause is None and s.phase is Phase.BACKOFF


def test_diagnosis_that_fails_records_the_end_without_it():
    s, _ = ended(running(), 30.0, code=1)
    s, actions = advance(s, ActionFailed(Diagnose(1, True, True), "OSError: EIO"), 31.0)
    assert only(actions, FinishAttempt).state is JobState.RESTARTING


def _three_quick_crashes(resume_steps: dict[int, int | None]) -> tuple[TrackedJob, FinishAttempt]:
    """Three attempts that each fail at once with no heartbeat; attempt n resumes resume_steps[n]."""
    s, actions = running(), []
    for n in range(1, 4):
        s, _ = ended(s, 10.0 * n, code=1)
        s, actions = advance(s, Diagnosed(n, None, False), 10.0 * n)
        if n < 3:
            step = resume_steps.get(n + 1)
            s = replace(s, phase=Phase.READY, ledger=replace(s.ledger, backoff_remaining=0.0))
            s, _ = advance(s, Go((0, 1)), 10.0 * n)
            s, _ = advance(s, CheckpointFound(None if step is None else f"/ck/step-{step}", step, n + 1), 10.0 * n)
            s, _ = advance(s, Spawned(1000 + n, WALL0), 10.0 * n)
    return s, only(actions, FinishAttempt)


def test_crash_loop_to_failed():
    s, finish = _three_quick_crashes({})
    assert s.phase is Phase.DONE and finish.state is JobState.FAILED and finish.reason.startswith("crash loop")


def test_an_attempt_that_left_a_newer_checkpoint_made_progress_without_a_heartbeat():
    """A script without a heartbeat trains, checkpoints and crashes; the next two attempts crash on
    its newest checkpoint. That is 2 attempts without progress, not 3: the job is relaunched (and
    the crash-loop fallback resumes an older checkpoint), not failed as a crash loop."""
    s, finish = _three_quick_crashes({2: 40, 3: 40})
    assert finish.state is JobState.RESTARTING and s.ledger.no_progress_streak == 2, finish


def test_max_restarts_counts_only_the_jobs_own_faults():
    """max_restarts 1: one real crash is restarted even after a daemon restart ended an attempt."""
    limits = replace(LIMITS, restart=Restart(max_restarts=1, backoff_seconds=(1, 1)))
    s = running(limits=limits)
    s, _ = advance(s, DaemonStopping(), 1.0)   # daemon stop: attempt 1 ends, not the job's fault
    s, actions = ended(s, 2.0, code=None, sig=signal.SIGTERM)
    assert only(actions, FinishAttempt).reason_class == "daemon-restart" and s.ledger.restarts == 0
    s = replace(s, phase=Phase.READY, ledger=replace(s.ledger, daemon_stopping=False))
    s, _ = advance(s, Go((0,)), 3.0)
    s, _ = advance(s, CheckpointFound(None, None, 2), 3.0)
    s, _ = advance(s, Spawned(77, WALL0 + 3), 3.0)
    s, _ = advance(s, HeartbeatSeen(1, WALL0 + 4, "running"), 4.0)
    s, _ = ended(s, 5.0, code=1)
    s, actions = advance(s, Diagnosed(2, None, False), 5.0)
    assert only(actions, FinishAttempt).state is JobState.RESTARTING, "the first real crash is restarted"


def test_a_classs_rule_counts_only_its_own_earlier_failures():
    """Default rules: an early user-code exception is restarted once; 3 earlier preemptions
    (`always`) and a crash do not use up that one restart, a second user-code failure does."""
    limits = replace(LIMITS, restart=Restart(max_restarts=10, backoff_seconds=(1, 1)))
    s = running(limits=limits, restarts=4, class_counts={"preempted": 3, "crash": 1})
    cause = "rank 0 (pid 7) exited with code 1: ValueError: bad (user-code)"
    s, _ = ended(s, 5.0, code=1)
    s, actions = advance(s, Diagnosed(1, cause, False), 5.0)
    finish = only(actions, FinishAttempt)
    assert (finish.state, finish.reason_class) == (JobState.RESTARTING, "user-code")
    assert dict(s.ledger.class_counts) == {"preempted": 3, "crash": 1, "user-code": 1} and s.ledger.restarts == 5
    s = replace(s, phase=Phase.READY, ledger=replace(s.ledger, backoff_remaining=0.0))
    s, _ = advance(s, Go((0,)), 6.0)
    s, _ = advance(s, CheckpointFound(None, None, 2), 6.0)
    s, _ = advance(s, Spawned(77, WALL0 + 6), 6.0)
    s, _ = ended(s, 8.0, code=1)
    s, actions = advance(s, Diagnosed(2, cause, False), 8.0)
    finish = only(actions, FinishAttempt)
    assert (finish.state, finish.reason_class) == (JobState.FAILED, "user-code"), finish.reason
