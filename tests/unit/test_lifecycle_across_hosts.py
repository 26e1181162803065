"""The job state machine for a job across hosts (lifecycle/across_hosts.py, limits.gang): every
attempt runs in a generation the hosts share; its end is agreed with the other hosts before it is
recorded; a newer generation begun by another host stops this host's share and its decision applies
here, uncounted (docs/multinode.md). Scripted observations, no processes.
"""

from __future__ import annotations

import signal
from dataclasses import replace

from lifecycle_script import LIMITS, WALL0, kinds, logs, only

from spx.daemon.lifecycle.across_hosts import AGREE_DEADLINE_SECONDS
from spx.daemon.lifecycle.actions import (
    AgreeGeneration,
    FindCheckpoint,
    FinishAttempt,
    RecordStop,
    SignalTerm,
    Spawn,
)
from spx.daemon.lifecycle.machine import adopted, advance, placed
from spx.daemon.lifecycle.observations import (
    ActionFailed,
    AllGone,
    CancelRequested,
    CheckpointFound,
    Diagnosed,
    GangSeen,
    GenerationAgreed,
    Go,
    HeartbeatSeen,
    LauncherExited,
    Spawned,
    Tick,
)
from spx.daemon.lifecycle.record import GangTurn, Phase
from spx.daemon.state.states import JobState

GANG = replace(LIMITS, gang=True)


def gang_running(gen: int = 0, now: float = 0.0, s=None):
    """Attempt 1 (or the next) of a job across hosts, up in generation `gen`."""
    s = s or placed(1, "wide", GANG, JobState.QUEUED, ())
    s, _ = advance(s, Go((0, 1)), now)
    s, actions = advance(s, CheckpointFound(None, None, s.number, generation=gen), now)
    assert only(actions, Spawn).number == s.number and s.share.generation == gen
    s, _ = advance(s, Spawned(4242, WALL0 + now), now)
    return s


def crashed(s, now: float):
    s, _ = advance(s, LauncherExited(1, None), now)
    s, _ = advance(s, AllGone(), now)
    return advance(s, Diagnosed(s.number, "RuntimeError: boom", False), now)


def test_a_failure_here_is_agreed_before_it_is_recorded_and_begins_the_next_generation():
    s, actions = crashed(gang_running(gen=3), 30.0)
    assert s.phase is Phase.AGREEING and not any(isinstance(a, FinishAttempt) for a in actions)
    agree = only(actions, AgreeGeneration)
    assert (agree.number, agree.generation) == (1, 3)
    assert agree.bump == GangTurn(gen=4, reason="exit code 1", counted=True, delay=10.0, final=None)
    # This host began generation 4: its own decision stands, counted here.
    s, actions = advance(s, GenerationAgreed(1, True, GangTurn(4, "me", "exit code 1", True, 10.0)), 30.2)
    finish = only(actions, FinishAttempt)
    assert (finish.state, finish.reason_class, finish.backoff_remaining) == (JobState.RESTARTING, "crash", 10.0)
    assert s.ledger.restarts == 1 and s.phase is Phase.BACKOFF


def test_a_failure_after_another_host_began_the_next_generation_follows_it_uncounted():
    s, _ = crashed(gang_running(gen=3), 30.0)
    theirs = GangTurn(4, "node1", "killed by SIGKILL", True, delay=2.0)
    s, actions = advance(s, GenerationAgreed(1, False, theirs), 30.2)
    finish = only(actions, FinishAttempt)
    assert finish.state is JobState.RESTARTING and finish.reason_class == "peer-restart"
    assert finish.reason == "restarted with the job's other hosts: killed by SIGKILL on host node1"
    assert finish.backoff_remaining == 2.0, "the delay the other host decided: all hosts relaunch together"
    assert s.ledger.restarts == 0 and s.ledger.class_counts == (), "counted once, by the host that began the generation"


