import json

import pytest

from spx.daemon.core.spec import parse_spec
from spx.daemon.state.states import IllegalTransition, JobState
from spx.daemon.state.store import DuplicateJob, Store


def spec(name="a"):
    return parse_spec(f"name: {name}\nscript: a.py\n")


def test_transitions_are_checked_and_recorded(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    jid = store.add_job(spec(), 0, "root", "/x", 1.0)
    store.transition(jid, JobState.STARTING, "GPUs allocated", 2.0, gpus=[0, 1])
    with pytest.raises(IllegalTransition):
        store.transition(jid, JobState.QUEUED, "no", 3.0)
    job = store.job(jid)
    assert job.state is JobState.STARTING and job.gpus == [0, 1] and job.reason == "GPUs allocated"
    store.close()


def test_names_unique_among_live_jobs_only(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    jid = store.add_job(spec(), 0, "root", "/x", 1.0)
    with pytest.raises(DuplicateJob):
        store.add_job(spec(), 0, "root", "/y", 2.0)
    store.transition(jid, JobState.CANCELLED, "cancelled", 3.0)
    jid2 = store.add_job(spec(), 0, "root", "/y", 4.0)
    assert store.job_by_name("a").id == jid2
    store.close()


def test_attempts_and_restart_counts(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    jid = store.add_job(spec(), 0, "root", "/x", 1.0)
    a1 = store.start_attempt(jid, number=1, attempt_id="u1", now=2.0, resumed_from=None, resumed_from_step=None, port=1)
    store.end_attempt(a1, end=3.0, exit_code=1, reason="exit code 1", reason_class="crash")
    store.start_attempt(jid, number=2, attempt_id="u2", now=4.0, resumed_from="/c/step-000000010",
                        resumed_from_step=10, port=2)
    assert store.open_attempt(jid).number == 2
    assert store.restarts_by_reason(jid) == {"crash": 1}
    store.close()


def test_readonly_store_sees_committed_state(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    store.add_job(spec(), 0, "root", "/x", 1.0)
    ro = Store(tmp_path / "s.sqlite", readonly=True)
    assert [j.name for j in ro.live_jobs()] == ["a"]
    ro.close()
    store.close()


def test_current_jobs_are_one_per_name_and_old_finished_ones_age_out(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    old = store.add_job(spec("old"), 0, "root", "/x", 1.0)
    store.transition(old, JobState.CANCELLED, "cancelled", 2.0)
    first = store.add_job(spec("a"), 0, "root", "/x", 10.0)
    store.transition(first, JobState.FAILED, "crash loop", 20.0)
    again = store.add_job(spec("a"), 0, "root", "/y", 30.0)  # the name reused: the live one is "a"
    done = store.add_job(spec("b"), 0, "root", "/z", 31.0)
    store.transition(done, JobState.CANCELLED, "cancelled", 40.0)
    assert [(j.name, j.id) for j in store.current_jobs(finished_since=5.0)] == [("a", again), ("b", done)]
    store.transition(again, JobState.CANCELLED, "cancelled", 50.0)
    assert [(j.name, j.id) for j in store.current_jobs(finished_since=45.0)] == [("a", again)]
    assert len(store.all_jobs()) == 4
    store.close()


def test_finish_attempt_ends_the_attempt_and_moves_the_job_in_one_transaction(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    jid = store.add_job(spec(), 0, "root", "/x", 1.0)
    store.transition(jid, JobState.STARTING, "GPUs allocated", 2.0, gpus=[0])
    row = store.start_attempt(jid, number=1, attempt_id="u1", now=3.0, resumed_from=None, resumed_from_step=None, port=1)
    store.attempt_running(jid, row, pgid=4242, boot_id="b", start_ticks=99, reason="fresh", now=3.0)
    ended = {"end": 9.0, "exit_code": 1, "reason": "exit code 1", "reason_class": "crash", "max_step": 7}
    # An illegal edge (running → queued) rolls back the attempt's end too: both or neither.
    with pytest.raises(IllegalTransition):
        store.finish_attempt(jid, row, JobState.QUEUED, "no", 9.0, ended, {})
    assert store.open_attempt(jid).id == row and store.job(jid).state is JobState.RUNNING
    store.finish_attempt(jid, row, JobState.RESTARTING, "exit code 1", 9.0, ended,
                         {"backoff_remaining": 20.0, "backoff_level": 1, "no_progress_streak": 0})
    job, (attempt,) = store.job(jid), store.attempts(jid)
    assert (job.state, job.backoff_remaining, job.backoff_level, job.gpus) == (JobState.RESTARTING, 20.0, 1, [0])
    assert (attempt.end, attempt.max_step, attempt.pgid, attempt.boot_id, attempt.start_ticks) == (9.0, 7, 4242, "b", 99)
    store.close()


def test_only_the_jobs_own_faults_count_as_restarts(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    jid = store.add_job(spec(), 0, "root", "/x", 1.0)
    for n, cls in enumerate(["daemon-restart", "crash", "daemon-restart", "hang"], start=1):
        row = store.start_attempt(jid, number=n, attempt_id=f"u{n}", now=n, resumed_from=None, resumed_from_step=None, port=1)
        store.end_attempt(row, end=n + 0.5, reason=cls, reason_class=cls)
    store.start_attempt(jid, number=5, attempt_id="u5", now=5.0, resumed_from=None, resumed_from_step=None, port=1)
    assert store.fault_attempts(jid) == 2
    store.close()


def test_a_store_of_an_older_daemon_gets_the_new_columns(tmp_path):
    import sqlite3

    path = tmp_path / "s.sqlite"
    Store(path).close()
    db = sqlite3.connect(path)
    db.execute("ALTER TABLE jobs DROP COLUMN backoff_remaining")
    db.execute("ALTER TABLE attempts DROP COLUMN boot_id")
    db.commit()
    db.close()
    store = Store(path)
    jid = store.add_job(spec(), 0, "root", "/x", 1.0)
    assert store.job(jid).backoff_remaining == 0.0
    store.close()


def test_a_stored_spec_this_version_refuses_fails_its_job_at_start_instead_of_every_read(tmp_path):
    """An upgrade that tightens a bound (here: hang timeout past 30 days, once accepted) must not
    make each read of the store raise: the job ends failed with the reason, the rest go on."""
    store = Store(tmp_path / "s.sqlite")
    bad = store.add_job(spec("old"), 0, "root", "/x", 1.0)
    good = store.add_job(spec("new"), 0, "root", "/y", 1.0)
    raw = spec("old").model_dump(mode="json", by_alias=True)
    raw["restart"]["hang_timeout_seconds"] = 1e12
    store._db.execute("UPDATE jobs SET spec_json = ? WHERE id = ?", (json.dumps(raw), bad))
    assert {j.name: j.spec_problem is not None for j in store.live_jobs()} == {"old": True, "new": False}
    failed = store.fail_unusable_specs(2.0)
    assert [j.id for j in failed] == [bad]
    old = store.job(bad)
    assert old.state is JobState.FAILED and "restart.hang_timeout_seconds" in (old.reason or "")
    assert [j.id for j in store.live_jobs()] == [good]
    assert store.fail_unusable_specs(3.0) == []
    store.close()


def test_a_quarantined_gpu_stays_until_released_and_both_are_events(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    assert store.quarantine_gpu(3, "GPU-3", "XID 79 on GPU 3 (GPU fell off the bus)", 100.0)
    assert not store.quarantine_gpu(3, "GPU-3", "a later reason", 101.0)  # the first reason is kept
    store.close()
    reopened = Store(tmp_path / "s.sqlite")
    assert reopened.quarantined_gpus() == {3: ("GPU-3", "XID 79 on GPU 3 (GPU fell off the bus)", 100.0)}
    assert reopened.release_gpu(3, "root", 200.0) and not reopened.release_gpu(3, "root", 201.0)
    assert reopened.quarantined_gpus() == {}
    kinds = [r[0] for r in reopened._db.execute("SELECT kind FROM events WHERE job_id IS NULL ORDER BY id")]
    assert kinds == ["gpu-quarantined", "gpu-released"]
