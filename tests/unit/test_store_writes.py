"""run/store_writes.py: each of the machine's store writes is one transaction on the right row — the
attempt's end and the job's move together, a write for an attempt without a row touches no row —
and the last restart is kept for the STATUS line. A real SQLite store in a temporary directory."""

from __future__ import annotations

import pytest

from spx.daemon.core.causes import ReasonClass, StopCause
from spx.daemon.core.spec import parse_spec
from spx.daemon.lifecycle import actions as act
from spx.daemon.run.store_writes import StoreWrites
from spx.daemon.state.states import JobState
from spx.daemon.state.store import Store


@pytest.fixture
def writes(tmp_path):
    store = Store(tmp_path / "spx.sqlite")
    job_id = store.jobs.add(parse_spec("name: w\nscript: /bin/true\n"), 1000, "u", "/spool/w", 1.0)
    rows: dict[tuple[int, int], int] = {}
    w = StoreWrites(store, lambda j, n: rows.get((j, n)), wall=lambda: 50.0)
    yield w, store, store.jobs.get(job_id), rows
    store.close()


def test_a_launch_is_recorded_starting_then_running_on_its_row(writes):
    w, store, job, rows = writes
    w.mark_starting(job, act.MarkStarting((0, 1), "GPUs allocated"))
    assert (store.jobs.get(job.id).state, store.jobs.get(job.id).gpus) == (JobState.STARTING, [0, 1])
    rows[(job.id, 1)] = store.attempts.start(job.id, number=1, attempt_id="a1", now=40.0, resumed_from=None,
                                            resumed_from_step=None, port=1234)
    w.record_running(job, act.RecordRunning(1, 4242, "boot", 99, "starting fresh", 41.0))
    row = store.attempts.open_for(job.id)
    assert (row.pgid, row.boot_id, row.start_ticks) == (4242, "boot", 99)
    assert (store.jobs.get(job.id).state, store.jobs.get(job.id).reason) == (JobState.RUNNING, "starting fresh")


def test_a_stop_an_exit_and_the_end_go_to_the_attempts_row_and_the_end_moves_the_job_with_it(writes):
    w, store, job, rows = writes
    store.jobs.transition(job.id, JobState.STARTING, "s", 2.0)
    rows[(job.id, 1)] = row = store.attempts.start(job.id, number=1, attempt_id="a1", now=40.0, resumed_from=None,
                                                  resumed_from_step=None, port=1)
    store.attempts.running(job.id, row, pgid=1, boot_id=None, start_ticks=None, reason="r", now=41.0)
    w.record_stop(job, act.RecordStop(1, StopCause.HANG))
    w.record_exit(job, act.RecordExit(1, None, 9, StopCause.HANG))
    assert (store.attempts.open_for(job.id).stop_cause, store.attempts.open_for(job.id).signal) == ("hang", 9)
    ended = w.finish(job, act.FinishAttempt(1, JobState.RESTARTING, "hang: no step progress for 61 s", ReasonClass.HANG,
                                        signal=9, max_step=8, backoff_remaining=10.0, backoff_level=1))
    assert ended == row and store.attempts.open_for(job.id) is None
    attempt = store.attempts.for_job(job.id)[0]
    assert (attempt.end, attempt.reason_class, attempt.max_step) == (50.0, "hang", 8)
    after = store.jobs.get(job.id)
    assert (after.state, after.backoff_remaining, after.backoff_level) == (JobState.RESTARTING, 10.0, 1)
    assert w.last_restart == ("w", 50.0, "hang")


def test_writes_for_an_attempt_without_a_row_touch_no_row_and_a_daemon_restart_is_no_restart_to_show(writes):
    w, store, job, rows = writes
    store.jobs.transition(job.id, JobState.STARTING, "s", 2.0)
    w.record_stop(job, act.RecordStop(3, StopCause.CANCEL))
    w.record_exit(job, act.RecordExit(3, 0, None, None))
    assert w.finish(job, act.FinishAttempt(3, JobState.RESTARTING, "daemon stopped", ReasonClass.DAEMON_RESTART)) is None
    assert store.attempts.for_job(job.id) == [] and store.jobs.get(job.id).state is JobState.RESTARTING
    assert w.last_restart is None
    w.save_backoff(job, act.SaveBackoff(12.5))
    assert store.jobs.get(job.id).backoff_remaining == 12.5
