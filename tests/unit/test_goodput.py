"""state/goodput.py: the ledger of scripted attempt histories — every second of a job's life to one
cause, the causes summing to its wall time exactly — and the host's GPU-seconds."""

from __future__ import annotations

import pytest

from spx.daemon.state.attempt_progress import Progress
from spx.daemon.state.goodput import (
    CAUSES,
    HOST_CAUSES,
    AttemptFacts,
    JobFacts,
    account,
    host_account,
    kept_until,
)


def trained(first, last, saves=(), stall=0.0):
    """The progress record of training from `first` to `last` ((time, step) each) with `saves`
    ((step, time) each) and the trainer's reported stall, as `Progress.seen` keeps it: kept up to
    where it reached its newest save's step (its last progress, for a save after it)."""
    if not saves:
        return Progress(first=first, last=last)
    step, when = max(saves, key=lambda s: s[1])
    at = last[0] if when > last[0] and step >= last[1] else min(when, last[0])
    return Progress(first=first, last=last, saves=tuple(saves), kept=(at, min(stall, at - first[0])))


def nonzero(ledger) -> dict[str, float]:
    return {k: pytest.approx(v) for k, v in ledger.seconds.items() if v}


def assert_sums(ledger) -> None:
    assert set(ledger.seconds) == set(CAUSES)
    assert all(v >= 0 for v in ledger.seconds.values()) and ledger.unsettled >= 0
    assert sum(ledger.seconds.values()) + ledger.unsettled == pytest.approx(ledger.wall)
    assert sum(b - a for a, b, _ in ledger.pieces) == pytest.approx(ledger.wall)


def failure(start, *, placed, spawn, first, last, saves=(), exit_, seen, end, cls="user-code", stop=None,
            backoff=None, resumed=None, stall=0.0):
    """An attempt that trained from `first` to `last` ((time, step) each) and then ended."""
    return AttemptFacts(
        start=start, end=end, reason_class=cls, stop_cause=stop, backoff=backoff, resumed_from_step=resumed,
        phases={"placed": placed, "spawn": spawn, "launcher_exit": exit_, "failure_seen": seen, "end_recorded": end},
        progress=trained(first, last, saves, stall))


def test_a_crash_past_the_last_checkpoint_is_recomputed_and_each_restart_phase_is_counted():
    crashed = failure(12, placed=10, spawn=12, first=(20, 1), last=(80, 130), saves=[(100, 60)], exit_=85, seen=86,
                      end=90, backoff=5.0)
    finished = failure(98, placed=97, spawn=98, first=(110, 101), last=(200, 300), saves=[(300, 202)], exit_=205,
                       seen=206, end=207, cls=None, resumed=100)
    ledger = account(JobFacts(submitted=0, gpus=4, allocated=10, ended=207, succeeded=True,
                              attempts=(crashed, finished)), now=1e9)
    assert_sums(ledger)
    assert ledger.wall == 207
    assert nonzero(ledger) == {
        "queued": 10, "startup": 10,            # allocated at 10; placed 10 → spawn 12 → first beat 20
        "productive": 40 + 90,                  # 20 → the save at step 100 (60); all of the last attempt
        "recomputed": 20,                       # 60 → 80: steps 101..130 were trained again
        "restart_detect": 6, "restart_teardown": 4, "backoff": 5, "restart_placed": 2,
        "restart_relaunch": 1, "restart_restore": 12,
        "checkpoint": 5,                        # the final save of step 300 after its last progress
        "shutdown": 2,
    }
    assert ledger.gpu_seconds["productive"] == pytest.approx(130 * 4)
    assert ledger.goodput == pytest.approx(130 / 197)


def test_a_hang_is_the_time_from_the_last_progress_to_the_kill():
    hung = failure(2, placed=1, spawn=2, first=(10, 1), last=(50, 40), saves=[(40, 51)], exit_=150, seen=151,
                   end=152, cls="hang", stop="hang")
    ledger = account(JobFacts(submitted=0, gpus=1, allocated=1, ended=152, attempts=(hung,)), now=1e9)
    assert_sums(ledger)
    assert nonzero(ledger) == {"queued": 1, "startup": 9, "productive": 40, "hang": 100, "shutdown": 2}


