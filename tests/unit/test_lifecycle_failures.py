"""The job state machine when an action failed (lifecycle/failures.py): a store that refuses a write
(retried in order, no relaunch meanwhile), one that refuses it for good, a failed signal, a fault of
the daemon's own — one test per edge, by scripting observations."""

from __future__ import annotations

from dataclasses import replace

import pytest
from lifecycle_script import ended, kinds, logs, only, ready, running

from spx.daemon.lifecycle.actions import (
    FinishAttempt,
    MarkStarting,
    SaveBackoff,
    SignalKill,
    SignalTerm,
    Spawn,
)
from spx.daemon.lifecycle.failures import fault
from spx.daemon.lifecycle.machine import advance
from spx.daemon.lifecycle.observations import (
    ActionFailed,
    CancelRequested,
    CheckpointFound,
    Diagnosed,
    Go,
    Tick,
)
from spx.daemon.lifecycle.record import Phase
from spx.daemon.state.states import JobState


def test_a_store_write_refused_is_retried_next_tick_and_blocks_the_relaunch():
    s, _ = ended(running(), 30.0, code=1)
    s, actions = advance(s, Diagnosed(1, None, False), 30.0)
    finish = only(actions, FinishAttempt)
    s, actions = advance(s, ActionFailed(finish, "database or disk is full", retry=True), 30.0)
    assert s.pending == (finish,) and logs(actions) == ["store_write_deferred"]
    s, actions = advance(s, Tick(), 45.0)  # backoff over, the write re-emitted …
    assert actions == [finish]
    s, _ = advance(s, ActionFailed(finish, "database or disk is full", retry=True), 45.0)
    assert s.phase is Phase.READY and not s.ready, "… refused again: no relaunch before it is in"
    s, actions = advance(s, Tick(), 46.0)
    assert actions == [finish] and s.ready


def test_a_job_with_a_pending_write_is_not_ready():
    s = replace(ready(JobState.RESTARTING), pending=(SaveBackoff(1.0),))
    assert not s.ready
    s, actions = advance(s, Tick(), 1.0)
    assert actions == [SaveBackoff(1.0)] and s.ready


def test_writes_queue_behind_a_refused_one_so_a_spawn_never_precedes_its_mark():
    s, actions = advance(ready(), Go((0,)), 0.0)
    mark = only(actions, MarkStarting)
    s, _ = advance(s, ActionFailed(mark, "database is locked", retry=True), 0.0)
    s, actions = advance(s, CheckpointFound(None, None, 1), 0.5)
    assert actions == [] and s.pending == (mark, Spawn(1, None, None)), "the spawn waits for the mark"
    s, actions = advance(s, Tick(), 1.0)
    assert actions == [mark, Spawn(1, None, None)] and s.pending == ()


def test_a_store_write_failing_for_good_gives_up_on_the_job():
    s, actions = ended(running(), 30.0, code=0)
    finish = only(actions, FinishAttempt)
    s, actions = advance(s, ActionFailed(finish, "IllegalTransition: failed → succeeded"), 30.0)
    assert s.phase is Phase.DONE and logs(actions) == ["store_write_failed"]


def test_a_failed_signal_is_logged_and_escalation_goes_on():
    s, _ = advance(running(), CancelRequested("root"), 0.0)
    s, actions = advance(s, ActionFailed(SignalTerm(), "PermissionError"), 0.0)
    assert s.phase is Phase.STOPPING and logs(actions) == ["action_failed"]
    s, actions = advance(s, Tick(), 31.0)
    assert kinds(actions) == [SignalKill]


@pytest.mark.parametrize("phase_of", ["running", "ready"])
def test_fault_fails_the_job_with_the_error_and_kills_what_runs(phase_of):
    s = running() if phase_of == "running" else ready(JobState.RESTARTING)
    s, actions = fault(s, "KeyError: 'getpwuid(): uid not found: 4321'", 5.0)
    finish = only(actions, FinishAttempt)
    assert s.phase is Phase.DONE and finish.state is JobState.FAILED and finish.release_gpus
    assert finish.reason == "daemon error: KeyError: 'getpwuid(): uid not found: 4321'"
    if phase_of == "running":
        assert SignalKill() in actions and finish.number == 1
    else:
        assert SignalKill() not in actions and finish.number == 0
