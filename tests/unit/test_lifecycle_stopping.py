"""The job state machine stopping an attempt (lifecycle/stopping.py): a hang's stack dump, SIGTERM,
the grace, SIGKILL, the launcher's exit and the leftovers, a cancel, the daemon's own stop, a GPU
fault, a lease another host took — one test per edge, by scripting observations."""

from __future__ import annotations

import signal
from dataclasses import replace

from lifecycle_script import LIMITS, WALL0, XID79, ended, hung, kinds, logs, only, ready, running

from spx.daemon.lifecycle.actions import (
    Diagnose,
    DumpStacks,
    FinishAttempt,
    Note,
    RecordExit,
    RecordStop,
    SaveBackoff,
    SignalKill,
    SignalTerm,
    Spawn,
    StopStaging,
)
from spx.daemon.lifecycle.machine import advance
from spx.daemon.lifecycle.observations import (
    ActionFailed,
    AllGone,
    CancelRequested,
    CheckpointFound,
    DaemonStopping,
    Diagnosed,
    Go,
    GpuFault,
    LauncherExited,
    LeaseLost,
    Spawned,
    StacksDumped,
    Tick,
)
from spx.daemon.lifecycle.record import Phase
from spx.daemon.lifecycle.stopping import DUMP_DEADLINE_SECONDS, LEFTOVER_WARN_SECONDS
from spx.daemon.state.states import JobState


def test_dumping_to_stopping_when_the_stacks_are_dumped():
    s, actions = advance(hung(), StacksDumped(1), 70.0)
    assert s.phase is Phase.STOPPING and s.attempt.term_at == 70.0 and actions == [SignalTerm()]


def test_dumping_to_stopping_when_the_dump_does_not_come_back_in_time():
    s, actions = advance(hung(), Tick(), 66.0 + DUMP_DEADLINE_SECONDS + 1)
    assert s.phase is Phase.STOPPING and kinds(actions) == [SignalTerm] and logs(actions) == ["stack_dump_timed_out"]


def test_dumping_to_stopping_when_the_dump_fails():
    s, actions = advance(hung(), ActionFailed(DumpStacks(1), "py-spy: permission denied"), 67.0)
    assert s.phase is Phase.STOPPING and kinds(actions) == [SignalTerm]


def test_stopping_sends_sigkill_after_the_grace_and_repeats_it_each_second():
    s, _ = advance(hung(), StacksDumped(1), 70.0)
    s, actions = advance(s, Tick(), 99.0)
    assert actions == []
    s, actions = advance(s, Tick(), 100.0)
    assert actions == [Note("grace of 30 s over; SIGKILL"), SignalKill()]
    s, actions = advance(s, Tick(), 100.5)
    assert actions == []
    s, actions = advance(s, Tick(), 101.0)
    assert actions == [SignalKill()]


def test_running_to_exited_on_launcher_exit_kills_leftovers_and_stores_the_status_at_once():
    s, actions = advance(running(), LauncherExited(0, None), 20.0)
    assert s.phase is Phase.EXITED and (s.attempt.exit_code, s.attempt.exit_signal) == (0, None)
    assert actions == [SignalKill(), RecordExit(1, 0, None, None)]


def test_exited_keeps_killing_leftovers_and_warns_about_them():
    s, _ = advance(running(), LauncherExited(1, None), 20.0)
    s, actions = advance(s, Tick(), 21.0)
    assert actions == [SignalKill()]
    s, actions = advance(s, Tick(), 20.0 + LEFTOVER_WARN_SECONDS + 0.5)
    assert SignalKill() in actions and logs(actions) == ["leftover_processes"] and s.phase is Phase.EXITED


def test_stacks_dumped_after_the_attempt_is_gone_are_ignored():
    s, _ = advance(hung(), LauncherExited(1, None), 67.0)
    s, _ = advance(s, AllGone(), 67.5)
    before = s
    s, actions = advance(s, StacksDumped(1), 68.0)
    assert actions == [] and replace(s, clock=before.clock) == before