def test_a_sigterm_checkpoint_of_the_last_step_recomputes_nothing_and_the_daemons_restart_is_daemon_time():
    stopped = failure(2, placed=1, spawn=2, first=(10, 1), last=(80, 130), saves=[(100, 60), (130, 83)], exit_=84,
                      seen=85, end=86, cls="daemon-restart", stop="daemon-restart")
    resumed = AttemptFacts(start=120, phases={"placed": 118, "spawn": 120},
                           progress=trained((130, 131), (160, 170)), resumed_from_step=130)
    ledger = account(JobFacts(submitted=0, gpus=2, allocated=1, attempts=(stopped, resumed)), now=165)
    assert_sums(ledger)
    assert ledger.seconds["recomputed"] == 0
    assert ledger.unsettled == 35                 # the live attempt has no checkpoint yet: 130 → now 165
    assert nonzero(ledger) == {
        "queued": 1, "startup": 9, "productive": 70,
        "checkpoint": 4,                          # 80 → 84: the JIT save of step 130
        "restart_detect": 1, "restart_teardown": 1,
        "daemon": 32,                             # the daemon's own restart: 86 → placed again at 118
        "restart_relaunch": 2, "restart_restore": 10,
    }


def test_a_daemon_outage_that_lost_the_attempt_is_daemon_time_and_its_lost_steps_recomputed():
    lost = AttemptFacts(start=2, end=300, reason_class="lost", stop_cause="lost", phases={"placed": 1, "spawn": 2},
                        progress=trained((10, 1), (80, 130), saves=((100, 60),)))
    again = AttemptFacts(start=305, phases={"placed": 302, "spawn": 305}, resumed_from_step=100,
                         progress=trained((310, 101), (400, 200), saves=((150, 355),)))
    ledger = account(JobFacts(submitted=0, gpus=1, allocated=1, attempts=(lost, again)), now=400)
    assert_sums(ledger)
    assert ledger.unsettled == 45                 # the live attempt since its save at 355
    assert nonzero(ledger) == {"queued": 1, "startup": 9, "productive": 50 + 45, "recomputed": 20,
                               "daemon": 220, "restart_placed": 2, "restart_relaunch": 3, "restart_restore": 5}


def test_an_adopted_attempt_lost_no_steps_and_has_no_daemon_time():
    # The daemon was down from 40 to 70; the attempt ran on and was adopted: one attempt, no loss.
    adopted = AttemptFacts(start=2, phases={"placed": 1, "spawn": 2},
                           progress=trained((10, 1), (99, 300), saves=((200, 66),)))
    ledger = account(JobFacts(submitted=0, gpus=8, allocated=1, attempts=(adopted,)), now=100)
    assert_sums(ledger)
    assert ledger.seconds["daemon"] == 0 and ledger.seconds["recomputed"] == 0
    assert nonzero(ledger) == {"queued": 1, "startup": 9, "productive": 56}
    assert ledger.unsettled == 34                 # since its save at 66


def test_a_script_without_heartbeat_is_running_time():
    script = AttemptFacts(start=5, end=65, reason_class="user-code", backoff=10.0,
                          phases={"placed": 4, "spawn": 5, "launcher_exit": 60, "failure_seen": 61})
    again = AttemptFacts(start=80, end=140, resumed_from_step=None,
                         phases={"placed": 76, "spawn": 80, "launcher_exit": 139, "failure_seen": 139.5})
    ledger = account(JobFacts(submitted=0, gpus=1, allocated=4, ended=140, attempts=(script, again)), now=1e9)
    assert_sums(ledger)
    assert nonzero(ledger) == {"queued": 4, "startup": 1, "running": 55 + 59, "restart_detect": 1,
                               "restart_teardown": 4, "backoff": 10, "restart_placed": 1, "restart_relaunch": 4,
                               "shutdown": 1}


def test_the_trainers_checkpoint_stall_comes_out_of_the_kept_training_first():
    crashed = failure(2, placed=1, spawn=2, first=(10, 1), last=(80, 130), saves=[(100, 60)], exit_=81, seen=82,
                      end=83, stall=55.0)
    again = AttemptFacts(start=90, phases={"placed": 88, "spawn": 90}, resumed_from_step=100,
                         progress=trained((95, 101), (100, 110)))
    ledger = account(JobFacts(submitted=0, gpus=1, allocated=1, attempts=(crashed, again)), now=100)
    assert_sums(ledger)
    # 50 s of kept training (10 → 60): a reported 55 s stall counts at most the 50 s it could have
    # taken; 60 → 80 recomputed.
    assert ledger.seconds["checkpoint"] == pytest.approx(50)
    assert ledger.seconds["productive"] == 0
    assert ledger.seconds["recomputed"] == pytest.approx(20)
    assert ledger.unsettled == pytest.approx(5)   # the live attempt's 95 → 100


