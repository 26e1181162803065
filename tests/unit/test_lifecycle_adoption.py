"""The job state machine after a daemon restart (machine.adopted): an attempt a previous daemon left
open is taken on as it is — still running, being stopped, or ended meanwhile (its recorded exit, or
lost) — one test per case, by scripting observations."""

from __future__ import annotations

import signal

from lifecycle_script import LIMITS, WALL0, ended, kinds, only, ready

from spx.daemon.lifecycle.actions import (
    FinishAttempt,
    RecordExit,
    RecordStop,
    SignalKill,
    SignalTerm,
)
from spx.daemon.lifecycle.machine import adopted, advance
from spx.daemon.lifecycle.observations import (
    AllGone,
    CancelRequested,
    Diagnosed,
    HeartbeatSeen,
    LauncherExited,
    Tick,
)
from spx.daemon.lifecycle.record import Phase
from spx.daemon.state.states import JobState


def test_a_running_attempt_is_adopted_as_it_is_and_supervised_on():
    """Jobs outlive the daemon: no signal, no store write; heartbeats, hangs and its exit go on."""
    base = ready(JobState.RUNNING, gpus=(0, 1), number=3, restarts=1)
    s, actions = adopted(base, 3, WALL0, 40, now=100.0, ran_seconds=30.0)
    assert (s.phase, s.attempt.stop_cause, s.attempt.term_at, s.number, s.attempt.started) == (Phase.RUNNING, None, None, 3, 70.0)
    assert kinds(actions) == [], "nothing signalled, nothing written"
    s, _ = advance(s, HeartbeatSeen(41, WALL0 + 1, "running"), 101.0)
    assert s.attempt.last_progress == 101.0, "the hang clock starts at the first heartbeat seen"
    s, actions = advance(s, LauncherExited(0, None), 150.0)
    assert RecordExit(3, 0, None, None) in actions
    s, actions = advance(s, AllGone(), 150.5)
    finish = only(actions, FinishAttempt)
    assert (finish.number, finish.state) == (3, JobState.SUCCEEDED)


def test_an_adopted_attempt_that_stops_beating_is_a_hang():
    s, _ = adopted(ready(JobState.RUNNING), 1, WALL0, None, now=0.0)
    s, _ = advance(s, HeartbeatSeen(5, WALL0 + 1, "running"), 1.0)
    s, actions = advance(s, Tick(), 1.0 + LIMITS.hang_timeout_seconds + 1)
    assert s.phase is Phase.DUMPING and RecordStop(1, "hang") in actions


def test_an_adopted_attempt_can_be_cancelled():
    s, _ = adopted(ready(JobState.RUNNING), 1, WALL0, None, now=0.0)
    s, actions = advance(s, CancelRequested("alice"), 1.0)
    assert s.phase is Phase.STOPPING and SignalTerm() in actions
    s, actions = ended(s, 2.0, code=None, sig=signal.SIGTERM)
    assert only(actions, FinishAttempt).state is JobState.CANCELLED


def test_adopted_attempt_whose_exit_was_stored_is_decided_on_it():
    """The daemon died after the launcher exited 0 but before the end was recorded: success, not a rerun."""
    s, actions = adopted(ready(JobState.RUNNING), 1, WALL0, None, 0.0, ended=LauncherExited(0, None))
    assert s.phase is Phase.EXITED and SignalKill() in actions
    s, actions = advance(s, AllGone(), 0.5)
    assert only(actions, FinishAttempt).state is JobState.SUCCEEDED and s.phase is Phase.DONE


def test_adopted_attempt_with_a_recorded_crash_counts_as_the_jobs_fault():
    s, _ = adopted(ready(JobState.RUNNING), 1, WALL0, None, 0.0, ended=LauncherExited(1, None))
    s, _ = advance(s, AllGone(), 0.5)
    s, actions = advance(s, Diagnosed(1, None, False), 1.0)
    finish = only(actions, FinishAttempt)
    assert (finish.state, finish.reason_class, s.ledger.restarts) == (JobState.RESTARTING, "crash", 1)


