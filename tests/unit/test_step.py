"""The supervisor's step function, one test per edge, by scripting observations (no processes).

Each test drives `step` with the observations the executor would report and checks the state and the
actions it returns — the torch elastic agent's and supervisord's state tests are the models.
"""

from __future__ import annotations

import signal
import threading
from dataclasses import replace

import pytest

from spx.daemon.core.spec import Restart
from spx.daemon.run import step as st
from spx.daemon.run import step_types
from spx.daemon.run.step_types import (
    ActionFailed,
    AllGone,
    CancelRequested,
    CheckpointFound,
    DaemonStopping,
    Diagnose,
    Diagnosed,
    DumpStacks,
    FindCheckpoint,
    FinishAttempt,
    Go,
    GpuFault,
    HeartbeatSeen,
    LauncherExited,
    LeaseLost,
    Log,
    MarkStarting,
    Note,
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

LIMITS = step_types.Limits(grace_seconds=30, hang_timeout_seconds=60, healthy_seconds=600,
                   restart=Restart(max_restarts=3, backoff_seconds=(10, 300)))
WALL0 = 1_000_000.0


def kinds(actions):
    """The actions that act (logs and notes to the attempt log left out)."""
    return [type(a) for a in actions if not isinstance(a, Log | Note)]


def logs(actions):
    return [a.event for a in actions if isinstance(a, Log)]


def only(actions, kind):
    found = [a for a in actions if isinstance(a, kind)]
    assert len(found) == 1, actions
    return found[0]


def ready(job_state=JobState.QUEUED, **kw):
    return st.placed(1, "job", kw.pop("limits", LIMITS), job_state, kw.pop("gpus", ()), **kw)


def running(now=0.0, **kw):
    """A job whose attempt 1 (or the next one) is up, launched at `now`."""
    s, _ = st.step(ready(**kw), Go((0, 1)), now)
    s, _ = st.step(s, CheckpointFound(None, None, s.number), now)
    s, _ = st.step(s, Spawned(4242, WALL0 + now), now)
    return s


def ended(s, now, code=1, sig=None):
    """The launcher exits with (code, sig) and nothing is left."""
    s, _ = st.step(s, LauncherExited(code, sig), now)
    return st.step(s, AllGone(), now)


# --- starting ------------------------------------------------------------------------------------------


def test_ready_to_preparing_on_go_marks_starting_and_finds_the_checkpoint():
    s, actions = st.step(ready(), Go((2, 3)), 5.0)
    assert (s.phase, s.job_state, s.gpus, s.number) == (Phase.PREPARING, JobState.STARTING, (2, 3), 1)
    assert actions == [MarkStarting((2, 3), "GPUs allocated"), FindCheckpoint(1)]


def test_restarting_to_starting_on_go_says_relaunching():
    s, actions = st.step(ready(JobState.RESTARTING, number=2, gpus=(0,)), Go((0,)), 0.0)
    assert actions == [MarkStarting((0,), "relaunching"), FindCheckpoint(3)]


def test_starting_job_found_at_daemon_start_goes_without_a_second_mark():
    s, actions = st.step(ready(JobState.STARTING, gpus=(0,)), Go((0,)), 0.0)
    assert actions == [FindCheckpoint(1)] and s.phase is Phase.PREPARING


def test_ready_to_staging_on_go_when_the_job_stages_data():
    s, actions = st.step(ready(limits=replace(LIMITS, stages=True)), Go(()), 0.0)
    assert s.phase is Phase.STAGING and kinds(actions) == [MarkStarting, StartStaging]


def test_staging_to_preparing_when_the_copier_succeeds():
    s, _ = st.step(ready(limits=replace(LIMITS, stages=True)), Go(()), 0.0)
    s, actions = st.step(s, StagingEnded(True, "staged 3 files"), 4.0)
    assert s.phase is Phase.PREPARING and s.staged and kinds(actions) == [FindCheckpoint]


def test_staging_to_failed_when_the_copier_fails():
    s, _ = st.step(ready(limits=replace(LIMITS, stages=True)), Go(()), 0.0)
    s, actions = st.step(s, StagingEnded(False, "staging failed: no space"), 4.0)
    finish = only(actions, FinishAttempt)
    assert s.phase is Phase.DONE and (finish.number, finish.state, finish.reason) == (0, JobState.FAILED,
                                                                                      "staging failed: no space")
    assert finish.release_gpus


def test_staging_to_failed_when_the_copier_cannot_start():
    s, _ = st.step(ready(limits=replace(LIMITS, stages=True)), Go(()), 0.0)
    s, actions = st.step(s, ActionFailed(StartStaging(), "PermissionError: /data"), 0.0)
    assert s.phase is Phase.DONE and only(actions, FinishAttempt).reason == "staging failed: PermissionError: /data"


def test_preparing_spawns_from_the_checkpoint_found():
    s, _ = st.step(ready(), Go((0,)), 0.0)
    s, actions = st.step(s, CheckpointFound("/c/step-000000020", 20, 1), 1.0)
    assert actions == [Spawn(1, "/c/step-000000020", 20)] and s.resumed_from_step == 20


def test_preparing_to_running_on_spawned():
    s = running(3.0)
    assert (s.phase, s.job_state, s.started, s.started_wall) == (Phase.RUNNING, JobState.RUNNING, 3.0, WALL0 + 3.0)


def test_preparing_to_failed_when_the_owner_is_deleted():
    s, _ = st.step(ready(), Go((0,)), 0.0)
    s, actions = st.step(s, ActionFailed(FindCheckpoint(1), "UserPathError: uid 4321 has no account"), 1.0)
    finish = only(actions, FinishAttempt)
    assert s.phase is Phase.DONE and finish.state is JobState.FAILED and finish.number == 0
    assert finish.reason == "cannot prepare the attempt: UserPathError: uid 4321 has no account"


def test_preparing_to_failed_on_spawn_failure_with_the_reason():
    s, _ = st.step(ready(), Go((0,)), 0.0)
    s, _ = st.step(s, CheckpointFound(None, None, 1), 0.0)
    s, actions = st.step(s, ActionFailed(Spawn(1, None, None), "FileNotFoundError: /x/python"), 0.0)
    finish = only(actions, FinishAttempt)
    assert s.phase is Phase.DONE
    assert (finish.number, finish.state, finish.reason, finish.reason_class) == (
        1, JobState.FAILED, "launch failed: FileNotFoundError: /x/python", "launch")


def test_preparing_to_failed_when_checkpoint_discovery_never_answers():
    s, _ = st.step(ready(), Go((0,)), 0.0)
    s, actions = st.step(s, Tick(), st.CHECKPOINT_DEADLINE_SECONDS - 1)
    assert s.phase is Phase.PREPARING and actions == []
    s, actions = st.step(s, Tick(), st.CHECKPOINT_DEADLINE_SECONDS + 1)
    assert s.phase is Phase.DONE and "did not finish" in only(actions, FinishAttempt).reason


# --- running -------------------------------------------------------------------------------------------


def test_running_heartbeat_progress_restarts_the_hang_clock():
    s = running()
    s, _ = st.step(s, HeartbeatSeen(5, WALL0 + 10, "running"), 10.0)
    s, _ = st.step(s, HeartbeatSeen(6, WALL0 + 50, "running"), 50.0)
    s, actions = st.step(s, Tick(), 100.0)  # 50 s since the last progress < 60 s
    assert (s.phase, s.last_step, s.last_progress, actions) == (Phase.RUNNING, 6, 50.0, [])


def test_running_heartbeat_without_a_new_step_is_no_progress():
    s = running()
    s, _ = st.step(s, HeartbeatSeen(5, WALL0 + 10, "running"), 10.0)
    s, _ = st.step(s, HeartbeatSeen(5, WALL0 + 40, "running"), 40.0)
    assert s.last_progress == 10.0


def test_running_ignores_the_heartbeat_of_an_earlier_attempt():
    s = running(100.0)
    s, _ = st.step(s, HeartbeatSeen(99, WALL0 + 50, "running"), 101.0)
    assert s.last_step is None and s.last_progress is None


def test_running_without_heartbeats_never_hangs():
    s, actions = st.step(running(), Tick(), 10_000.0)
    assert s.phase is Phase.RUNNING and actions == []


def test_running_to_dumping_on_hang():
    s = running()
    s, _ = st.step(s, HeartbeatSeen(8, WALL0 + 5, "running"), 5.0)
    s, actions = st.step(s, Tick(), 66.0)
    assert s.phase is Phase.DUMPING and s.stop_cause == "hang" and s.hang_idle == 61.0
    assert logs(actions) == ["hang_detected"] and actions[-1] == DumpStacks(1)


def hung():
    s = running()
    s, _ = st.step(s, HeartbeatSeen(8, WALL0 + 5, "running"), 5.0)
    return st.step(s, Tick(), 66.0)[0]


def test_dumping_to_stopping_when_the_stacks_are_dumped():
    s, actions = st.step(hung(), StacksDumped(1), 70.0)
    assert s.phase is Phase.STOPPING and s.term_at == 70.0 and actions == [SignalTerm()]


def test_dumping_to_stopping_when_the_dump_does_not_come_back_in_time():
    s, actions = st.step(hung(), Tick(), 66.0 + st.DUMP_DEADLINE_SECONDS + 1)
    assert s.phase is Phase.STOPPING and kinds(actions) == [SignalTerm] and logs(actions) == ["stack_dump_timed_out"]


def test_dumping_to_stopping_when_the_dump_fails():
    s, actions = st.step(hung(), ActionFailed(DumpStacks(1), "py-spy: permission denied"), 67.0)
    assert s.phase is Phase.STOPPING and kinds(actions) == [SignalTerm]


def test_stopping_sends_sigkill_after_the_grace_and_repeats_it_each_second():
    s, _ = st.step(hung(), StacksDumped(1), 70.0)
    s, actions = st.step(s, Tick(), 99.0)
    assert actions == []
    s, actions = st.step(s, Tick(), 100.0)
    assert actions == [Note("grace of 30 s over; SIGKILL"), SignalKill()]
    s, actions = st.step(s, Tick(), 100.5)
    assert actions == []
    s, actions = st.step(s, Tick(), 101.0)
    assert actions == [SignalKill()]


def test_hang_then_term_grace_kill_gone_restarts_with_backoff():
    s, _ = st.step(hung(), StacksDumped(1), 70.0)
    s, _ = st.step(s, Tick(), 100.0)
    s, actions = st.step(s, LauncherExited(None, signal.SIGKILL), 100.2)
    assert s.phase is Phase.EXITED and actions == [SignalKill(), RecordExit(1, None, signal.SIGKILL, "hang")]
    s, actions = st.step(s, AllGone(), 100.4)
    assert s.phase is Phase.DIAGNOSING and actions == [RemoveCgroup(), Diagnose(1, root_cause=True, oom=False)]
    s, actions = st.step(s, Diagnosed(1, None, False), 101.0)
    finish = only(actions, FinishAttempt)
    assert (finish.state, finish.reason_class, finish.backoff_remaining) == (JobState.RESTARTING, "hang", 10)
    assert finish.reason.startswith("hang: no step progress for 61 s") and finish.max_step == 8
    assert s.phase is Phase.BACKOFF and s.restarts == 1


def test_running_to_exited_on_launcher_exit_kills_leftovers_and_stores_the_status_at_once():
    s, actions = st.step(running(), LauncherExited(0, None), 20.0)
    assert s.phase is Phase.EXITED and (s.exit_code, s.exit_signal) == (0, None)
    assert actions == [SignalKill(), RecordExit(1, 0, None, None)]


def test_exited_keeps_killing_leftovers_and_warns_about_them():
    s, _ = st.step(running(), LauncherExited(1, None), 20.0)
    s, actions = st.step(s, Tick(), 21.0)
    assert actions == [SignalKill()]
    s, actions = st.step(s, Tick(), 20.0 + st.LEFTOVER_WARN_SECONDS + 0.5)
    assert SignalKill() in actions and logs(actions) == ["leftover_processes"] and s.phase is Phase.EXITED


def test_exit_0_to_succeeded():
    s, actions = ended(running(), 30.0, code=0)
    finish = only(actions, FinishAttempt)
    assert s.phase is Phase.DONE and (finish.state, finish.reason, finish.release_gpus) == (
        JobState.SUCCEEDED, "exit code 0", True)
    assert actions[0] == RemoveCgroup() and not any(isinstance(a, Diagnose) for a in actions)


def test_crash_is_diagnosed_off_the_loop_then_backs_off_with_remaining_seconds():
    s, actions = ended(running(), 30.0, code=1)
    assert s.phase is Phase.DIAGNOSING and only(actions, Diagnose) == Diagnose(1, root_cause=True, oom=True)
    s, actions = st.step(s, Diagnosed(1, "ValueError: lr must be positive", False), 30.5)
    finish = only(actions, FinishAttempt)
    assert (finish.state, finish.reason, finish.root_cause) == (JobState.RESTARTING, "exit code 1",
                                                                "ValueError: lr must be positive")
    assert finish.backoff_remaining == 10 and not finish.release_gpus, "a restarting job keeps its GPUs"
    assert s.phase is Phase.BACKOFF and s.backoff_remaining == 10


def test_oom_diagnosis_classes_the_failure():
    s, _ = ended(running(), 30.0, code=None, sig=signal.SIGKILL)
    s, actions = st.step(s, Diagnosed(1, None, True), 31.0)
    assert only(actions, FinishAttempt).reason_class == "oom"


def test_diagnosing_to_recorded_when_the_diagnosis_never_comes():
    s, _ = ended(running(), 30.0, code=1)
    s, actions = st.step(s, Tick(), 30.0 + st.DIAGNOSE_DEADLINE_SECONDS + 1)
    assert only(actions, FinishAttempt).root_cause is None and s.phase is Phase.BACKOFF


def test_diagnosis_that_fails_records_the_end_without_it():
    s, _ = ended(running(), 30.0, code=1)
    s, actions = st.step(s, ActionFailed(Diagnose(1, True, True), "OSError: EIO"), 31.0)
    assert only(actions, FinishAttempt).state is JobState.RESTARTING


def test_backoff_counts_down_in_monotonic_time_to_ready():
    s, _ = ended(running(), 30.0, code=1)
    s, _ = st.step(s, Diagnosed(1, None, False), 30.0)
    s, _ = st.step(s, Tick(), 34.0)
    assert s.phase is Phase.BACKOFF and s.backoff_remaining == 6 and not s.ready
    s, _ = st.step(s, Tick(), 40.0)
    assert s.phase is Phase.READY and s.ready


def test_backoff_then_go_relaunches_as_attempt_2():
    s, _ = ended(running(), 30.0, code=1)
    s, _ = st.step(s, Diagnosed(1, None, False), 30.0)
    s, _ = st.step(s, Tick(), 41.0)
    s, actions = st.step(s, Go((0, 1)), 41.0)
    assert actions == [MarkStarting((0, 1), "relaunching"), FindCheckpoint(2)] and s.number == 2


def _three_quick_crashes(resume_steps: dict[int, int | None]) -> tuple[step_types.JobStep, FinishAttempt]:
    """Three attempts that each fail at once with no heartbeat; attempt n resumes resume_steps[n]."""
    s, actions = running(), []
    for n in range(1, 4):
        s, _ = ended(s, 10.0 * n, code=1)
        s, actions = st.step(s, Diagnosed(n, None, False), 10.0 * n)
        if n < 3:
            step = resume_steps.get(n + 1)
            s = replace(s, phase=Phase.READY, backoff_remaining=0.0)
            s, _ = st.step(s, Go((0, 1)), 10.0 * n)
            s, _ = st.step(s, CheckpointFound(None if step is None else f"/ck/step-{step}", step, n + 1), 10.0 * n)
            s, _ = st.step(s, Spawned(1000 + n, WALL0), 10.0 * n)
    return s, only(actions, FinishAttempt)


def test_crash_loop_to_failed():
    s, finish = _three_quick_crashes({})
    assert s.phase is Phase.DONE and finish.state is JobState.FAILED and finish.reason.startswith("crash loop")


def test_an_attempt_that_left_a_newer_checkpoint_made_progress_without_a_heartbeat():
    """A script without a heartbeat trains, checkpoints and crashes; the next two attempts crash on
    its newest checkpoint. That is 2 attempts without progress, not 3: the job is relaunched (and
    the crash-loop fallback resumes an older checkpoint), not failed as a crash loop."""
    s, finish = _three_quick_crashes({2: 40, 3: 40})
    assert finish.state is JobState.RESTARTING and s.no_progress_streak == 2, finish


def test_max_restarts_counts_only_the_jobs_own_faults():
    """max_restarts 1: one real crash is restarted even after a daemon restart ended an attempt."""
    limits = replace(LIMITS, restart=Restart(max_restarts=1, backoff_seconds=(1, 1)))
    s = running(limits=limits)
    s, _ = st.step(s, DaemonStopping(), 1.0)   # daemon stop: attempt 1 ends, not the job's fault
    s, actions = ended(s, 2.0, code=None, sig=signal.SIGTERM)
    assert only(actions, FinishAttempt).reason_class == "daemon-restart" and s.restarts == 0
    s = replace(s, phase=Phase.READY, daemon_stopping=False)
    s, _ = st.step(s, Go((0,)), 3.0)
    s, _ = st.step(s, CheckpointFound(None, None, 2), 3.0)
    s, _ = st.step(s, Spawned(77, WALL0 + 3), 3.0)
    s, _ = st.step(s, HeartbeatSeen(1, WALL0 + 4, "running"), 4.0)
    s, _ = ended(s, 5.0, code=1)
    s, actions = st.step(s, Diagnosed(2, None, False), 5.0)
    assert only(actions, FinishAttempt).state is JobState.RESTARTING, "the first real crash is restarted"


# --- stops ---------------------------------------------------------------------------------------------


def test_cancel_during_backoff_cancels_without_an_attempt():
    s, actions = st.step(ready(JobState.RESTARTING, backoff_remaining=30.0), CancelRequested("uid 1000"), 1.0)
    finish = only(actions, FinishAttempt)
    assert s.phase is Phase.DONE and (finish.number, finish.state, finish.reason, finish.release_gpus) == (
        0, JobState.CANCELLED, "cancelled by uid 1000", True)


def test_cancel_while_running_sends_sigterm_and_gives_the_grace():
    s, actions = st.step(running(), CancelRequested("root"), 10.0)
    assert (s.phase, s.stop_cause, s.term_at) == (Phase.STOPPING, "cancel", 10.0)
    assert kinds(actions) == [RecordStop, SignalTerm], "the cancel is stored: it outlives a daemon restart"
    assert only(actions, RecordStop) == RecordStop(1, "cancel")
    s, actions = st.step(s, Tick(), 39.0)
    assert actions == []
    s, actions = ended(s, 45.0, code=0)
    assert only(actions, FinishAttempt).state is JobState.CANCELLED


def test_a_cancelled_attempt_says_who_cancelled_and_gets_no_root_cause():
    """Workers killed by the cancel's SIGTERM exit non-zero (torchrun: SignalException, signal 15);
    that is the user's decision, not a failure: no log is read for a root cause."""
    s, _ = st.step(running(), CancelRequested("alice"), 10.0)
    s, actions = ended(s, 12.0, code=1)
    finish = only(actions, FinishAttempt)
    assert not [a for a in actions if isinstance(a, Diagnose)]
    assert (finish.state, finish.reason, finish.root_cause) == (JobState.CANCELLED, "cancelled by alice", None)


def test_cancel_while_stopping_wins_without_a_second_sigterm():
    s, _ = st.step(hung(), StacksDumped(1), 70.0)
    s, actions = st.step(s, CancelRequested("root"), 71.0)
    assert s.stop_cause == "cancel" and actions[1:] == [RecordStop(1, "cancel")]
    s, actions = ended(s, 72.0, code=0)
    assert only(actions, FinishAttempt).state is JobState.CANCELLED


def test_cancel_while_preparing_cancels_and_the_late_checkpoint_is_ignored():
    s, _ = st.step(ready(), Go((0,)), 0.0)
    s, actions = st.step(s, CancelRequested("root"), 1.0)
    assert s.phase is Phase.DONE and only(actions, FinishAttempt).state is JobState.CANCELLED
    s, actions = st.step(s, CheckpointFound(None, None, 1), 2.0)
    assert s.phase is Phase.DONE and actions == []


def test_cancel_while_staging_stops_the_copier():
    s, _ = st.step(ready(limits=replace(LIMITS, stages=True)), Go(()), 0.0)
    s, actions = st.step(s, CancelRequested("root"), 1.0)
    assert kinds(actions) == [StopStaging, FinishAttempt] and s.phase is Phase.DONE


def test_daemon_stopping_sends_sigterm_and_the_restart_waits_for_the_next_daemon():
    s, actions = st.step(running(), DaemonStopping(), 10.0)
    assert s.stop_cause == "daemon-stop" and kinds(actions) == [RecordStop, SignalTerm]
    s, actions = ended(s, 12.0, code=None, sig=signal.SIGTERM)
    finish = only(actions, FinishAttempt)
    assert (finish.state, finish.reason, finish.backoff_remaining) == (
        JobState.RESTARTING, "daemon stopped; resumes on next start", 0.0)
    assert s.phase is Phase.DONE


def test_daemon_stopping_in_backoff_stores_the_remaining_seconds():
    s = ready(JobState.RESTARTING, backoff_remaining=30.0, now=0.0)
    s, _ = st.step(s, Tick(), 12.0)
    s, actions = st.step(s, DaemonStopping(), 12.0)
    assert s.phase is Phase.DONE and actions == [SaveBackoff(18.0)]


def test_daemon_stopping_while_staging_stops_the_copier_for_a_later_resume():
    s, _ = st.step(ready(limits=replace(LIMITS, stages=True)), Go(()), 0.0)
    s, actions = st.step(s, DaemonStopping(), 1.0)
    assert s.phase is Phase.DONE and actions == [StopStaging()]


def test_daemon_stopping_while_ready_leaves_the_job_for_the_next_daemon():
    s, actions = st.step(ready(JobState.RESTARTING), DaemonStopping(), 1.0)
    assert s.phase is Phase.DONE and actions == []


# --- after a daemon restart ------------------------------------------------------------------------------


def test_a_running_attempt_is_adopted_as_it_is_and_supervised_on():
    """Jobs outlive the daemon: no signal, no store write; heartbeats, hangs and its exit go on."""
    base = ready(JobState.RUNNING, gpus=(0, 1), number=3, restarts=1)
    s, actions = st.adopted(base, 3, WALL0, 40, now=100.0, ran_seconds=30.0)
    assert (s.phase, s.stop_cause, s.term_at, s.number, s.started) == (Phase.RUNNING, None, None, 3, 70.0)
    assert kinds(actions) == [], "nothing signalled, nothing written"
    s, _ = st.step(s, HeartbeatSeen(41, WALL0 + 1, "running"), 101.0)
    assert s.last_progress == 101.0, "the hang clock starts at the first heartbeat seen"
    s, actions = st.step(s, LauncherExited(0, None), 150.0)
    assert RecordExit(3, 0, None, None) in actions
    s, actions = st.step(s, AllGone(), 150.5)
    finish = only(actions, FinishAttempt)
    assert (finish.number, finish.state) == (3, JobState.SUCCEEDED)


def test_an_adopted_attempt_that_stops_beating_is_a_hang():
    s, _ = st.adopted(ready(JobState.RUNNING), 1, WALL0, None, now=0.0)
    s, _ = st.step(s, HeartbeatSeen(5, WALL0 + 1, "running"), 1.0)
    s, actions = st.step(s, Tick(), 1.0 + LIMITS.hang_timeout_seconds + 1)
    assert s.phase is Phase.DUMPING and RecordStop(1, "hang") in actions


def test_an_adopted_attempt_can_be_cancelled():
    s, _ = st.adopted(ready(JobState.RUNNING), 1, WALL0, None, now=0.0)
    s, actions = st.step(s, CancelRequested("alice"), 1.0)
    assert s.phase is Phase.STOPPING and SignalTerm() in actions
    s, actions = ended(s, 2.0, code=None, sig=signal.SIGTERM)
    assert only(actions, FinishAttempt).state is JobState.CANCELLED


def test_adopted_attempt_whose_exit_was_stored_is_decided_on_it():
    """The daemon died after the launcher exited 0 but before the end was recorded: success, not a rerun."""
    s, actions = st.adopted(ready(JobState.RUNNING), 1, WALL0, None, 0.0, ended=LauncherExited(0, None))
    assert s.phase is Phase.EXITED and SignalKill() in actions
    s, actions = st.step(s, AllGone(), 0.5)
    assert only(actions, FinishAttempt).state is JobState.SUCCEEDED and s.phase is Phase.DONE


def test_adopted_attempt_with_a_recorded_crash_counts_as_the_jobs_fault():
    s, _ = st.adopted(ready(JobState.RUNNING), 1, WALL0, None, 0.0, ended=LauncherExited(1, None))
    s, _ = st.step(s, AllGone(), 0.5)
    s, actions = st.step(s, Diagnosed(1, None, False), 1.0)
    finish = only(actions, FinishAttempt)
    assert (finish.state, finish.reason_class, s.restarts) == (JobState.RESTARTING, "crash", 1)


def test_an_adopted_attempt_the_old_daemon_was_cancelling_is_still_cancelled():
    """The cancel was stored before its SIGTERM: the stop goes on with a fresh grace, no second SIGTERM."""
    s, actions = st.adopted(ready(JobState.RUNNING), 1, WALL0, None, 0.0, stop_cause="cancel")
    assert (s.phase, s.stop_cause, s.term_at) == (Phase.STOPPING, "cancel", 0.0) and kinds(actions) == []
    s, actions = st.step(s, Tick(), LIMITS.grace_seconds + 0.1)
    assert SignalKill() in actions
    s, actions = ended(s, LIMITS.grace_seconds + 1, code=None, sig=signal.SIGKILL)
    assert only(actions, FinishAttempt).state is JobState.CANCELLED


def test_a_hang_is_stored_as_the_stop_cause_before_the_stop():
    s = running()
    s, _ = st.step(s, HeartbeatSeen(8, WALL0 + 5, "running"), 5.0)
    s, actions = st.step(s, Tick(), 66.0)
    assert RecordStop(1, "hang") in actions


def test_adopted_attempt_stopped_by_the_daemon_before_is_still_not_the_jobs_fault():
    s, _ = st.adopted(ready(JobState.RUNNING), 1, WALL0, None, 0.0, stop_cause="daemon-stop",
                      ended=LauncherExited(None, 15))
    s, actions = st.step(s, AllGone(), 0.5)
    finish = only(actions, FinishAttempt)
    assert (finish.state, finish.reason_class, s.restarts) == (JobState.RESTARTING, "daemon-restart", 0)


def test_a_stop_signal_whose_cause_was_never_stored_is_not_the_jobs_fault():
    """The monitor saw a stop signal (only root sends one) but no daemon lived to store why."""
    s, _ = st.adopted(ready(JobState.RUNNING), 1, WALL0, None, 0.0, ended=LauncherExited(None, 15, stopped=True))
    s, actions = st.step(s, AllGone(), 0.5)
    assert only(actions, FinishAttempt).reason_class == "daemon-restart" and s.restarts == 0


def test_adopted_attempt_whose_launch_never_happened_is_not_the_jobs_fault():
    """The daemon died mid-spawn: the shim never got its request and exited 1; not a crash of the job."""
    s, actions = st.adopted(ready(JobState.RUNNING), 1, WALL0, None, 0.0, ended=LauncherExited(1, None, launched=False))
    assert s.stop_cause == "lost" and RecordExit(1, 1, None, "lost") in actions
    s, actions = st.step(s, AllGone(), 0.5)
    finish = only(actions, FinishAttempt)
    assert (finish.state, finish.reason_class, s.restarts, s.phase) == (JobState.RESTARTING, "lost", 0, Phase.READY)


def test_adopted_attempt_whose_unconfirmed_launch_exited_0_succeeded():
    """The daemon died after the exec but before storing the pgid; the job ran to its end meanwhile."""
    s, _ = st.adopted(ready(JobState.RUNNING), 1, WALL0, None, 0.0, ended=LauncherExited(0, None, launched=False))
    s, actions = st.step(s, AllGone(), 0.5)
    assert only(actions, FinishAttempt).state is JobState.SUCCEEDED


def test_a_lost_attempt_is_relaunched_at_once_without_counting():
    """Its monitor is gone without a record: how it ended is unknown; nothing is stored as its exit."""
    s, actions = st.adopted(ready(JobState.RUNNING, restarts=2), 1, WALL0, None, 0.0, ended=LauncherExited(None, None, lost=True))
    assert s.stop_cause == "lost" and not any(isinstance(a, RecordExit) for a in actions)
    s, actions = st.step(s, AllGone(), 0.5)
    finish = only(actions, FinishAttempt)
    assert (finish.state, finish.reason_class, finish.backoff_remaining, s.restarts) == (JobState.RESTARTING, "lost", 0.0, 2)
    assert finish.reason.startswith("lost")


def test_a_lost_attempt_whose_heartbeat_says_finished_succeeds():
    s, _ = st.adopted(ready(JobState.RUNNING), 1, WALL0, None, 0.0)
    s, _ = st.step(s, HeartbeatSeen(500, WALL0 + 1, "finished"), 0.1)
    s, actions = st.step(s, LauncherExited(None, None, lost=True), 0.5)
    s, actions = st.step(s, AllGone(), 0.6)
    assert only(actions, FinishAttempt).state is JobState.SUCCEEDED


def test_a_stored_backoff_resumes_with_its_remaining_seconds():
    s = ready(JobState.RESTARTING, backoff_remaining=7.5, now=100.0)
    assert s.phase is Phase.BACKOFF
    s, _ = st.step(s, Tick(), 105.0)
    assert s.backoff_remaining == 2.5
    s, _ = st.step(s, Tick(), 108.0)
    assert s.ready


def test_stacks_dumped_after_the_attempt_is_gone_are_ignored():
    s, _ = st.step(hung(), LauncherExited(1, None), 67.0)
    s, _ = st.step(s, AllGone(), 67.5)
    before = s
    s, actions = st.step(s, StacksDumped(1), 68.0)
    assert actions == [] and replace(s, clock=before.clock) == before


# --- failures of actions -----------------------------------------------------------------------------------


def test_a_store_write_refused_is_retried_next_tick_and_blocks_the_relaunch():
    s, _ = ended(running(), 30.0, code=1)
    s, actions = st.step(s, Diagnosed(1, None, False), 30.0)
    finish = only(actions, FinishAttempt)
    s, actions = st.step(s, ActionFailed(finish, "database or disk is full", retry=True), 30.0)
    assert s.retry == (finish,) and logs(actions) == ["store_write_deferred"]
    s, actions = st.step(s, Tick(), 45.0)  # backoff over, the write re-emitted …
    assert actions == [finish]
    s, _ = st.step(s, ActionFailed(finish, "database or disk is full", retry=True), 45.0)
    assert s.phase is Phase.READY and not s.ready, "… refused again: no relaunch before it is in"
    s, actions = st.step(s, Tick(), 46.0)
    assert actions == [finish] and s.ready


def test_a_job_with_a_pending_write_is_not_ready():
    s = replace(ready(JobState.RESTARTING), retry=(SaveBackoff(1.0),))
    assert not s.ready
    s, actions = st.step(s, Tick(), 1.0)
    assert actions == [SaveBackoff(1.0)] and s.ready


def test_a_store_write_failing_for_good_gives_up_on_the_job():
    s, actions = ended(running(), 30.0, code=0)
    finish = only(actions, FinishAttempt)
    s, actions = st.step(s, ActionFailed(finish, "IllegalTransition: failed → succeeded"), 30.0)
    assert s.phase is Phase.DONE and logs(actions) == ["store_write_failed"]


def test_a_failed_signal_is_logged_and_escalation_goes_on():
    s, _ = st.step(running(), CancelRequested("root"), 0.0)
    s, actions = st.step(s, ActionFailed(SignalTerm(), "PermissionError"), 0.0)
    assert s.phase is Phase.STOPPING and logs(actions) == ["action_failed"]
    s, actions = st.step(s, Tick(), 31.0)
    assert kinds(actions) == [SignalKill]


@pytest.mark.parametrize("phase_of", ["running", "ready"])
def test_fault_fails_the_job_with_the_error_and_kills_what_runs(phase_of):
    s = running() if phase_of == "running" else ready(JobState.RESTARTING)
    s, actions = st.fault(s, "KeyError: 'getpwuid(): uid not found: 4321'", 5.0)
    finish = only(actions, FinishAttempt)
    assert s.phase is Phase.DONE and finish.state is JobState.FAILED and finish.release_gpus
    assert finish.reason == "daemon error: KeyError: 'getpwuid(): uid not found: 4321'"
    if phase_of == "running":
        assert SignalKill() in actions and finish.number == 1
    else:
        assert SignalKill() not in actions and finish.number == 0


# --- containment: the supervisor with a real store and executor (no job processes) ---------------------


class MainLoop:
    """The main loop's side of the supervisor, played by the test: its clock, moved on by hand, and
    the executor's wake (slow work sent off the loop came back) as an event to wait on."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.woke = threading.Event()

    def clock(self) -> float:
        return self.now

    def wake(self) -> None:
        self.woke.set()


@pytest.fixture
def supervised(tmp_path):
    from spx.daemon.core.config import load_config
    from spx.daemon.run.supervisor import Supervisor
    from spx.daemon.state.store import Store

    cfg = load_config(None, tmp_path / "root")
    for d in (cfg.log_dir, cfg.run_dir, cfg.checkpoints_root):
        d.mkdir(parents=True, exist_ok=True)
    store = Store(cfg.store_path)
    loop = MainLoop()
    sup = Supervisor(cfg, store, wake=loop.wake, clock=loop.clock)
    yield sup, store, loop
    sup.close(wait=True)
    store.close()


def _add(store, name, owner_uid=0):
    from spx.daemon.core.spec import parse_spec

    return store.jobs.add(parse_spec(f"name: {name}\nscript: /bin/true\n"), owner_uid, "someone", f"/spool/{name}", 1.0)


def _turns_until(sup, loop, predicate, turns=10):
    """Main-loop turns until `predicate` holds, the clock one second on after each (a short backoff
    runs out); a bounded count of turns, not a wait."""
    for _ in range(turns):
        if predicate():
            return
        sup.tick()
        loop.now += 1.0
    assert predicate(), f"not within {turns} turns of the main loop"


def test_a_deleted_owner_fails_only_that_job_with_the_reason(supervised):
    from spx.daemon.run.scheduler import Start

    sup, store, loop = supervised
    gone = _add(store, "orphan", owner_uid=54321)  # no such account
    sup.start(Start(gone, (), store.jobs.get(gone)))
    assert loop.woke.wait(15), "the attempt's preparation, off the loop, came back"
    _turns_until(sup, loop, lambda: store.jobs.get(gone).state is JobState.FAILED)
    reason = store.jobs.get(gone).reason or ""
    assert reason.startswith("cannot prepare the attempt") and "54321" in reason, reason
    assert gone not in sup.tracked()


def test_a_bug_in_one_jobs_step_fails_that_job_and_the_others_go_on(supervised, monkeypatch):
    sup, store, loop = supervised
    ids = {}
    for name in ("buggy", "bystander"):
        ids[name] = _add(store, name)
        store.jobs.transition(ids[name], JobState.STARTING, "starting", 2.0)
        store.jobs.transition(ids[name], JobState.RESTARTING, "exit code 1", 3.0, backoff_remaining=0.3)
    real_step = st.step

    def step_with_a_bug(s, obs, now):
        if s.name == "buggy":
            raise ZeroDivisionError("injected")
        return real_step(s, obs, now)

    monkeypatch.setattr(st, "step", step_with_a_bug)
    sup.recover()
    _turns_until(sup, loop, lambda: any(w.job_id == ids["bystander"] for w in sup.waiting()))
    buggy = store.jobs.get(ids["buggy"])
    assert buggy.state is JobState.FAILED and buggy.reason == "daemon error: ZeroDivisionError: injected"
    assert store.jobs.get(ids["bystander"]).state is JobState.RESTARTING and ids["buggy"] not in sup.tracked()


def test_a_refused_store_write_is_kept_and_retried_on_the_next_tick(supervised, monkeypatch):
    from spx.daemon.state.db import StoreUnavailable

    sup, store, loop = supervised
    jid = _add(store, "patient")
    store.jobs.transition(jid, JobState.STARTING, "starting", 2.0)
    store.jobs.transition(jid, JobState.RESTARTING, "exit code 1", 3.0, backoff_remaining=60.0)
    sup.recover()
    real = store.attempts.finish
    refusals = []

    def full_disk(*args, **kwargs):
        if len(refusals) < 2:
            refusals.append(1)
            raise StoreUnavailable("state store: database or disk is full")
        return real(*args, **kwargs)

    monkeypatch.setattr(store.attempts, "finish", full_disk)
    sup.cancel(store.jobs.get(jid), "root")
    assert store.jobs.get(jid).state is JobState.RESTARTING and sup.store_problem()
    _turns_until(sup, loop, lambda: store.jobs.get(jid).state is JobState.CANCELLED)
    assert len(refusals) == 2 and sup.store_problem() is None and jid not in sup.tracked()


def test_writes_queue_behind_a_refused_one_so_a_spawn_never_precedes_its_mark():
    s, actions = st.step(ready(), Go((0,)), 0.0)
    mark = only(actions, MarkStarting)
    s, _ = st.step(s, ActionFailed(mark, "database is locked", retry=True), 0.0)
    s, actions = st.step(s, CheckpointFound(None, None, 1), 0.5)
    assert actions == [] and s.retry == (mark, Spawn(1, None, None)), "the spawn waits for the mark"
    s, actions = st.step(s, Tick(), 1.0)
    assert actions == [mark, Spawn(1, None, None)] and s.retry == ()


def test_the_status_line_says_when_the_state_store_refuses_writes():
    from spx.daemon.service.status_line import format_status

    text = format_status([], 0, None, 0.0, "state store /s.sqlite: database or disk is full")
    assert text == ("0 running, no GPUs (CPU jobs only); "
                    "STATE STORE NOT WRITABLE: state store /s.sqlite: database or disk is full")
    assert format_status([], 0, None, 0.0) == "0 running, no GPUs (CPU jobs only)"


def test_a_job_stored_running_without_an_attempt_is_relaunched_after_a_restart(supervised):
    sup, store, loop = supervised
    jid = _add(store, "lost")
    store.jobs.transition(jid, JobState.STARTING, "GPUs allocated", 2.0)
    store.jobs.transition(jid, JobState.RUNNING, "fresh start", 3.0)  # its attempt row never made it
    sup.recover()
    _turns_until(sup, loop, lambda: any(w.job_id == jid for w in sup.waiting()))
    job = store.jobs.get(jid)
    assert job.state is JobState.RESTARTING and job.reason.startswith("lost")


def test_backoff_stores_its_countdown_every_15_seconds_so_a_killed_daemon_loses_little():
    s = ready(JobState.RESTARTING, backoff_remaining=40.0, now=0.0)
    s, actions = st.step(s, Tick(), 4.0)  # 36 s left: same 15 s slice as 40, nothing written
    assert actions == []
    s, actions = st.step(s, Tick(), 11.0)  # 29 s left: below 30, a new slice, stored
    assert actions == [SaveBackoff(29.0)]
    s, actions = st.step(s, Tick(), 26.0)  # 14 s left
    assert actions == [SaveBackoff(14.0)] and s.phase is Phase.BACKOFF


def test_an_attempt_that_does_not_exit_after_training_finished_is_killed_and_succeeded():
    """Training done (the "finished" beat comes after the final checkpoint) but the process hangs in
    its exit: a minute later it is a hang at exit, stacks dumped and killed, and the job succeeded."""
    s = running(limits=replace(LIMITS, hang_timeout_seconds=900))
    s, _ = st.step(s, HeartbeatSeen(60, WALL0 + 5, "running"), 5.0)
    s, _ = st.step(s, HeartbeatSeen(60, WALL0 + 6, "finished"), 6.0)
    s, actions = st.step(s, Tick(), 6.0 + st.FINISHED_EXIT_SECONDS - 1)
    assert s.phase is Phase.RUNNING and actions == []
    s, actions = st.step(s, Tick(), 6.0 + st.FINISHED_EXIT_SECONDS + 1)
    assert s.phase is Phase.DUMPING and DumpStacks(1) in actions
    s, _ = st.step(s, StacksDumped(1), 70.0)
    s, actions = ended(s, 71.0, code=None, sig=signal.SIGTERM)
    s, actions = st.step(s, Diagnosed(1, None, False), 72.0) if s.phase is Phase.DIAGNOSING else (s, actions)
    finish = only(actions, FinishAttempt)
    assert finish.state is JobState.SUCCEEDED and finish.reason.startswith("training finished")


def auto(**kw):
    """A running attempt whose hang timeout is calibrated (restart.hang_timeout_seconds unset)."""
    return running(limits=replace(LIMITS, hang_timeout_seconds=None), **kw)


def beats(s, steps_at, status="running"):
    """Heartbeats: (monotonic time, step) pairs, each written one second after the attempt start + t."""
    for t, step_no in steps_at:
        s, _ = st.step(s, HeartbeatSeen(step_no, WALL0 + t, status), t)
    return s


def test_fast_steps_calibrate_the_hang_timeout_to_about_ten_seconds():
    """0.2 s steps, seen through a heartbeat written once a second: hung 10 s after the last step."""
    s = beats(auto(), [(float(t), 5 * t) for t in range(1, 12)])
    assert st.hang_timeout(s) == st.AUTO_HANG_FLOOR_SECONDS
    s, actions = st.step(s, Tick(), 11.0 + 9.5)
    assert s.phase is Phase.RUNNING
    s, actions = st.step(s, Tick(), 11.0 + 10.5)
    assert s.phase is Phase.DUMPING and RecordStop(1, "hang") in actions


def test_a_long_first_step_is_warm_up_not_a_hang():
    """A 60 s first step (compile, loading) is never learned; until 5 intervals are seen the ceiling holds."""
    s = beats(auto(), [(1.0, 0), (61.0, 1), (62.0, 2), (63.0, 3)])
    assert s.step_intervals == (1.0,) and st.hang_timeout(s) == st.AUTO_HANG_CEILING_SECONDS
    s = beats(s, [(64.0 + i, 4 + i) for i in range(5)])
    assert max(s.step_intervals) == 1.0 and st.hang_timeout(s) == st.AUTO_HANG_FLOOR_SECONDS


def test_slow_steps_calibrate_a_longer_timeout_and_a_set_timeout_wins():
    s = beats(auto(), [(30.0 * i, i) for i in range(1, 10)])
    assert st.hang_timeout(s) == 150.0, "5 × the p99 of 30 s intervals"
    fixed = beats(running(limits=replace(LIMITS, hang_timeout_seconds=42.0)), [(30.0 * i, i) for i in range(1, 10)])
    assert st.hang_timeout(fixed) == 42.0


def test_a_checkpoint_is_not_a_hang_and_its_interval_is_not_learned():
    s = beats(auto(), [(float(t), t) for t in range(1, 12)])
    s = beats(s, [(12.0, 11)], status="checkpointing")
    s, _ = st.step(s, Tick(), 12.0 + 120)
    assert s.phase is Phase.RUNNING, "a 2-minute save under the ceiling, not the 10 s calibration"
    s = beats(s, [(133.0, 12)])
    assert max(s.step_intervals) == 1.0 and st.hang_timeout(s) == st.AUTO_HANG_FLOOR_SECONDS


def test_a_classs_rule_counts_only_its_own_earlier_failures():
    """Default rules: an early user-code exception is restarted once; 3 earlier preemptions
    (`always`) and a crash do not use up that one restart, a second user-code failure does."""
    limits = replace(LIMITS, restart=Restart(max_restarts=10, backoff_seconds=(1, 1)))
    s = running(limits=limits, restarts=4, class_counts={"preempted": 3, "crash": 1})
    cause = "rank 0 (pid 7) exited with code 1: ValueError: bad (user-code)"
    s, _ = ended(s, 5.0, code=1)
    s, actions = st.step(s, Diagnosed(1, cause, False), 5.0)
    finish = only(actions, FinishAttempt)
    assert (finish.state, finish.reason_class) == (JobState.RESTARTING, "user-code")
    assert dict(s.class_counts) == {"preempted": 3, "crash": 1, "user-code": 1} and s.restarts == 5
    s = replace(s, phase=Phase.READY, backoff_remaining=0.0)
    s, _ = st.step(s, Go((0,)), 6.0)
    s, _ = st.step(s, CheckpointFound(None, None, 2), 6.0)
    s, _ = st.step(s, Spawned(77, WALL0 + 6), 6.0)
    s, _ = ended(s, 8.0, code=1)
    s, actions = st.step(s, Diagnosed(2, cause, False), 8.0)
    finish = only(actions, FinishAttempt)
    assert (finish.state, finish.reason_class) == (JobState.FAILED, "user-code"), finish.reason


# --- GPU faults (a fatal XID on one of the attempt's GPUs) -----------------------------------------------

XID79 = "XID 79 on GPU 1 (GPU fell off the bus)"


def test_a_gpu_fault_on_its_gpu_stops_the_attempt_like_a_hang_but_without_a_dump():
    s, actions = st.step(running(), GpuFault(1, XID79), 20.0)
    assert (s.phase, s.stop_cause, s.gpu_fault, s.term_at) == (Phase.STOPPING, "gpu-fault", XID79, 20.0)
    assert kinds(actions) == [RecordStop, SignalTerm] and only(actions, RecordStop) == RecordStop(1, "gpu-fault")
    assert logs(actions) == ["gpu_fault_stop"]


def test_a_gpu_fault_on_another_gpu_or_during_a_stop_changes_nothing():
    s = running()
    assert st.step(s, GpuFault(5, "XID 79 on GPU 5 (GPU fell off the bus)"), 20.0) == (replace(s, clock=20.0), [])
    stopping, _ = st.step(s, CancelRequested("root"), 20.0)
    after, actions = st.step(stopping, GpuFault(1, XID79), 21.0)
    assert actions == [] and after.stop_cause == "cancel"


def test_a_gpu_fault_ends_as_class_gpu_fault_and_restarts_past_max_restarts():
    # Three earlier GPU faults and max_restarts 3: gpu-fault is `always`, not counted against it.
    s = running(restarts=3, class_counts={"gpu-fault": 3})
    s, _ = st.step(s, GpuFault(1, XID79), 20.0)
    s, actions = st.step(s, LauncherExited(None, signal.SIGTERM), 22.0)
    assert only(actions, RecordExit).stop_cause == "gpu-fault"
    s, actions = st.step(s, AllGone(), 22.1)
    assert only(actions, Diagnose).root_cause
    s, actions = st.step(s, Diagnosed(1, None, False), 22.5)
    finish = only(actions, FinishAttempt)
    assert (finish.state, finish.reason_class, finish.release_gpus) == (JobState.RESTARTING, "gpu-fault", False)
    assert finish.reason.startswith(f"gpu-fault: {XID79}") and finish.root_cause == XID79
    assert s.phase is Phase.BACKOFF and dict(s.class_counts)["gpu-fault"] == 4


def test_a_gpu_faults_root_cause_is_the_xid_then_what_the_ranks_printed():
    s, _ = st.step(running(), GpuFault(1, XID79), 20.0)
    s, _ = st.step(s, LauncherExited(1, None), 22.0)
    s, _ = st.step(s, AllGone(), 22.1)
    _, actions = st.step(s, Diagnosed(1, "rank 0 (pid 7): RuntimeError: CUDA error: unknown error (cuda)", False), 22.5)
    finish = only(actions, FinishAttempt)
    assert finish.reason_class == "gpu-fault"
    assert finish.root_cause == f"{XID79}; then rank 0 (pid 7): RuntimeError: CUDA error: unknown error (cuda)"


def test_an_attempt_adopted_while_stopped_for_a_gpu_fault_goes_on_stopping():
    s, actions = st.adopted(ready(JobState.RUNNING, gpus=(0, 1)), 1, WALL0, None, 10.0, stop_cause="gpu-fault")
    assert (s.phase, s.stop_cause) == (Phase.STOPPING, "gpu-fault") and SignalTerm() not in actions


def test_a_new_attempt_forgets_the_last_ones_gpu_fault():
    s, _ = st.step(running(), GpuFault(1, XID79), 20.0)
    s = replace(s, phase=Phase.PREPARING)
    s, _ = st.step(s, Spawned(4343, WALL0 + 30), 30.0)
    assert (s.stop_cause, s.gpu_fault) == (None, None)


def test_without_a_heartbeat_idle_gpus_and_a_silent_log_for_the_timeout_are_a_hang():
    s = running(limits=replace(LIMITS, hang_timeout_seconds=30))
    s, _ = st.step(s, step_types.ActivitySeen(True), 5.0)
    s, _ = st.step(s, step_types.ActivitySeen(False), 10.0)
    s, actions = st.step(s, Tick(), 34.0)
    assert s.phase is Phase.RUNNING and actions == []
    s, actions = st.step(s, Tick(), 35.5)
    assert s.phase is Phase.DUMPING and RecordStop(1, "hang") in actions and DumpStacks(1) in actions


def test_activity_keeps_a_job_without_heartbeat_alive_and_a_heartbeat_takes_over():
    s = running(limits=replace(LIMITS, hang_timeout_seconds=30))
    for t in range(0, 100, 5):
        s, _ = st.step(s, step_types.ActivitySeen(t % 10 == 0), float(t))
        s, actions = st.step(s, Tick(), float(t))
        assert s.phase is Phase.RUNNING
    s, _ = st.step(s, HeartbeatSeen(1, WALL0 + 100, "running"), 100.0)
    s, actions = st.step(s, step_types.ActivitySeen(False), 125.0)
    s, actions = st.step(s, Tick(), 128.0)
    assert s.phase is Phase.RUNNING, "with heartbeat progress the step clock rules (30 s from 100), not activity"
    s, actions = st.step(s, Tick(), 131.0)
    assert s.phase is Phase.DUMPING


# --- the lease lost (another host adopted the job while this one could not renew) -----------------

HOST_B = "node-b:/var/lib/spx"
HANDED = f"handed over to host {HOST_B}: its lease was taken while this host could not renew it"


def test_a_lost_lease_stops_the_attempt_and_the_job_ends_here_cancelled_uncounted_undiagnosed():
    s, actions = st.step(running(), LeaseLost(HOST_B), 20.0)
    assert (s.phase, s.stop_cause, s.handed_to, s.term_at) == (Phase.STOPPING, "lease-lost", HOST_B, 20.0)
    assert kinds(actions) == [RecordStop, SignalTerm] and only(actions, RecordStop) == RecordStop(1, "lease-lost")
    assert logs(actions) == ["lease_lost"]
    s, actions = st.step(s, LauncherExited(77, None), 22.0)  # spx.trainer: fenced, published nothing
    s, actions = st.step(s, AllGone(), 22.1)
    assert Diagnose not in kinds(actions), "not the job's failure: nothing to diagnose"
    finish = only(actions, FinishAttempt)
    assert (finish.state, finish.reason, finish.reason_class, finish.release_gpus) == (
        JobState.CANCELLED, HANDED, "lease-lost", True)
    assert s.phase is Phase.DONE and s.restarts == 0


def test_a_lost_lease_between_attempts_ends_the_job_at_once_and_a_stop_under_way_ends_as_handed_over():
    waiting = ready(JobState.RESTARTING, number=2, backoff_remaining=30.0)
    s, actions = st.step(waiting, LeaseLost(HOST_B), 1.0)
    finish = only(actions, FinishAttempt)
    assert (s.phase, finish.number, finish.state, finish.reason_class) == (Phase.DONE, 0, JobState.CANCELLED, "lease-lost")
    hung, _ = st.step(running(), LeaseLost(HOST_B), 20.0)
    crashed, _ = st.step(running(), LauncherExited(1, None), 20.0)
    s, actions = st.step(crashed, LeaseLost(HOST_B), 20.5)
    assert s.stop_cause == "lease-lost" and kinds(actions) == [RecordStop]
    _s, actions = st.step(s, AllGone(), 21.0)
    assert only(actions, FinishAttempt).state is JobState.CANCELLED, "never relaunched here: the job runs elsewhere"
    cancelled, _ = st.step(running(), CancelRequested("alice"), 20.0)
    assert st.step(cancelled, LeaseLost(HOST_B), 21.0)[1] == [], "a user's cancel stands"
    assert st.step(hung, LeaseLost(HOST_B), 21.0)[1] == [], "told once"
