"""The job state machine on a divergence (lifecycle/running.py, ending.py, starting.py, rollback.py):
a "diverged" heartbeat classes the attempt `divergence`; the relaunch rolls back to a checkpoint
before the divergent step and skips the data since; after `max` rollbacks the job fails with the
evidence; a script that reports a NaN loss and trains on is stopped by the daemon's NaN rule — one
test per edge, by scripting observations."""

from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace

import pytest
from lifecycle_script import LIMITS, WALL0, kinds, only, relaunch, running

from spx.daemon.contract.worker_env import NON_FINITE, Divergence
from spx.daemon.core.causes import ReasonClass, StopCause
from spx.daemon.core.restart_spec import ClassLimit, Restart
from spx.daemon.lifecycle import resume_fallback
from spx.daemon.lifecycle.actions import FinishAttempt, RecordStop, SignalTerm
from spx.daemon.lifecycle.machine import advance
from spx.daemon.lifecycle.observations import (
    AllGone,
    Diagnosed,
    HeartbeatSeen,
    LauncherExited,
)
from spx.daemon.lifecycle.record import Phase
from spx.daemon.lifecycle.rollback import Rollback, rollback_after
from spx.daemon.state.states import JobState

LOSS_NAN = Divergence(37, "loss", math.nan, NON_FINITE)
ROLLING = replace(LIMITS, restart=Restart(max_restarts=10, backoff_seconds=(0, 0)))


def diverge(s, now, step=37, code=1):
    """The attempt writes its "diverged" beat at `step`, exits with `code` (torchrun's 1), is diagnosed."""
    s, _ = advance(s, HeartbeatSeen(step, WALL0 + now, "running", loss=2.5), now)
    s, _ = advance(s, HeartbeatSeen(step, WALL0 + now + 0.5, "diverged", diverged=replace(LOSS_NAN, step=step)), now + 0.5)
    s, _ = advance(s, LauncherExited(code, None), now + 1)
    s, _ = advance(s, AllGone(), now + 1)
    return advance(s, Diagnosed(s.number, None, False), now + 2)


def test_a_diverged_heartbeat_classes_the_attempt_divergence_and_restarts_it():
    s, actions = diverge(running(limits=ROLLING), 10.0)
    finish = only(actions, FinishAttempt)
    assert (finish.state, finish.reason_class, finish.reason) == (
        JobState.RESTARTING, ReasonClass.DIVERGENCE, "diverged at step 37: loss NaN")
    assert finish.max_step == 37 and s.ledger.class_counts == (("divergence", 1),)


def test_the_relaunch_rolls_back_before_the_divergent_step_and_skips_the_data_since():
    s, _ = diverge(running(limits=ROLLING), 10.0)
    s, find, spawn = relaunch(s, 20.0, "/ck/step-000000030", 30)
    assert find.rollback == Rollback(37, "loss NaN")
    assert (spawn.resume_from, spawn.resume_step, spawn.skip_steps) == ("/ck/step-000000030", 30, ((31, 37),))
    assert find.rollback.describe(30, True) == "rolled back from step 37 (loss NaN) to checkpoint 30, skipping batches 31–37"


def test_a_rollback_with_no_checkpoint_before_the_divergence_starts_over_skipping_from_step_1():
    s, _ = diverge(running(limits=ROLLING), 10.0, step=5)
    s, find, spawn = relaunch(s, 20.0, None, None)
    assert find.rollback.step == 5 and spawn.skip_steps == ((1, 5),)
    assert find.rollback.describe(None, False) == "rolled back from step 5 (loss NaN) to the start, skipping batches 1–5"


def test_after_a_clean_end_of_the_rolled_back_attempt_the_next_relaunch_is_no_rollback():
    s, _ = diverge(running(limits=ROLLING), 10.0)
    s, _, _ = relaunch(s, 20.0, "/ck/step-000000030", 30)
    s, _ = advance(s, HeartbeatSeen(44, WALL0 + 30, "running"), 30.0)
    s, _ = advance(s, LauncherExited(1, None), 31.0)
    s, _ = advance(s, AllGone(), 31.0)
    s, _ = advance(s, Diagnosed(s.number, "RuntimeError: boom (user-code)", False), 32.0)
    s, find, spawn = relaunch(s, 40.0, "/ck/step-000000040", 40)
    assert find.rollback is None and spawn.skip_steps == ()


def test_after_max_rollbacks_the_next_divergence_fails_the_job_with_the_evidence():
    s = running(limits=ROLLING)
    for n, step in enumerate((37, 45, 52), start=1):
        s, actions = diverge(s, 100.0 * n, step=step)
        assert only(actions, FinishAttempt).state is JobState.RESTARTING
        s, find, _ = relaunch(s, 100.0 * n + 50, f"/ck/step-{step - 7:09d}", step - 7)
        assert find.rollback.step == step
    s, actions = diverge(s, 500.0, step=58)
    finish = only(actions, FinishAttempt)
    assert s.phase is Phase.DONE and finish.state is JobState.FAILED and finish.reason_class is ReasonClass.DIVERGENCE
    assert finish.reason == ("gave up: diverged at step 58: loss NaN, after 3 earlier divergence failures "
                             "(restart.on_failure.divergence.max: 3)")