def test_a_job_queued_or_cancelled_before_it_ran_is_all_queued():
    assert nonzero(account(JobFacts(submitted=100, gpus=2), now=160)) == {"queued": 60}
    cancelled = account(JobFacts(submitted=100, gpus=2, ended=130), now=500)
    assert cancelled.wall == 30 and nonzero(cancelled) == {"queued": 30}
    staging = account(JobFacts(submitted=0, gpus=2, allocated=5, staged=True), now=20)
    assert nonzero(staging) == {"queued": 5, "staging": 15}
    starting = account(JobFacts(submitted=0, gpus=2, allocated=5), now=20)   # its first attempt being made
    assert nonzero(starting) == {"queued": 5, "startup": 15}


def test_instants_out_of_order_are_clamped_never_negative_nor_counted_twice():
    odd = failure(50, placed=60, spawn=40, first=(30, 1), last=(20, 5), saves=[(3, 500)], exit_=10, seen=5, end=70,
                  backoff=1000.0)
    nxt = AttemptFacts(start=65, phases={"placed": 64, "spawn": 65}, resumed_from_step=3,
                       progress=trained((66, 4), (90, 9)))
    ledger = account(JobFacts(submitted=0, gpus=1, allocated=55, attempts=(odd, nxt)), now=100)
    assert_sums(ledger)
    assert ledger.wall == 100


def test_kept_until_is_exact_at_a_save_and_interpolates_between_points():
    p = trained((10, 1), (110, 101), saves=((51, 60),))
    assert kept_until(p, 51) == 60
    assert kept_until(p, 76) == pytest.approx(85)       # halfway from the save to the last point
    assert kept_until(p, 101) == 110                  # resumed at its last step: all kept
    assert kept_until(p, 0) == 10                     # resumed from before it: nothing kept
    assert kept_until(p, None) == 10                  # started afresh


def test_the_hosts_gpu_seconds_hold_jobs_quarantine_and_idle_and_sum_to_its_gpu_time():
    one = account(JobFacts(submitted=0, gpus=2, allocated=50, ended=150, succeeded=True, attempts=(
        failure(52, placed=50, spawn=52, first=(60, 1), last=(140, 100), exit_=145, seen=146, end=150, cls=None),)),
        now=1e9)
    waiting = account(JobFacts(submitted=100, gpus=4), now=200)   # queued: holds no GPU
    host = host_account([one, waiting], gpus=8, quarantined=[(120.0, None)], start=100, end=200).settled
    assert set(host) == set(HOST_CAUSES)
    assert sum(host.values()) == pytest.approx(8 * 100)
    assert host["productive"] == pytest.approx(2 * 40)           # 100 → 140 of the job's 60 → 140
    assert host["shutdown"] == pytest.approx(2 * 10)
    assert host["quarantined"] == pytest.approx(80)
    assert host["idle"] == pytest.approx(800 - 80 - 20 - 80)


def test_progress_keeps_first_beat_last_progress_and_saves_of_its_own_attempt_only():
    p = Progress()
    p = p.seen(7, 99.0, 5, 98.0, None, since=100.0)                # the previous attempt's beat
    assert p == Progress()
    p = p.seen(8, 101.0, 5, 98.0, 1.5, since=100.0)                # its save was the previous attempt's
    p = p.seen(9, 102.0, 9, 102.5, 2.5, since=100.0)
    p = p.seen(9, 104.0, 9, 102.5, 2.5, since=100.0)               # no progress: last stays at 102
    # A save of the last step after it keeps the training up to it; its stall is the time after it.
    assert p == Progress(first=(101.0, 8), last=(102.0, 9), saves=((9, 102.5),), kept=(102.0, 0.0))
    p = p.seen(11, 106.0, 10, 105.0, 9.0, since=100.0)
    # A save before the last progress keeps up to it; the reported 9 s of stall count at most the
    # 3 s gained since the kept point.
    assert p.kept == (105.0, 3.0) and p.saves == ((9, 102.5), (10, 105.0))