def test_cancel_during_backoff_cancels_without_an_attempt():
    s, actions = advance(ready(JobState.RESTARTING, backoff_remaining=30.0), CancelRequested("uid 1000"), 1.0)
    finish = only(actions, FinishAttempt)
    assert s.phase is Phase.DONE and (finish.number, finish.state, finish.reason, finish.release_gpus) == (
        0, JobState.CANCELLED, "cancelled by uid 1000", True)


def test_cancel_while_running_sends_sigterm_and_gives_the_grace():
    s, actions = advance(running(), CancelRequested("root"), 10.0)
    assert (s.phase, s.attempt.stop_cause, s.attempt.term_at) == (Phase.STOPPING, "cancel", 10.0)
    assert kinds(actions) == [RecordStop, SignalTerm], "the cancel is stored: it outlives a daemon restart"
    assert only(actions, RecordStop) == RecordStop(1, "cancel")
    s, actions = advance(s, Tick(), 39.0)
    assert actions == []
    s, actions = ended(s, 45.0, code=0)
    assert only(actions, FinishAttempt).state is JobState.CANCELLED


def test_a_cancelled_attempt_says_who_cancelled_and_gets_no_root_cause():
    """Workers killed by the cancel's SIGTERM exit non-zero (torchrun: SignalException, signal 15);
    that is the user's decision, not a failure: no log is read for a root cause."""
    s, _ = advance(running(), CancelRequested("alice"), 10.0)
    s, actions = ended(s, 12.0, code=1)
    finish = only(actions, FinishAttempt)
    assert not [a for a in actions if isinstance(a, Diagnose)]
    assert (finish.state, finish.reason, finish.root_cause) == (JobState.CANCELLED, "cancelled by alice", None)


def test_cancel_while_stopping_wins_without_a_second_sigterm():
    s, _ = advance(hung(), StacksDumped(1), 70.0)
    s, actions = advance(s, CancelRequested("root"), 71.0)
    assert s.attempt.stop_cause == "cancel" and actions[1:] == [RecordStop(1, "cancel")]
    s, actions = ended(s, 72.0, code=0)
    assert only(actions, FinishAttempt).state is JobState.CANCELLED


def test_cancel_while_preparing_cancels_and_the_late_checkpoint_is_ignored():
    s, _ = advance(ready(), Go((0,)), 0.0)
    s, actions = advance(s, CancelRequested("root"), 1.0)
    assert s.phase is Phase.DONE and only(actions, FinishAttempt).state is JobState.CANCELLED
    s, actions = advance(s, CheckpointFound(None, None, 1), 2.0)
    assert s.phase is Phase.DONE and actions == []


def launching():
    """A job whose attempt 1's checkpoint was found: its launch is under way off the loop."""
    s, _ = advance(ready(), Go((0, 1)), 0.0)
    return advance(s, CheckpointFound(None, None, 1), 1.0)[0]


def test_cancel_during_the_launch_keeps_the_gpus_until_it_lands_then_kills_it():
    """The launch's processes may start at any moment: the job holds its GPUs until they land,
    are killed (no grace: nothing trained) and gone — never placed under another job meanwhile."""
    s, actions = advance(launching(), CancelRequested("alice"), 2.0)
    assert s.phase is Phase.PREPARING and s.ledger.gpus == (0, 1) and not [a for a in actions if isinstance(a, FinishAttempt)]
    assert only(actions, RecordStop) == RecordStop(1, "cancel"), "stored: a restarted daemon cancels it too"
    s, again = advance(s, CancelRequested("alice"), 2.5)
    assert kinds(again) == [], "a second cancel adds nothing"
    s, actions = advance(s, Spawned(4242, WALL0 + 3), 3.0)
    assert (s.phase, s.attempt.stop_cause, s.attempt.cancelled_by) == (Phase.STOPPING, "cancel", "alice")
    assert SignalKill in kinds(actions) and SignalTerm not in kinds(actions)
    s, actions = ended(s, 4.0, code=None, sig=signal.SIGKILL)
    finish = only(actions, FinishAttempt)
    assert (finish.state, finish.reason, finish.release_gpus) == (JobState.CANCELLED, "cancelled by alice", True)


