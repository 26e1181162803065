import pytest

from spx.daemon.core.spec import parse_spec
from spx.daemon.state.attempts_table import restarts_by_reason
from spx.daemon.state.jobs_table import DuplicateJob
from spx.daemon.state.states import IllegalTransition, JobState
from spx.daemon.state.store import Store


def spec(name="a"):
    return parse_spec(f"name: {name}\nscript: a.py\n")


def test_transitions_are_checked_and_recorded(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    jid = store.jobs.add(spec(), 0, "root", "/x", 1.0)
    store.jobs.transition(jid, JobState.STARTING, "GPUs allocated", 2.0, gpus=[0, 1])
    with pytest.raises(IllegalTransition):
        store.jobs.transition(jid, JobState.QUEUED, "no", 3.0)
    job = store.jobs.get(jid)
    assert job.state is JobState.STARTING and job.gpus == [0, 1] and job.reason == "GPUs allocated"
    store.close()


def test_names_unique_among_live_jobs_only(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    jid = store.jobs.add(spec(), 0, "root", "/x", 1.0)
    with pytest.raises(DuplicateJob):
        store.jobs.add(spec(), 0, "root", "/y", 2.0)
    store.jobs.transition(jid, JobState.CANCELLED, "cancelled", 3.0)
    jid2 = store.jobs.add(spec(), 0, "root", "/y", 4.0)
    assert store.jobs.by_name("a").id == jid2
    store.close()


def test_attempts_and_restart_counts(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    jid = store.jobs.add(spec(), 0, "root", "/x", 1.0)
    a1 = store.attempts.start(jid, number=1, attempt_id="u1", now=2.0, resumed_from=None, resumed_from_step=None, port=1)
    store.attempts.end(a1, end=3.0, exit_code=1, reason="exit code 1", reason_class="crash")
    store.attempts.start(jid, number=2, attempt_id="u2", now=4.0, resumed_from="/c/step-000000010",
                        resumed_from_step=10, port=2)
    assert store.attempts.open_for(jid).number == 2
    assert restarts_by_reason(store.attempts.for_job(jid)) == {"crash": 1}
    store.attempts.end(store.attempts.open_for(jid).id, end=5.0, exit_code=None, reason="oom", reason_class=None)
    assert restarts_by_reason(store.attempts.for_job(jid)) == {"crash": 1}  # the last: not followed by one
    store.attempts.start(jid, number=3, attempt_id="u3", now=6.0, resumed_from=None, resumed_from_step=None, port=3)
    assert restarts_by_reason(store.attempts.for_job(jid)) == {"crash": 1, "unknown": 1}
    store.close()


def test_readonly_store_sees_committed_state(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    store.jobs.add(spec(), 0, "root", "/x", 1.0)
    ro = Store(tmp_path / "s.sqlite", readonly=True)
    assert [j.name for j in ro.jobs.live()] == ["a"]
    ro.close()
    store.close()


def test_current_jobs_are_one_per_name_and_old_finished_ones_age_out(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    old = store.jobs.add(spec("old"), 0, "root", "/x", 1.0)
    store.jobs.transition(old, JobState.CANCELLED, "cancelled", 2.0)
    first = store.jobs.add(spec("a"), 0, "root", "/x", 10.0)
    store.jobs.transition(first, JobState.FAILED, "crash loop", 20.0)
    again = store.jobs.add(spec("a"), 0, "root", "/y", 30.0)  # the name reused: the live one is "a"
    done = store.jobs.add(spec("b"), 0, "root", "/z", 31.0)
    store.jobs.transition(done, JobState.CANCELLED, "cancelled", 40.0)
    assert [(j.name, j.id) for j in store.jobs.current(finished_since=5.0)] == [("a", again), ("b", done)]
    store.jobs.transition(again, JobState.CANCELLED, "cancelled", 50.0)
    assert [(j.name, j.id) for j in store.jobs.current(finished_since=45.0)] == [("a", again)]
    assert len(store.jobs.all()) == 4
    store.close()


def test_finish_attempt_ends_the_attempt_and_moves_the_job_in_one_transaction(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    jid = store.jobs.add(spec(), 0, "root", "/x", 1.0)
    store.jobs.transition(jid, JobState.STARTING, "GPUs allocated", 2.0, gpus=[0])
    row = store.attempts.start(jid, number=1, attempt_id="u1", now=3.0, resumed_from=None, resumed_from_step=None, port=1)
    store.attempts.running(jid, row, pgid=4242, boot_id="b", start_ticks=99, reason="fresh", now=3.0)
    ended = {"end": 9.0, "exit_code": 1, "reason": "exit code 1", "reason_class": "crash", "max_step": 7}
    # An illegal edge (running → queued) rolls back the attempt's end too: both or neither.
    with pytest.raises(IllegalTransition):
        store.attempts.finish(jid, row, JobState.QUEUED, "no", 9.0, ended, {})
    assert store.attempts.open_for(jid).id == row and store.jobs.get(jid).state is JobState.RUNNING
    store.attempts.finish(jid, row, JobState.RESTARTING, "exit code 1", 9.0, ended,
                         {"backoff_remaining": 20.0, "backoff_level": 1, "no_progress_streak": 0})
    job, (attempt,) = store.jobs.get(jid), store.attempts.for_job(jid)
    assert (job.state, job.backoff_remaining, job.backoff_level, job.gpus) == (JobState.RESTARTING, 20.0, 1, [0])
    assert (attempt.end, attempt.max_step, attempt.pgid, attempt.boot_id, attempt.start_ticks) == (9.0, 7, 4242, "b", 99)
    store.close()


def test_only_the_jobs_own_faults_count_as_restarts(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    jid = store.jobs.add(spec(), 0, "root", "/x", 1.0)
    for n, cls in enumerate(["daemon-restart", "crash", "daemon-restart", "hang"], start=1):
        row = store.attempts.start(jid, number=n, attempt_id=f"u{n}", now=n, resumed_from=None, resumed_from_step=None, port=1)
        store.attempts.end(row, end=n + 0.5, reason=cls, reason_class=cls)
    store.attempts.start(jid, number=5, attempt_id="u5", now=5.0, resumed_from=None, resumed_from_step=None, port=1)
    assert store.attempts.fault_count(jid) == 2
    store.close()


def test_a_store_of_an_older_daemon_gets_the_new_columns(tmp_path):
    import sqlite3

    path = tmp_path / "s.sqlite"
    Store(path).close()
    db = sqlite3.connect(path)  # make it what an older daemon wrote: no version, columns missing
    db.execute("ALTER TABLE jobs DROP COLUMN backoff_remaining")
    db.execute("ALTER TABLE attempts DROP COLUMN boot_id")
    db.execute("PRAGMA user_version = 0")
    db.commit()
    db.close()
    store = Store(path)
    jid = store.jobs.add(spec(), 0, "root", "/x", 1.0)
    assert store.jobs.get(jid).backoff_remaining == 0.0
    store.close()


def test_a_quarantined_gpu_stays_until_released_and_both_are_events(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    assert store.host.quarantine_gpu(3, "GPU-3", "XID 79 on GPU 3 (GPU fell off the bus)", 100.0)
    assert not store.host.quarantine_gpu(3, "GPU-3", "a later reason", 101.0)  # the first reason is kept
    store.close()
    reopened = Store(tmp_path / "s.sqlite")
    assert reopened.host.quarantined_gpus() == {3: ("GPU-3", "XID 79 on GPU 3 (GPU fell off the bus)", 100.0)}
    assert reopened.host.release_gpu(3, "root", 200.0) and not reopened.host.release_gpu(3, "root", 201.0)
    assert reopened.host.quarantined_gpus() == {}
    kinds = [r[0] for r in reopened.db.conn.execute("SELECT kind FROM events WHERE job_id IS NULL ORDER BY id")]
    assert kinds == ["gpu-quarantined", "gpu-released"]
