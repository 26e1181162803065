"""The machine's edges at a worker's abnormal death (WorkerDied, seen through its pidfd before its
launcher notices): an attempt no survivor can checkpoint — it writes no heartbeat, or its ranks span
hosts — is killed at once and its end says which worker died how; a heartbeat writer on one host,
or a job the rule does not apply to, keeps waiting for its launcher (its surviving ranks may be
writing a just-in-time checkpoint)."""

from __future__ import annotations

import signal
from dataclasses import replace

from lifecycle_script import LIMITS, WALL0, kinds, logs, only, ready, running

from spx.daemon.core.restart_spec import Restart
from spx.daemon.lifecycle.actions import (
    AgreeGeneration,
    Diagnose,
    FinishAttempt,
    Note,
    RecordExit,
    RecordStop,
    SignalKill,
)
from spx.daemon.lifecycle.machine import advance
from spx.daemon.lifecycle.observations import (
    AllGone,
    CancelRequested,
    CheckpointFound,
    Diagnosed,
    Go,
    HeartbeatSeen,
    LauncherExited,
    Spawned,
    Tick,
    WorkerDied,
)
from spx.daemon.lifecycle.record import Phase, WorkerExit
from spx.daemon.state.states import JobState

PLAIN = replace(LIMITS, worker_deaths_end=True, healthy_seconds=15)
KILLED = WorkerExit(pid=5151, rank=1, code=None, signal=signal.SIGKILL)


def test_a_plain_scripts_worker_killed_ends_the_attempt_at_once_with_sigkill():
    s, actions = advance(running(limits=PLAIN), WorkerDied(KILLED), 20.0)
    assert s.phase is Phase.STOPPING and s.attempt.stop_cause == "worker-died" and s.attempt.worker == KILLED
    assert kinds(actions) == [RecordStop, SignalKill] and only(actions, RecordStop) == RecordStop(1, "worker-died")
    assert logs(actions) == ["worker_died"]
    # No grace is waited for: the SIGKILL went now; the launcher's exit follows and the end is recorded.
    s, actions = advance(s, LauncherExited(None, signal.SIGKILL), 20.05)
    assert s.phase is Phase.EXITED and only(actions, RecordExit).stop_cause == "worker-died"
    s, actions = advance(s, AllGone(), 20.1)
    diagnose = only(actions, Diagnose)
    assert diagnose.oom and diagnose.root_cause, "a worker's death is the job's failure: OOM and root cause are read"
    s, actions = advance(s, Diagnosed(1, None, False), 20.2)
    finish = only(actions, FinishAttempt)
    assert finish.state is JobState.RESTARTING and finish.reason_class == "signal"
    assert finish.reason == "worker rank 1 (pid 5151) killed by SIGKILL; the daemon ended the attempt at once"
    assert finish.backoff_remaining == 0.0, "after a healthy stretch, relaunched at once"
    assert s.phase is Phase.READY and dict(s.ledger.class_counts) == {"signal": 1}


def test_a_worker_exiting_nonzero_is_classed_by_its_code_and_root_cause_not_by_the_daemons_sigkill():
    s, _ = advance(running(limits=PLAIN), WorkerDied(WorkerExit(5150, 0, 3, None)), 20.0)
    s, _ = advance(s, LauncherExited(None, signal.SIGKILL), 20.05)
    s, _ = advance(s, AllGone(), 20.1)
    _, actions = advance(s, Diagnosed(1, "rank 0 (pid 5150): RuntimeError: CUDA error: out of memory (oom)", False), 20.2)
    finish = only(actions, FinishAttempt)
    assert finish.reason_class == "oom" and finish.reason.startswith("worker rank 0 (pid 5150) exited with code 3")


def test_an_oom_kill_of_a_worker_is_an_oom():
    s, _ = advance(running(limits=PLAIN), WorkerDied(KILLED), 20.0)
    s, _ = advance(s, LauncherExited(None, signal.SIGKILL), 20.05)
    s, _ = advance(s, AllGone(), 20.1)
    _, actions = advance(s, Diagnosed(1, None, True), 20.2)
    assert only(actions, FinishAttempt).reason_class == "oom"