def test_cancel_during_a_launch_that_then_fails_ends_cancelled():
    s, _ = advance(launching(), CancelRequested("alice"), 2.0)
    s, actions = advance(s, ActionFailed(Spawn(1, None, None), "exec failed"), 3.0)
    finish = only(actions, FinishAttempt)
    assert s.phase is Phase.DONE and (finish.number, finish.state) == (1, JobState.CANCELLED)


def test_cancel_while_staging_stops_the_copier():
    s, _ = advance(ready(limits=replace(LIMITS, stages=True)), Go(()), 0.0)
    s, actions = advance(s, CancelRequested("root"), 1.0)
    assert kinds(actions) == [StopStaging, FinishAttempt] and s.phase is Phase.DONE


def test_daemon_stopping_sends_sigterm_and_the_restart_waits_for_the_next_daemon():
    s, actions = advance(running(), DaemonStopping(), 10.0)
    assert s.attempt.stop_cause == "daemon-stop" and kinds(actions) == [RecordStop, SignalTerm]
    s, actions = ended(s, 12.0, code=None, sig=signal.SIGTERM)
    finish = only(actions, FinishAttempt)
    assert (finish.state, finish.reason, finish.backoff_remaining) == (
        JobState.RESTARTING, "daemon stopped; resumes on next start", 0.0)
    assert s.phase is Phase.DONE


def test_daemon_stopping_in_backoff_stores_the_remaining_seconds():
    s = ready(JobState.RESTARTING, backoff_remaining=30.0, now=0.0)
    s, _ = advance(s, Tick(), 12.0)
    s, actions = advance(s, DaemonStopping(), 12.0)
    assert s.phase is Phase.DONE and actions == [SaveBackoff(18.0)]


def test_daemon_stopping_while_staging_stops_the_copier_for_a_later_resume():
    s, _ = advance(ready(limits=replace(LIMITS, stages=True)), Go(()), 0.0)
    s, actions = advance(s, DaemonStopping(), 1.0)
    assert s.phase is Phase.DONE and actions == [StopStaging()]


def test_daemon_stopping_while_ready_leaves_the_job_for_the_next_daemon():
    s, actions = advance(ready(JobState.RESTARTING), DaemonStopping(), 1.0)
    assert s.phase is Phase.DONE and actions == []


def test_a_gpu_fault_on_its_gpu_stops_the_attempt_like_a_hang_but_without_a_dump():
    s, actions = advance(running(), GpuFault(1, XID79), 20.0)
    assert (s.phase, s.attempt.stop_cause, s.attempt.gpu_fault, s.attempt.term_at) == (Phase.STOPPING, "gpu-fault", XID79, 20.0)
    assert kinds(actions) == [RecordStop, SignalTerm] and only(actions, RecordStop) == RecordStop(1, "gpu-fault")
    assert logs(actions) == ["gpu_fault_stop"]


def test_a_gpu_fault_on_another_gpu_or_during_a_stop_changes_nothing():
    s = running()
    assert advance(s, GpuFault(5, "XID 79 on GPU 5 (GPU fell off the bus)"), 20.0) == (replace(s, clock=replace(s.clock, now=20.0)), [])
    stopping, _ = advance(s, CancelRequested("root"), 20.0)
    after, actions = advance(stopping, GpuFault(1, XID79), 21.0)
    assert actions == [] and after.attempt.stop_cause == "cancel"


def test_a_gpu_fault_ends_as_class_gpu_fault_and_restarts_past_max_restarts():
    # Three earlier GPU faults and max_restarts 3: gpu-fault is `always`, not counted against it.
    s = running(restarts=3, class_counts={"gpu-fault": 3})
    s, _ = advance(s, GpuFault(1, XID79), 20.0)
    s, actions = advance(s, LauncherExited(None, signal.SIGTERM), 22.0)
    assert only(actions, RecordExit).stop_cause == "gpu-fault"
    s, actions = advance(s, AllGone(), 22.1)
    assert only(actions, Diagnose).root_cause
    s, actions = advance(s, Diagnosed(1, None, False), 22.5)
    finish = only(actions, FinishAttempt)
    assert (finish.state, finish.reason_class, finish.release_gpus) == (JobState.RESTARTING, "gpu-fault", False)
    assert finish.reason.startswith(f"gpu-fault: {XID79}") and finish.root_cause == XID79
    assert s.phase is Phase.BACKOFF and dict(s.ledger.class_counts)["gpu-fault"] == 4