def test_a_divergence_rule_without_rollback_relaunches_from_the_newest_checkpoint():
    limits = replace(ROLLING, restart=Restart(max_restarts=10, backoff_seconds=(0, 0),
                                              on_failure={"divergence": {"max": 3}}))
    s, _ = diverge(running(limits=limits), 10.0)
    s, find, spawn = relaunch(s, 20.0, "/ck/step-000000030", 30)
    assert find.rollback is None and spawn.skip_steps == ()


def test_a_divergence_is_rolled_back_whatever_exit_code_its_launcher_reports():
    """Known from the heartbeat, not the exit code (torchrun reports 1 for its workers' 65): a job
    restricting restart.on_exit_codes still gets its rollback."""
    limits = replace(ROLLING, restart=Restart(max_restarts=10, backoff_seconds=(0, 0), on_exit_codes=[75]))
    s, actions = diverge(running(limits=limits), 10.0, code=1)
    assert only(actions, FinishAttempt).state is JobState.RESTARTING


def test_the_daemons_nan_rule_stops_a_script_that_trains_on_and_classes_it_divergence():
    s = running(limits=ROLLING)
    s, _ = advance(s, HeartbeatSeen(11, WALL0 + 5, "running", loss=3.0), 5.0)
    s, actions = advance(s, HeartbeatSeen(12, WALL0 + 6, "running", loss=math.inf, grad_norm=1.0), 6.0)
    assert s.phase is Phase.STOPPING and kinds(actions) == [RecordStop, SignalTerm]
    assert only(actions, RecordStop).cause is StopCause.DIVERGENCE
    # spx.trainer (its own check off) checkpoints on SIGTERM and says "preempted": still a divergence.
    s, _ = advance(s, HeartbeatSeen(12, WALL0 + 7, "preempted"), 7.0)
    s, _ = advance(s, LauncherExited(75, None), 8.0)
    s, _ = advance(s, AllGone(), 8.0)
    s, actions = advance(s, Diagnosed(s.number, None, False), 9.0)
    finish = only(actions, FinishAttempt)
    assert (finish.reason_class, finish.reason) == (
        ReasonClass.DIVERGENCE, "diverged at step 12: loss Infinity (non-finite, in its heartbeat)")
    s, find, spawn = relaunch(s, 20.0, "/ck/step-000000010", 10)
    assert find.rollback == Rollback(12, "loss Infinity (non-finite, in its heartbeat)") and spawn.skip_steps == ((11, 12),)


def test_a_finite_loss_and_a_beat_without_one_are_no_divergence():
    s = running(limits=ROLLING)
    s, actions = advance(s, HeartbeatSeen(3, WALL0 + 5, "running", loss=1e6, grad_norm=None), 5.0)
    assert s.phase is Phase.RUNNING and RecordStop not in kinds(actions)


def test_a_rollback_survives_a_daemon_restart_through_the_stored_attempt_row():
    row = SimpleNamespace(number=4, end=10.0, reason="diverged at step 37: loss NaN", reason_class="divergence",
                          resumed_from="/ck/step-000000030", resumed_from_step=30, max_step=37,
                          checkpoint_discovery=None)
    history = resume_fallback.remember((), resume_fallback.past_attempt(row))
    assert rollback_after(history, Restart()) == Rollback(37, "loss NaN")
    assert rollback_after(history, Restart(on_failure={"divergence": "counted"})) is None


def test_rollback_is_the_default_for_divergence_and_refused_for_other_classes():
    assert Restart().on_failure["divergence"] == ClassLimit(max=3, rollback=True)
    with pytest.raises(ValueError, match="rollback and args apply to the divergence class only"):
        Restart(on_failure={"user-code": {"max": 1, "rollback": True}})


def test_the_divergence_args_go_to_every_attempt_after_the_first_divergence():
    limits = replace(ROLLING, restart=Restart(max_restarts=10, backoff_seconds=(0, 0), on_failure={
        "divergence": {"max": 3, "rollback": True, "args": ["--lr", "1e-4"]}}))
    s = running(limits=limits)
    s, _ = advance(s, LauncherExited(1, None), 5.0)  # a crash first: no divergence yet, no args
    s, _ = advance(s, AllGone(), 5.0)
    s, _ = advance(s, Diagnosed(s.number, "RuntimeError: boom (user-code)", False), 6.0)
    s, _, spawn = relaunch(s, 200.0, None, None)
    assert spawn.extra_args == ()
    s, _ = diverge(s, 210.0)
    s, _, spawn = relaunch(s, 220.0, "/ck/step-000000030", 30)
    assert spawn.extra_args == ("--lr", "1e-4") and spawn.skip_steps == ((31, 37),)
    s, _ = advance(s, LauncherExited(1, None), 350.0)  # a later crash: the args stay, no rollback
    s, _ = advance(s, AllGone(), 350.0)
    s, _ = advance(s, Diagnosed(s.number, "RuntimeError: boom (user-code)", False), 351.0)
    s, find, spawn = relaunch(s, 400.0, "/ck/step-000000040", 40)
    assert find.rollback is None and spawn.extra_args == ("--lr", "1e-4") and spawn.skip_steps == ()
    with pytest.raises(ValueError, match="rollback and args apply to the divergence class only"):
        Restart(on_failure={"oom": {"max": 1, "args": ["--lr", "1"]}})