def test_a_newer_generation_seen_while_running_stops_this_share_and_relaunches_into_it():
    s = gang_running(gen=3)
    s, actions = advance(s, GangSeen(GangTurn(3)), 5.0)
    assert actions == [] and s.phase is Phase.RUNNING, "its own generation: nothing to do"
    theirs = GangTurn(4, "node1", "killed by SIGKILL", True, delay=0.0)
    s, actions = advance(s, GangSeen(theirs), 6.0)
    assert s.phase is Phase.STOPPING and s.attempt.stop_cause == "peer-restart" and s.share.peer == theirs
    assert kinds(actions) == [RecordStop, SignalTerm] and "peer_restart" in logs(actions)
    s, _ = advance(s, LauncherExited(None, signal.SIGTERM), 8.0)
    s, actions = advance(s, AllGone(), 8.1)
    # No diagnosis (not its failure); the end is still agreed: the other hosts learn the share left.
    agree = only(actions, AgreeGeneration)
    assert s.phase is Phase.AGREEING and agree.bump is None and agree.generation == 3
    s, actions = advance(s, GenerationAgreed(1, False, theirs), 8.3)
    finish = only(actions, FinishAttempt)
    assert (finish.state, finish.reason_class, finish.backoff_remaining) == (JobState.RESTARTING, "peer-restart", 0.0)
    assert s.phase is Phase.READY and s.ledger.restarts == 0
    # The next attempt joins the newer generation.
    s, actions = advance(s, Go((0, 1)), 8.4)
    assert only(actions, FindCheckpoint).number == 2
    s, _ = advance(s, CheckpointFound(None, None, 2, generation=4), 9.0)
    assert s.share.generation == 4


def test_a_final_generation_ends_the_job_here_with_the_other_hosts_reason():
    s = gang_running(gen=1)
    theirs = GangTurn(2, "node0", "cancelled by alice", False, final=JobState.CANCELLED)
    s, _ = advance(s, GangSeen(theirs), 3.0)
    s, _ = advance(s, LauncherExited(None, signal.SIGTERM), 4.0)
    s, _ = advance(s, AllGone(), 4.0)
    s, actions = advance(s, GenerationAgreed(1, False, theirs), 4.1)
    finish = only(actions, FinishAttempt)
    assert finish.state is JobState.CANCELLED and finish.release_gpus
    assert finish.reason == "cancelled by alice on host node0" and s.phase is Phase.DONE


def test_a_job_ended_on_another_host_is_not_started_here():
    s = placed(1, "wide", GANG, JobState.RESTARTING, (0, 1), number=2, generation=5)
    s, _ = advance(s, Go((0, 1)), 0.0)
    final = GangTurn(6, "node0", "crash loop: 3 attempts in a row made no step progress", True, final=JobState.FAILED)
    s, actions = advance(s, CheckpointFound(None, None, 3, final=final), 1.0)
    finish = only(actions, FinishAttempt)
    assert (finish.number, finish.state) == (0, JobState.FAILED) and "on host node0" in finish.reason
    assert not any(isinstance(a, Spawn) for a in actions) and s.phase is Phase.DONE


def test_a_cancel_here_ends_every_host_with_a_final_generation():
    s = gang_running(gen=2)
    s, _ = advance(s, CancelRequested("alice"), 1.0)
    s, _ = advance(s, LauncherExited(75, None), 3.0)
    s, actions = advance(s, AllGone(), 3.0)
    bump = only(actions, AgreeGeneration).bump
    assert bump is not None and bump.final is JobState.CANCELLED and bump.reason == "cancelled by alice"


def test_a_success_tells_the_others_but_begins_no_generation_and_ignores_a_late_bump():
    s = gang_running(gen=2)
    s, _ = advance(s, HeartbeatSeen(16, WALL0 + 5, "finished"), 5.0)
    s, _ = advance(s, GangSeen(GangTurn(3, "node1", "exit code 1", True)), 5.5)
    assert s.phase is Phase.RUNNING, "training finished here: its exit is not disturbed"
    s, _ = advance(s, LauncherExited(0, None), 6.0)
    s, actions = advance(s, AllGone(), 6.0)
    assert only(actions, AgreeGeneration).bump is None
    s, actions = advance(s, GenerationAgreed(1, False, GangTurn(3, "node1", "exit code 1", True)), 6.1)
    assert only(actions, FinishAttempt).state is JobState.SUCCEEDED


