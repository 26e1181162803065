"""The restart policy, one test per edge, by scripting attempt outcomes (no processes)."""

import signal

from spx.daemon.intake.spec import Restart
from spx.daemon.run.policy import AttemptOutcome, backoff_delay, decide
from spx.daemon.state.states import JobState

POLICY = Restart(max_restarts=5, backoff_seconds=(10, 300))


def run(outcome, restarts=0, level=0, streak=0, policy=POLICY):
    return decide(outcome, policy, restarts, level, streak, healthy_seconds=600)


def test_running_to_succeeded_on_exit_0():
    assert run(AttemptOutcome(exit_code=0, signal=None)).state is JobState.SUCCEEDED


def test_running_to_restarting_on_crash_with_backoff():
    d = run(AttemptOutcome(exit_code=1, signal=None, progressed=True))
    assert (d.state, d.reason, d.reason_class, d.delay_seconds) == (JobState.RESTARTING, "exit code 1", "crash", 10)


def test_backoff_doubles_and_caps():
    assert [backoff_delay(n, 10, 300) for n in range(7)] == [10, 20, 40, 80, 160, 300, 300]
    d = run(AttemptOutcome(exit_code=1, signal=None, progressed=True), level=3)
    assert d.delay_seconds == 80 and d.backoff_level == 4


def test_backoff_resets_after_healthy_stretch():
    d = run(AttemptOutcome(exit_code=1, signal=None, progressed=True, ran_seconds=3600), level=5)
    assert d.delay_seconds == 10


def test_running_to_restarting_on_signal():
    d = run(AttemptOutcome(exit_code=None, signal=signal.SIGKILL, progressed=True))
    assert d.state is JobState.RESTARTING and d.reason == "killed by SIGKILL" and d.reason_class == "signal"


def test_running_to_restarting_on_hang():
    d = run(AttemptOutcome(exit_code=None, signal=signal.SIGTERM, stop_cause="hang", hang_seconds=912, progressed=True))
    assert d.state is JobState.RESTARTING and d.reason_class == "hang" and "912 s" in d.reason


def test_running_to_restarting_on_preemption():
    d = run(AttemptOutcome(exit_code=75, signal=None, preempted=True, progressed=True))
    assert d.reason_class == "preempted"


def test_running_to_failed_on_crash_loop():
    d = run(AttemptOutcome(exit_code=1, signal=None), restarts=2, streak=2)
    assert d.state is JobState.FAILED and d.reason.startswith("crash loop")


def test_progress_resets_the_crash_loop_streak():
    d = run(AttemptOutcome(exit_code=1, signal=None, progressed=True), restarts=2, streak=2)
    assert d.state is JobState.RESTARTING and d.no_progress_streak == 0


def test_running_to_failed_after_max_restarts():
    d = run(AttemptOutcome(exit_code=1, signal=None, progressed=True), restarts=5)
    assert d.state is JobState.FAILED and "gave up after 5 restarts" in d.reason


def test_the_last_allowed_restart_still_restarts():
    d = run(AttemptOutcome(exit_code=1, signal=None, progressed=True), restarts=4)
    assert d.state is JobState.RESTARTING


def test_running_to_failed_on_non_restartable_exit_code():
    policy = Restart(on_exit_codes=[1, 2])
    assert run(AttemptOutcome(exit_code=3, signal=None), policy=policy).state is JobState.FAILED
    assert run(AttemptOutcome(exit_code=2, signal=None, progressed=True), policy=policy).state is JobState.RESTARTING


def test_running_to_cancelled_on_cancel():
    assert run(AttemptOutcome(exit_code=75, signal=None, stop_cause="cancel")).state is JobState.CANCELLED


def test_daemon_stop_restarts_without_counting_a_failure():
    d = run(AttemptOutcome(exit_code=75, signal=None, stop_cause="daemon-stop"), level=2, streak=1)
    assert (d.state, d.delay_seconds, d.backoff_level, d.no_progress_streak) == (JobState.RESTARTING, 0, 2, 1)
