"""The restart policy, one test per edge, by scripting attempt outcomes (no processes)."""

import signal

from spx.daemon.core.restart_spec import Restart
from spx.daemon.lifecycle.policy import AttemptOutcome, backoff_delay, decide, failure_class
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
    # A failure after a healthy stretch relaunches at once; a quick failure after it backs off `first`.
    d = run(AttemptOutcome(exit_code=1, signal=None, progressed=True, ran_seconds=3600), level=5)
    assert (d.delay_seconds, d.backoff_level) == (0, 0)
    d = run(AttemptOutcome(exit_code=1, signal=None, progressed=True, ran_seconds=5), level=d.backoff_level)
    assert (d.delay_seconds, d.backoff_level) == (10, 1)


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


# --- failure classes and restart.on_failure ----------------------------------------------------------

USER_ERROR = "rank 1 (pid 9051) exited with code 1: ValueError: bad batch (user-code); rank 0: RuntimeError: " \
             "Connection closed by peer (consequence)"


def failed(root_cause=None, code=1, sig=None, ran=5.0, **kw):
    return AttemptOutcome(exit_code=code, signal=sig, root_cause=root_cause, ran_seconds=ran, **kw)


def test_the_class_comes_from_what_the_daemon_saw_then_from_the_logs_root_cause():
    assert failure_class(failed(USER_ERROR)) == "user-code"
    assert failure_class(failed("RuntimeError: NCCL error: remote process exited (communication)")) == "communication"
    assert failure_class(failed("rank 0 (pid 3) exited with code 1: RuntimeError: CUDA error: x (cuda)")) == "cuda"
    assert failure_class(failed(None)) == "crash"
    assert failure_class(failed(None, code=None, sig=signal.SIGKILL)) == "signal"
    assert failure_class(failed(USER_ERROR, oom=True)) == "oom", "the kernel's OOM kill is seen, not guessed"
    assert failure_class(failed(USER_ERROR, preempted=True)) == "preempted"
    assert failure_class(failed(USER_ERROR, stop_cause="hang", hang_seconds=60)) == "hang"
    # A GPU fault (or OOM) the log shows explains the signal the worker died of.
    assert failure_class(failed("NVRM: Xid 79, GPU has fallen off the bus (gpu-fault)", code=None,
                                sig=signal.SIGABRT)) == "gpu-fault"


def test_an_early_user_code_exception_is_restarted_once_by_default_then_fails():
    first = run(failed(USER_ERROR), restarts=0, policy=Restart())
    assert (first.state, first.reason_class) == (JobState.RESTARTING, "user-code")
    second = run(failed(USER_ERROR), restarts=1, streak=1, policy=Restart())
    assert (second.state, second.reason_class) == (JobState.FAILED, "user-code")
    assert "restart.on_failure.user-code.max: 1" in second.reason and "within 120 s" in second.reason


def test_a_late_user_code_exception_falls_under_max_restarts():
    d = run(failed(USER_ERROR, ran=3600, progressed=True), restarts=3, policy=Restart())
    assert (d.state, d.reason_class) == (JobState.RESTARTING, "user-code")


def test_class_counts_make_the_class_max_count_only_its_own_attempts():
    policy = Restart(max_restarts=3, on_failure={"oom": {"max": 2}})
    oom = failed("torch.OutOfMemoryError: CUDA out of memory (oom)", progressed=True)
    assert decide(oom, policy, 2, 0, 0, 600, class_counts={"crash": 1, "oom": 1}).state is JobState.RESTARTING
    d = decide(oom, policy, 2, 0, 0, 600, class_counts={"oom": 2})
    assert d.state is JobState.FAILED and "restart.on_failure.oom.max: 2" in d.reason
    # Without the counts, every earlier fault counts against the class's max (never more restarts).
    assert decide(oom, policy, 2, 0, 0, 600).state is JobState.FAILED


def test_always_is_not_counted_against_max_restarts_and_never_fails_at_once():
    policy = Restart(max_restarts=2, on_failure={"communication": "always", "cuda": "never"})
    comm = failed("RuntimeError: Connection reset by peer (communication)", progressed=True)
    assert decide(comm, policy, 50, 0, 0, 600).state is JobState.RESTARTING
    crash = failed(None, progressed=True)
    assert decide(crash, policy, 5, 0, 0, 600, class_counts={"communication": 4, "crash": 1}).state is JobState.RESTARTING
    assert decide(crash, policy, 5, 0, 0, 600, class_counts={"communication": 3, "crash": 2}).state is JobState.FAILED
    d = run(failed("RuntimeError: CUDA error: x (cuda)", progressed=True), policy=policy)
    assert d.state is JobState.FAILED and "restart.on_failure.cuda is never" in d.reason


def test_preemption_is_always_restarted_even_without_progress():
    d = run(failed(None, code=75, preempted=True), restarts=10, streak=5, policy=Restart(max_restarts=1))
    assert (d.state, d.reason_class) == (JobState.RESTARTING, "preempted")