def test_an_adopted_attempt_the_old_daemon_was_cancelling_is_still_cancelled():
    """The cancel was stored before its SIGTERM: the stop goes on with a fresh grace, no second SIGTERM."""
    s, actions = adopted(ready(JobState.RUNNING), 1, WALL0, None, 0.0, stop_cause="cancel")
    assert (s.phase, s.attempt.stop_cause, s.attempt.term_at) == (Phase.STOPPING, "cancel", 0.0) and kinds(actions) == []
    s, actions = advance(s, Tick(), LIMITS.grace_seconds + 0.1)
    assert SignalKill() in actions
    s, actions = ended(s, LIMITS.grace_seconds + 1, code=None, sig=signal.SIGKILL)
    assert only(actions, FinishAttempt).state is JobState.CANCELLED


def test_adopted_attempt_stopped_by_the_daemon_before_is_still_not_the_jobs_fault():
    s, _ = adopted(ready(JobState.RUNNING), 1, WALL0, None, 0.0, stop_cause="daemon-stop",
                      ended=LauncherExited(None, 15))
    s, actions = advance(s, AllGone(), 0.5)
    finish = only(actions, FinishAttempt)
    assert (finish.state, finish.reason_class, s.ledger.restarts) == (JobState.RESTARTING, "daemon-restart", 0)


def test_a_stop_signal_whose_cause_was_never_stored_is_not_the_jobs_fault():
    """The monitor saw a stop signal (only root sends one) but no daemon lived to store why."""
    s, _ = adopted(ready(JobState.RUNNING), 1, WALL0, None, 0.0, ended=LauncherExited(None, 15, stopped=True))
    s, actions = advance(s, AllGone(), 0.5)
    assert only(actions, FinishAttempt).reason_class == "daemon-restart" and s.ledger.restarts == 0


def test_adopted_attempt_whose_launch_never_happened_is_not_the_jobs_fault():
    """The daemon died mid-spawn: the shim never got its request and exited 1; not a crash of the job."""
    s, actions = adopted(ready(JobState.RUNNING), 1, WALL0, None, 0.0, ended=LauncherExited(1, None, launched=False))
    assert s.attempt.stop_cause == "lost" and RecordExit(1, 1, None, "lost") in actions
    s, actions = advance(s, AllGone(), 0.5)
    finish = only(actions, FinishAttempt)
    assert (finish.state, finish.reason_class, s.ledger.restarts, s.phase) == (JobState.RESTARTING, "lost", 0, Phase.READY)


def test_adopted_attempt_whose_unconfirmed_launch_exited_0_succeeded():
    """The daemon died after the exec but before storing the pgid; the job ran to its end meanwhile."""
    s, _ = adopted(ready(JobState.RUNNING), 1, WALL0, None, 0.0, ended=LauncherExited(0, None, launched=False))
    s, actions = advance(s, AllGone(), 0.5)
    assert only(actions, FinishAttempt).state is JobState.SUCCEEDED


def test_a_lost_attempt_is_relaunched_at_once_without_counting():
    """Its monitor is gone without a record: how it ended is unknown; nothing is stored as its exit."""
    s, actions = adopted(ready(JobState.RUNNING, restarts=2), 1, WALL0, None, 0.0, ended=LauncherExited(None, None, lost=True))
    assert s.attempt.stop_cause == "lost" and not any(isinstance(a, RecordExit) for a in actions)
    s, actions = advance(s, AllGone(), 0.5)
    finish = only(actions, FinishAttempt)
    assert (finish.state, finish.reason_class, finish.backoff_remaining, s.ledger.restarts) == (JobState.RESTARTING, "lost", 0.0, 2)
    assert finish.reason.startswith("lost")


def test_a_lost_attempt_whose_heartbeat_says_finished_succeeds():
    s, _ = adopted(ready(JobState.RUNNING), 1, WALL0, None, 0.0)
    s, _ = advance(s, HeartbeatSeen(500, WALL0 + 1, "finished"), 0.1)
    s, actions = advance(s, LauncherExited(None, None, lost=True), 0.5)
    s, actions = advance(s, AllGone(), 0.6)
    assert only(actions, FinishAttempt).state is JobState.SUCCEEDED


def test_an_attempt_adopted_while_stopped_for_a_gpu_fault_goes_on_stopping():
    s, actions = adopted(ready(JobState.RUNNING, gpus=(0, 1)), 1, WALL0, None, 10.0, stop_cause="gpu-fault")
    assert (s.phase, s.attempt.stop_cause) == (Phase.STOPPING, "gpu-fault") and SignalTerm() not in actions
