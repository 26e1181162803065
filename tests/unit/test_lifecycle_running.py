"""The job state machine while an attempt runs (lifecycle/running.py): heartbeats, the calibrated
hang timeout, activity without a heartbeat, hangs — one test per edge, by scripting observations."""

from __future__ import annotations

import signal
from dataclasses import replace

from lifecycle_script import LIMITS, WALL0, auto, beats, ended, logs, only, ready, running

from spx.daemon.lifecycle.actions import (
    DumpStacks,
    FinishAttempt,
    RecordStop,
    StartStandby,
)
from spx.daemon.lifecycle.machine import advance
from spx.daemon.lifecycle.observations import (
    ActivitySeen,
    CheckpointFound,
    Diagnosed,
    Go,
    HeartbeatSeen,
    Spawned,
    StacksDumped,
    Tick,
)
from spx.daemon.lifecycle.record import Phase
from spx.daemon.lifecycle.running import (
    AUTO_HANG_CEILING_SECONDS,
    AUTO_HANG_FLOOR_SECONDS,
    FINISHED_EXIT_SECONDS,
    STANDBY_WITHOUT_HEARTBEAT_SECONDS,
    hang_timeout,
)
from spx.daemon.state.states import JobState


def test_running_heartbeat_progress_restarts_the_hang_clock():
    s = running()
    s, _ = advance(s, HeartbeatSeen(5, WALL0 + 10, "running"), 10.0)
    s, _ = advance(s, HeartbeatSeen(6, WALL0 + 50, "running"), 50.0)
    s, actions = advance(s, Tick(), 100.0)  # 50 s since the last progress < 60 s
    assert (s.phase, s.attempt.last_step, s.attempt.last_progress, actions) == (Phase.RUNNING, 6, 50.0, [])


def test_running_heartbeat_without_a_new_step_is_no_progress():
    s = running()
    s, _ = advance(s, HeartbeatSeen(5, WALL0 + 10, "running"), 10.0)
    s, _ = advance(s, HeartbeatSeen(5, WALL0 + 40, "running"), 40.0)
    assert s.attempt.last_progress == 10.0


def test_running_ignores_the_heartbeat_of_an_earlier_attempt():
    s = running(100.0)
    s, _ = advance(s, HeartbeatSeen(99, WALL0 + 50, "running"), 101.0)
    assert s.attempt.last_step is None and s.attempt.last_progress is None


def test_running_without_heartbeats_never_hangs():
    s, actions = advance(running(), Tick(), 10_000.0)
    assert s.phase is Phase.RUNNING and actions == []


def test_running_to_dumping_on_hang():
    s = running()
    s, _ = advance(s, HeartbeatSeen(8, WALL0 + 5, "running"), 5.0)
    s, actions = advance(s, Tick(), 66.0)
    assert s.phase is Phase.DUMPING and s.attempt.stop_cause == "hang" and s.attempt.hang_idle == 61.0
    assert logs(actions) == ["hang_detected"] and actions[-1] == DumpStacks(1)


def test_a_hang_is_stored_as_the_stop_cause_before_the_stop():
    s = running()
    s, _ = advance(s, HeartbeatSeen(8, WALL0 + 5, "running"), 5.0)
    s, actions = advance(s, Tick(), 66.0)
    assert RecordStop(1, "hang") in actions


