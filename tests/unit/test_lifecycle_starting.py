"""The job state machine before an attempt runs (lifecycle/starting.py): the backoff, Go, staging,
the checkpoint, the launch — one test per edge, by scripting observations (no processes)."""

from __future__ import annotations

from dataclasses import replace

from lifecycle_script import LIMITS, WALL0, ended, kinds, only, ready, running

from spx.daemon.lifecycle.actions import (
    FindCheckpoint,
    FinishAttempt,
    MarkStarting,
    SaveBackoff,
    Spawn,
    StartStaging,
)
from spx.daemon.lifecycle.machine import advance
from spx.daemon.lifecycle.observations import (
    ActionFailed,
    CheckpointFound,
    Diagnosed,
    Go,
    StagingEnded,
    Tick,
)
from spx.daemon.lifecycle.record import Phase
from spx.daemon.lifecycle.starting import CHECKPOINT_DEADLINE_SECONDS
from spx.daemon.state.states import JobState


def test_ready_to_preparing_on_go_marks_starting_and_finds_the_checkpoint():
    s, actions = advance(ready(), Go((2, 3)), 5.0)
    assert (s.phase, s.ledger.job_state, s.ledger.gpus, s.number) == (Phase.PREPARING, JobState.STARTING, (2, 3), 1)
    assert actions == [MarkStarting((2, 3), "GPUs allocated"), FindCheckpoint(1)]


def test_restarting_to_starting_on_go_says_relaunching():
    s, actions = advance(ready(JobState.RESTARTING, number=2, gpus=(0,)), Go((0,)), 0.0)
    assert actions == [MarkStarting((0,), "relaunching"), FindCheckpoint(3)]


def test_starting_job_found_at_daemon_start_goes_without_a_second_mark():
    s, actions = advance(ready(JobState.STARTING, gpus=(0,)), Go((0,)), 0.0)
    assert actions == [FindCheckpoint(1)] and s.phase is Phase.PREPARING


def test_ready_to_staging_on_go_when_the_job_stages_data():
    s, actions = advance(ready(limits=replace(LIMITS, stages=True)), Go(()), 0.0)
    assert s.phase is Phase.STAGING and kinds(actions) == [MarkStarting, StartStaging]


def test_staging_to_preparing_when_the_copier_succeeds():
    s, _ = advance(ready(limits=replace(LIMITS, stages=True)), Go(()), 0.0)
    s, actions = advance(s, StagingEnded(True, "staged 3 files"), 4.0)
    assert s.phase is Phase.PREPARING and s.ledger.staged and kinds(actions) == [FindCheckpoint]


def test_staging_to_failed_when_the_copier_fails():
    s, _ = advance(ready(limits=replace(LIMITS, stages=True)), Go(()), 0.0)
    s, actions = advance(s, StagingEnded(False, "staging failed: no space"), 4.0)
    finish = only(actions, FinishAttempt)
    assert s.phase is Phase.DONE and (finish.number, finish.state, finish.reason) == (0, JobState.FAILED,
                                                                                      "staging failed: no space")
    assert finish.release_gpus


def test_staging_to_failed_when_the_copier_cannot_start():
    s, _ = advance(ready(limits=replace(LIMITS, stages=True)), Go(()), 0.0)
    s, actions = advance(s, ActionFailed(StartStaging(), "PermissionError: /data"), 0.0)
    assert s.phase is Phase.DONE and only(actions, FinishAttempt).reason == "staging failed: PermissionError: /data"


def test_preparing_spawns_from_the_checkpoint_found():
    s, _ = advance(ready(), Go((0,)), 0.0)
    s, actions = advance(s, CheckpointFound("/c/step-000000020", 20, 1), 1.0)
    assert actions == [Spawn(1, "/c/step-000000020", 20)] and s.attempt.resume.step == 20


def test_preparing_to_running_on_spawned():
    s = running(3.0)
    assert (s.phase, s.ledger.job_state, s.attempt.started, s.attempt.started_wall) == (Phase.RUNNING, JobState.RUNNING, 3.0, WALL0 + 3.0)


def test_preparing_to_failed_when_the_owner_is_deleted():
    s, _ = advance(ready(), Go((0,)), 0.0)
    s, actions = advance(s, ActionFailed(FindCheckpoint(1), "UserPathError: uid 4321 has no account"), 1.0)
    finish = only(actions, FinishAttempt)
    assert s.phase is Phase.DONE and finish.state is JobState.FAILED and finish.number == 0
    assert finish.reason == "cannot prepare the attempt: UserPathError: uid 4321 has no account"


def test_preparing_to_failed_on_spawn_failure_with_the_reason():
    s, _ = advance(ready(), Go((0,)), 0.0)
    s, _ = advance(s, CheckpointFound(None, None, 1), 0.0)
    s, actions = advance(s, ActionFailed(Spawn(1, None, None), "FileNotFoundError: /x/python"), 0.0)
    finish = only(actions, FinishAttempt)
    assert s.phase is Phase.DONE
    assert (finish.number, finish.state, finish.reason, finish.reason_class) == (
        1, JobState.FAILED, "launch failed: FileNotFoundError: /x/python", "launch")


def test_preparing_to_failed_when_checkpoint_discovery_never_answers():
    s, _ = advance(ready(), Go((0,)), 0.0)
    s, actions = advance(s, Tick(), CHECKPOINT_DEADLINE_SECONDS - 1)
    assert s.phase is Phase.PREPARING and actions == []
    s, actions = advance(s, Tick(), CHECKPOINT_DEADLINE_SECONDS + 1)
    assert s.phase is Phase.DONE and "did not finish" in only(actions, FinishAttempt).reason


def test_backoff_counts_down_in_monotonic_time_to_ready():
    s, _ = ended(running(), 30.0, code=1)
    s, _ = advance(s, Diagnosed(1, None, False), 30.0)
    s, _ = advance(s, Tick(), 34.0)
    assert s.phase is Phase.BACKOFF and s.ledger.backoff_remaining == 6 and not s.ready
    s, _ = advance(s, Tick(), 40.0)
    assert s.phase is Phase.READY and s.ready


def test_backoff_then_go_relaunches_as_attempt_2():
    s, _ = ended(running(), 30.0, code=1)
    s, _ = advance(s, Diagnosed(1, None, False), 30.0)
    s, _ = advance(s, Tick(), 41.0)
    s, actions = advance(s, Go((0, 1)), 41.0)
    assert actions == [MarkStarting((0, 1), "relaunching"), FindCheckpoint(2)] and s.number == 2


def test_a_stored_backoff_resumes_with_its_remaining_seconds():
    s = ready(JobState.RESTARTING, backoff_remaining=7.5, now=100.0)
    assert s.phase is Phase.BACKOFF
    s, _ = advance(s, Tick(), 105.0)
    assert s.ledger.backoff_remaining == 2.5
    s, _ = advance(s, Tick(), 108.0)
    assert s.ready


def test_backoff_stores_its_countdown_every_15_seconds_so_a_killed_daemon_loses_little():
    s = ready(JobState.RESTARTING, backoff_remaining=40.0, now=0.0)
    s, actions = advance(s, Tick(), 4.0)  # 36 s left: same 15 s slice as 40, nothing written
    assert actions == []
    s, actions = advance(s, Tick(), 11.0)  # 29 s left: below 30, a new slice, stored
    assert actions == [SaveBackoff(29.0)]
    s, actions = advance(s, Tick(), 26.0)  # 14 s left
    assert actions == [SaveBackoff(14.0)] and s.phase is Phase.BACKOFF