def test_an_agreement_that_never_comes_or_fails_records_this_hosts_own_decision():
    s, _ = crashed(gang_running(gen=0), 30.0)
    s2, actions = advance(s, Tick(), 30.0 + AGREE_DEADLINE_SECONDS + 1)
    assert only(actions, FinishAttempt).state is JobState.RESTARTING and "generation_not_agreed" in logs(actions)
    assert s2.ledger.restarts == 1
    agree = AgreeGeneration(1, 0, GangTurn(1, reason="exit code 1", counted=True, delay=10.0))
    s3, actions = advance(s, ActionFailed(agree, "TimeoutError: lock held"), 31.0)
    assert only(actions, FinishAttempt).state is JobState.RESTARTING and s3.phase is Phase.BACKOFF


def test_a_delay_from_the_shared_dir_is_capped_by_the_jobs_backoff():
    s, _ = crashed(gang_running(gen=0), 30.0)
    s, actions = advance(s, GenerationAgreed(1, False, GangTurn(1, "x", "exit code 1", True, delay=1e9)), 30.1)
    assert only(actions, FinishAttempt).backoff_remaining == LIMITS.restart.backoff_seconds[1]


def test_a_one_host_job_never_agrees():
    s = placed(1, "job", LIMITS, JobState.QUEUED, ())
    s = gang_running(gen=0, s=s)  # a generation given to a one-host job is ignored by the end
    s, actions = crashed(s, 30.0)
    assert not any(isinstance(a, AgreeGeneration) for a in actions) and s.phase is Phase.BACKOFF


def test_an_adopted_attempt_keeps_its_generation_and_a_lost_one_begins_the_next():
    base = placed(1, "wide", GANG, JobState.RUNNING, (0, 1), number=1)
    s, actions = adopted(base, 1, WALL0, None, 0.0, ended=LauncherExited(None, None, lost=True), generation=7)
    assert s.share.generation == 7
    s, actions = advance(s, AllGone(), 0.5)
    bump = only(actions, AgreeGeneration).bump
    assert bump is not None and bump.gen == 8 and not bump.counted, "lost: a new round, not the job's fault"


def test_an_attempt_that_got_nowhere_while_a_host_stayed_away_fails_the_job_naming_it():
    s = gang_running(gen=1)
    why = "host node1 gone: no word from its daemon for 640 s (nodes.host_timeout_seconds: 600)"
    s, _ = advance(s, GangSeen(GangTurn(1), why), 601.0)
    assert s.phase is Phase.RUNNING and s.share.missing_host == why
    s, actions = crashed(s, 605.0)  # the agent's join timeout: exit 1, no step
    bump = only(actions, AgreeGeneration).bump
    assert bump is not None and bump.final is JobState.FAILED and bump.reason == why, "every host ends with it"
    s, actions = advance(s, GenerationAgreed(1, True, bump), 605.2)
    finish = only(actions, FinishAttempt)
    assert (finish.state, finish.reason, finish.reason_class) == (JobState.FAILED, why, "host-lost")


def test_a_host_back_in_time_or_an_attempt_that_trained_is_no_lost_host():
    s = gang_running(gen=1)
    s, _ = advance(s, GangSeen(GangTurn(1), "host node1 gone: …"), 601.0)
    s, _ = advance(s, GangSeen(GangTurn(1), None), 602.0)
    assert s.share.missing_host is None
    s, _ = advance(s, GangSeen(GangTurn(1), "host node1 gone: …"), 603.0)
    s, _ = advance(s, HeartbeatSeen(4, WALL0 + 603, "running"), 603.0)
    s, actions = crashed(s, 604.0)
    bump = only(actions, AgreeGeneration).bump
    assert bump is not None and bump.final is None, "it trained: a restart, as for any failure"