def test_a_heartbeat_writer_keeps_waiting_for_its_launcher():
    """Its surviving ranks may be writing the just-in-time checkpoint its launcher waits for."""
    s = running(limits=PLAIN)
    s, _ = advance(s, HeartbeatSeen(4, WALL0 + 5, "running"), 5.0)
    after, actions = advance(s, WorkerDied(KILLED), 20.0)
    assert after.phase is Phase.RUNNING and after.attempt.stop_cause is None and kinds(actions) == []
    assert logs(actions) == ["worker_died"]
    # … and its launcher's exit ends it as before.
    after, actions = advance(after, LauncherExited(1, None), 23.0)
    assert after.phase is Phase.EXITED and only(actions, RecordExit).stop_cause is None


def test_across_hosts_a_heartbeat_writer_is_killed_at_once_too():
    """Each host keeps its ranks' step state, so no survivor can assemble a just-in-time checkpoint
    of every rank: waiting for the launcher's teardown gains nothing."""
    s, _ = advance(ready(limits=replace(PLAIN, gang=True)), Go((0, 1)), 0.0)
    s, _ = advance(s, CheckpointFound(None, None, s.number, generation=3), 0.0)
    s, _ = advance(s, Spawned(4242, WALL0), 0.0)
    s, _ = advance(s, HeartbeatSeen(4, WALL0 + 5, "running"), 5.0)
    after, actions = advance(s, WorkerDied(KILLED), 20.0)
    assert after.phase is Phase.STOPPING and after.attempt.stop_cause == "worker-died"
    assert kinds(actions) == [RecordStop, SignalKill]
    assert any("its ranks span hosts" in a.text for a in actions if isinstance(a, Note))
    # Its end is agreed with the other hosts as any end is (test_lifecycle_across_hosts.py).
    s, _ = advance(after, LauncherExited(None, signal.SIGKILL), 20.05)
    s, actions = advance(s, AllGone(), 20.1)
    s, actions = advance(s, Diagnosed(s.number, None, False), 20.2)
    assert s.phase is Phase.AGREEING and only(actions, AgreeGeneration).bump.reason.startswith("worker rank 1")


def test_a_job_the_rule_does_not_apply_to_keeps_todays_behaviour():
    after, actions = advance(running(limits=replace(PLAIN, worker_deaths_end=False)), WorkerDied(KILLED), 20.0)
    assert after.phase is Phase.RUNNING and kinds(actions) == []


def test_a_death_during_a_stop_or_after_the_kill_changes_nothing():
    stopping, _ = advance(running(limits=PLAIN), CancelRequested("root"), 20.0)
    after, actions = advance(stopping, WorkerDied(KILLED), 20.5)
    assert after.attempt.stop_cause == "cancel" and after.attempt.worker is None and actions == []
    killed, _ = advance(running(limits=PLAIN), WorkerDied(KILLED), 20.0)
    again, actions = advance(killed, WorkerDied(WorkerExit(5150, 0, None, signal.SIGTERM)), 20.01)
    assert again.attempt.worker == KILLED and actions == []


def test_no_grace_runs_before_the_next_sigkill_either():
    s, _ = advance(running(limits=PLAIN), WorkerDied(KILLED), 20.0)
    assert kinds(advance(s, Tick(), 20.5)[1]) == []  # the SIGKILL was just sent
    s, _ = advance(s, LauncherExited(None, signal.SIGKILL), 20.6)
    _, actions = advance(s, Tick(), 21.7)
    assert kinds(actions) == [SignalKill], "leftovers get SIGKILL every second, as for any exit"


def test_three_quick_worker_deaths_are_a_crash_loop():
    limits = replace(PLAIN, restart=Restart(max_restarts=10, backoff_seconds=(1, 1)))
    s = running(limits=limits)
    for i in range(3):
        t = 100.0 * i
        if i:
            s = running(now=t, limits=limits, **_carry(s))
        s, _ = advance(s, WorkerDied(KILLED), t + 5)
        s, _ = advance(s, LauncherExited(None, signal.SIGKILL), t + 5.1)
        s, _ = advance(s, AllGone(), t + 5.2)
        s, actions = advance(s, Diagnosed(s.number, None, False), t + 5.3)
    finish = only(actions, FinishAttempt)
    assert finish.state is JobState.FAILED and finish.reason.startswith("crash loop")


def _carry(s):
    return {"number": s.number, "restarts": s.ledger.restarts, "class_counts": dict(s.ledger.class_counts),
            "backoff_level": s.ledger.backoff_level, "no_progress_streak": s.ledger.no_progress_streak,
            "job_state": JobState.RESTARTING}