def test_an_attempt_that_does_not_exit_after_training_finished_is_killed_and_succeeded():
    """Training done (the "finished" beat comes after the final checkpoint) but the process hangs in
    its exit: a minute later it is a hang at exit, stacks dumped and killed, and the job succeeded."""
    s = running(limits=replace(LIMITS, hang_timeout_seconds=900))
    s, _ = advance(s, HeartbeatSeen(60, WALL0 + 5, "running"), 5.0)
    s, _ = advance(s, HeartbeatSeen(60, WALL0 + 6, "finished"), 6.0)
    s, actions = advance(s, Tick(), 6.0 + FINISHED_EXIT_SECONDS - 1)
    assert s.phase is Phase.RUNNING and actions == []
    s, actions = advance(s, Tick(), 6.0 + FINISHED_EXIT_SECONDS + 1)
    assert s.phase is Phase.DUMPING and DumpStacks(1) in actions
    s, _ = advance(s, StacksDumped(1), 70.0)
    s, actions = ended(s, 71.0, code=None, sig=signal.SIGTERM)
    s, actions = advance(s, Diagnosed(1, None, False), 72.0) if s.phase is Phase.DIAGNOSING else (s, actions)
    finish = only(actions, FinishAttempt)
    assert finish.state is JobState.SUCCEEDED and finish.reason.startswith("training finished")


def test_fast_steps_calibrate_the_hang_timeout_to_about_ten_seconds():
    """0.2 s steps, seen through a heartbeat written once a second: hung 10 s after the last step."""
    s = beats(auto(), [(float(t), 5 * t) for t in range(1, 12)])
    assert hang_timeout(s) == AUTO_HANG_FLOOR_SECONDS
    s, actions = advance(s, Tick(), 11.0 + 9.5)
    assert s.phase is Phase.RUNNING
    s, actions = advance(s, Tick(), 11.0 + 10.5)
    assert s.phase is Phase.DUMPING and RecordStop(1, "hang") in actions


def test_a_long_first_step_is_warm_up_not_a_hang():
    """A 60 s first step (compile, loading) is never learned; until 5 intervals are seen the ceiling holds."""
    s = beats(auto(), [(1.0, 0), (61.0, 1), (62.0, 2), (63.0, 3)])
    assert s.hang.intervals == (1.0,) and hang_timeout(s) == AUTO_HANG_CEILING_SECONDS
    s = beats(s, [(64.0 + i, 4 + i) for i in range(5)])
    assert max(s.hang.intervals) == 1.0 and hang_timeout(s) == AUTO_HANG_FLOOR_SECONDS


def test_slow_steps_calibrate_a_longer_timeout_and_a_set_timeout_wins():
    s = beats(auto(), [(30.0 * i, i) for i in range(1, 10)])
    assert hang_timeout(s) == 150.0, "5 × the p99 of 30 s intervals"
    fixed = beats(running(limits=replace(LIMITS, hang_timeout_seconds=42.0)), [(30.0 * i, i) for i in range(1, 10)])
    assert hang_timeout(fixed) == 42.0


def test_a_checkpoint_is_not_a_hang_and_its_interval_is_not_learned():
    s = beats(auto(), [(float(t), t) for t in range(1, 12)])
    s = beats(s, [(12.0, 11)], status="checkpointing")
    s, _ = advance(s, Tick(), 12.0 + 120)
    assert s.phase is Phase.RUNNING, "a 2-minute save under the ceiling, not the 10 s calibration"
    s = beats(s, [(133.0, 12)])
    assert max(s.hang.intervals) == 1.0 and hang_timeout(s) == AUTO_HANG_FLOOR_SECONDS


def test_without_a_heartbeat_idle_gpus_and_a_silent_log_for_the_timeout_are_a_hang():
    s = running(limits=replace(LIMITS, hang_timeout_seconds=30))
    s, _ = advance(s, ActivitySeen(True), 5.0)
    s, _ = advance(s, ActivitySeen(False), 10.0)
    s, actions = advance(s, Tick(), 34.0)
    assert s.phase is Phase.RUNNING and actions == []
    s, actions = advance(s, Tick(), 35.5)
    assert s.phase is Phase.DUMPING and RecordStop(1, "hang") in actions and DumpStacks(1) in actions


