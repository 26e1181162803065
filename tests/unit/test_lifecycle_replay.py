"""The job state machine when a replay of its checkpoints differs (lifecycle/stopping.py
`replay_differed`, policy.py, rollback.py, ending.py): a running attempt is killed at once and
relaunched, uncounted, from the newest checkpoint before the step, with the later ones set aside and
no data skipped; between attempts the next discovery does it; the rollback survives a daemon restart
through the stored attempt row; a replay job's end takes its verdict to the job it verified — one test
per edge, by scripting observations."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

from lifecycle_script import LIMITS, WALL0, kinds, logs, only, relaunch, running

from spx.daemon.contract.replay_verdict import ReplayVerdict
from spx.daemon.core.causes import ReasonClass, StopCause
from spx.daemon.core.restart_spec import Restart
from spx.daemon.lifecycle import resume_fallback
from spx.daemon.lifecycle.actions import (
    FinishAttempt,
    Note,
    RecordStop,
    RecordVerdict,
    RemoveCgroup,
    SignalKill,
)
from spx.daemon.lifecycle.machine import advance
from spx.daemon.lifecycle.observations import (
    AllGone,
    Diagnosed,
    HeartbeatSeen,
    LauncherExited,
    ReplayDiffered,
    Tick,
)
from spx.daemon.lifecycle.record import Phase
from spx.daemon.lifecycle.rollback import Rollback, rollback_after
from spx.daemon.state.states import JobState

WHAT = "rank 1's gradient norm 0.8312, recorded 0.8311"
LIMITS0 = replace(LIMITS, restart=Restart(max_restarts=2, backoff_seconds=(5, 5)))


def killed_for_replay(s, now, step=25):
    """The replay differs at `step` while the attempt trains at step 44; it dies of the SIGKILL."""
    s, _ = advance(s, HeartbeatSeen(44, WALL0 + now, "running"), now)
    s, stop = advance(s, ReplayDiffered(step, WHAT), now + 1)
    s, _ = advance(s, LauncherExited(None, 9), now + 2)
    s, end = advance(s, AllGone(), now + 2)  # no diagnosis: the daemon knows why it ended
    return s, stop, end


def test_a_running_attempt_is_killed_at_once_without_a_checkpoint_of_its_wrong_state():
    s, stop, _ = killed_for_replay(running(limits=LIMITS0), 10.0)
    assert kinds(stop) == [RecordStop, SignalKill] and logs(stop) == ["replay_differed"]
    assert only(stop, RecordStop).cause is StopCause.CORRUPTION
    assert "a replay on other GPUs differs at step 25" in only(stop, Note).text


def test_it_is_relaunched_at_once_uncounted_with_the_evidence_as_its_reason():
    s, _, end = killed_for_replay(running(limits=LIMITS0), 10.0)
    finish = only(end, FinishAttempt)
    assert (finish.state, finish.reason_class, finish.backoff_remaining) == (JobState.RESTARTING, ReasonClass.CORRUPTION, 0.0)
    assert finish.reason == f"a replay on other GPUs differs at step 25: {WHAT}"
    assert s.ledger.restarts == 0 and s.phase is Phase.READY


def test_the_relaunch_sets_aside_the_checkpoints_from_the_step_and_skips_no_data():
    s, _, _ = killed_for_replay(running(limits=LIMITS0), 10.0)
    s, find, spawn = relaunch(s, 20.0, "/ck/step-000000020", 20)
    assert find.rollback == Rollback(25, WHAT, sets_aside=True)
    assert (spawn.resume_from, spawn.resume_step, spawn.skip_steps) == ("/ck/step-000000020", 20, ())
    assert find.rollback.describe(20, True) == (
        f"rolled back from step 25 (a replay differs: {WHAT}) to checkpoint 20, the checkpoints from step 25 on set aside")
    assert s.ledger.reject is None


def test_after_the_rolled_back_attempt_ends_the_next_relaunch_is_plain():
    s, _, _ = killed_for_replay(running(limits=LIMITS0), 10.0)
    s, _, _ = relaunch(s, 20.0, "/ck/step-000000020", 20)
    s, _ = advance(s, HeartbeatSeen(33, WALL0 + 30, "running"), 30.0)
    s, _ = advance(s, LauncherExited(1, None), 31.0)
    s, _ = advance(s, AllGone(), 31.0)
    s, _ = advance(s, Diagnosed(s.number, "RuntimeError: boom (user-code)", False), 32.0)
    s, find, _ = relaunch(s, 40.0, "/ck/step-000000030", 30)
    assert find.rollback is None


def test_between_attempts_the_next_discovery_sets_them_aside():
    s = running(limits=LIMITS0)
    s, _ = advance(s, LauncherExited(1, None), 5.0)
    s, _ = advance(s, AllGone(), 5.0)
    s, _ = advance(s, Diagnosed(s.number, "RuntimeError: boom (user-code)", False), 6.0)
    assert s.phase is Phase.BACKOFF
    s, actions = advance(s, ReplayDiffered(25, WHAT), 7.0)
    assert kinds(actions) == [] and logs(actions) == ["replay_differed"] and s.phase is Phase.BACKOFF
    s, _ = advance(s, Tick(), 20.0)
    s, find, spawn = relaunch(s, 21.0, "/ck/step-000000020", 20)
    assert find.rollback == Rollback(25, WHAT, sets_aside=True) and spawn.skip_steps == ()


def test_a_rollback_survives_a_daemon_restart_through_the_stored_attempt_row():
    row = SimpleNamespace(number=4, end=10.0, reason=f"a replay on other GPUs differs at step 25: {WHAT}",
                          reason_class="corruption", resumed_from="/ck/step-000000010", resumed_from_step=10,
                          max_step=44, checkpoint_discovery=None)
    history = resume_fallback.remember((), resume_fallback.past_attempt(row))
    assert rollback_after(history, Restart()) == Rollback(25, WHAT, sets_aside=True)


def test_a_replay_jobs_end_takes_its_verdict_to_the_job_it_verified():
    verdict = ReplayVerdict(0, 40, False, ((0, 10), (10, 20)), 25, "rank_grad_norm", 1, "0.8311", "0.8312")
    s = running(limits=replace(LIMITS0, restart=Restart(max_restarts=0), replay_of="train"))
    s, _ = advance(s, HeartbeatSeen(25, WALL0 + 5, "replayed", replay=verdict), 5.0)
    s, _ = advance(s, LauncherExited(0, None), 6.0)
    s, actions = advance(s, AllGone(), 6.0)
    assert kinds(actions) == [RemoveCgroup, FinishAttempt, RecordVerdict] and s.phase is Phase.DONE
    assert only(actions, RecordVerdict) == RecordVerdict(s.number, "train", verdict, "exit code 0")