def test_a_gpu_faults_root_cause_is_the_xid_then_what_the_ranks_printed():
    s, _ = advance(running(), GpuFault(1, XID79), 20.0)
    s, _ = advance(s, LauncherExited(1, None), 22.0)
    s, _ = advance(s, AllGone(), 22.1)
    _, actions = advance(s, Diagnosed(1, "rank 0 (pid 7): RuntimeError: CUDA error: unknown error (cuda)", False), 22.5)
    finish = only(actions, FinishAttempt)
    assert finish.reason_class == "gpu-fault"
    assert finish.root_cause == f"{XID79}; then rank 0 (pid 7): RuntimeError: CUDA error: unknown error (cuda)"


def test_a_new_attempt_forgets_the_last_ones_gpu_fault():
    s, _ = advance(running(), GpuFault(1, XID79), 20.0)
    s = replace(s, phase=Phase.PREPARING)
    s, _ = advance(s, Spawned(4343, WALL0 + 30), 30.0)
    assert (s.attempt.stop_cause, s.attempt.gpu_fault) == (None, None)


# --- the lease lost (another host adopted the job while this one could not renew) -----------------

HOST_B = "node-b:/var/lib/spx"
HANDED = f"handed over to host {HOST_B}: its lease was taken while this host could not renew it"


def test_a_lost_lease_stops_the_attempt_and_the_job_ends_here_cancelled_uncounted_undiagnosed():
    s, actions = advance(running(), LeaseLost(HOST_B), 20.0)
    assert (s.phase, s.attempt.stop_cause, s.attempt.handed_to, s.attempt.term_at) == (
        Phase.STOPPING, "lease-lost", HOST_B, 20.0)
    assert kinds(actions) == [RecordStop, SignalTerm] and only(actions, RecordStop) == RecordStop(1, "lease-lost")
    assert logs(actions) == ["lease_lost"]
    s, actions = advance(s, LauncherExited(77, None), 22.0)  # spx.trainer: fenced, published nothing
    s, actions = advance(s, AllGone(), 22.1)
    assert Diagnose not in kinds(actions), "not the job's failure: nothing to diagnose"
    finish = only(actions, FinishAttempt)
    assert (finish.state, finish.reason, finish.reason_class, finish.release_gpus) == (
        JobState.CANCELLED, HANDED, "lease-lost", True)
    assert s.phase is Phase.DONE and s.ledger.restarts == 0


def test_a_lost_lease_between_attempts_ends_the_job_at_once_and_a_stop_under_way_ends_as_handed_over():
    waiting = ready(JobState.RESTARTING, number=2, backoff_remaining=30.0)
    s, actions = advance(waiting, LeaseLost(HOST_B), 1.0)
    finish = only(actions, FinishAttempt)
    assert (s.phase, finish.number, finish.state, finish.reason_class) == (
        Phase.DONE, 0, JobState.CANCELLED, "lease-lost")
    hung_, _ = advance(running(), LeaseLost(HOST_B), 20.0)
    crashed, _ = advance(running(), LauncherExited(1, None), 20.0)
    s, actions = advance(crashed, LeaseLost(HOST_B), 20.5)
    assert s.attempt.stop_cause == "lease-lost" and kinds(actions) == [RecordStop]
    _s, actions = advance(s, AllGone(), 21.0)
    assert only(actions, FinishAttempt).state is JobState.CANCELLED, "never relaunched here: the job runs elsewhere"
    cancelled, _ = advance(running(), CancelRequested("alice"), 20.0)
    assert advance(cancelled, LeaseLost(HOST_B), 21.0)[1] == [], "a user's cancel stands"
    assert advance(hung_, LeaseLost(HOST_B), 21.0)[1] == [], "told once"