def test_activity_keeps_a_job_without_heartbeat_alive_and_a_heartbeat_takes_over():
    s = running(limits=replace(LIMITS, hang_timeout_seconds=30))
    for t in range(0, 100, 5):
        s, _ = advance(s, ActivitySeen(t % 10 == 0), float(t))
        s, actions = advance(s, Tick(), float(t))
        assert s.phase is Phase.RUNNING
    s, _ = advance(s, HeartbeatSeen(1, WALL0 + 100, "running"), 100.0)
    s, actions = advance(s, ActivitySeen(False), 125.0)
    s, actions = advance(s, Tick(), 128.0)
    assert s.phase is Phase.RUNNING, "with heartbeat progress the step clock rules (30 s from 100), not activity"
    s, actions = advance(s, Tick(), 131.0)
    assert s.phase is Phase.DUMPING


def test_a_heartbeat_writers_first_beat_asks_for_the_next_launcher_once():
    s = running(limits=replace(LIMITS, standby=True))
    s, actions = advance(s, HeartbeatSeen(1, WALL0 + 5, "running"), 5.0)
    assert StartStandby(2) in actions and s.attempt.standby_asked
    s, actions = advance(s, HeartbeatSeen(2, WALL0 + 6, "running"), 6.0)
    assert not any(isinstance(a, StartStandby) for a in actions)
    s, actions = advance(running(limits=LIMITS), HeartbeatSeen(1, WALL0 + 5, "running"), 5.0)
    assert not any(isinstance(a, StartStandby) for a in actions), "a launcher without a standby (config, python)"


def test_a_script_without_a_heartbeat_gets_its_next_launcher_once_it_lived_and_worked_a_while():
    """A plain torchrun script never says it trained a step: its standby starts once the attempt has
    run STANDBY_WITHOUT_HEARTBEAT_SECONDS and shows work, not during its start-up, and only once."""
    s = running(limits=replace(LIMITS, standby=True))
    early = STANDBY_WITHOUT_HEARTBEAT_SECONDS - 1
    s, actions = advance(s, ActivitySeen(True), early)
    assert actions == [] and not s.attempt.standby_asked, "still starting up"
    s, actions = advance(s, ActivitySeen(False), STANDBY_WITHOUT_HEARTBEAT_SECONDS + 1)
    assert actions == [], "no sign of work in this look"
    s, actions = advance(s, ActivitySeen(True), STANDBY_WITHOUT_HEARTBEAT_SECONDS + 5)
    assert actions == [StartStandby(2)] and s.attempt.standby_asked
    s, actions = advance(s, ActivitySeen(True), STANDBY_WITHOUT_HEARTBEAT_SECONDS + 10)
    assert actions == []
    s, actions = advance(running(limits=LIMITS), ActivitySeen(True), STANDBY_WITHOUT_HEARTBEAT_SECONDS + 5)
    assert actions == [], "a launcher without a standby (config, python)"


def test_a_script_without_a_heartbeat_on_no_gpu_gets_its_next_launcher_once_it_lived_a_while():
    """A job on CPUs has no GPU whose work the daemon could see: having lived
    STANDBY_WITHOUT_HEARTBEAT_SECONDS is the sign of its healthy start (on its Ticks), once."""
    s, _ = advance(ready(limits=replace(LIMITS, standby=True)), Go(()), 0.0)
    s, _ = advance(s, CheckpointFound(None, None, s.number), 0.0)
    s, _ = advance(s, Spawned(4242, WALL0), 0.0)
    s, actions = advance(s, Tick(), STANDBY_WITHOUT_HEARTBEAT_SECONDS - 1)
    assert actions == [] and not s.attempt.standby_asked, "still starting up"
    s, actions = advance(s, Tick(), STANDBY_WITHOUT_HEARTBEAT_SECONDS + 1)
    assert actions == [StartStandby(2)] and s.attempt.standby_asked
    s, actions = advance(s, Tick(), STANDBY_WITHOUT_HEARTBEAT_SECONDS + 2)
    assert actions == []
    with_gpus = running(limits=replace(LIMITS, standby=True))
    assert advance(with_gpus, Tick(), STANDBY_WITHOUT_HEARTBEAT_SECONDS + 1)[1] == [], "on GPUs: their work is the sign"
