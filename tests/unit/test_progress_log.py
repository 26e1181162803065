"""run/progress_log.py: an attempt's progress record kept from its heartbeats and written to its
store row — at once for what the ledger cannot do without, else throttled — and carried on by a
daemon that adopts the attempt. A real store in a temporary directory, a fake clock."""

from __future__ import annotations

import os

import pytest

from spx.daemon.contract.worker_env import Heartbeat
from spx.daemon.core.spec import parse_spec
from spx.daemon.run.progress_log import WRITE_EVERY_SECONDS, ProgressLog
from spx.daemon.state import attempt_progress
from spx.daemon.state.attempt_progress import Progress
from spx.daemon.state.states import JobState
from spx.daemon.state.store import Store


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def world(tmp_path):
    store = Store(tmp_path / "spx.sqlite")
    job = store.jobs.add(parse_spec("name: pl\nscript: /bin/true\n"), os.getuid(), "u", "/spool/pl", 1.0)
    store.jobs.transition(job, JobState.STARTING, "s", 2.0)
    row = store.attempts.start(job, number=1, attempt_id="a1", now=100.0, resumed_from=None, resumed_from_step=None,
                               port=None)
    yield store, job, row
    store.close()


def stored(store, job):
    return attempt_progress.stored(store.attempts.open_for(job).progress)


def beat(step, time, ckpt=None, status="running", stall=None):
    return Heartbeat(step=step, time=time, last_checkpoint_step=ckpt[0] if ckpt else None,
                     last_checkpoint_time=ckpt[1] if ckpt else None, status=status, checkpoint_stall_seconds=stall)


def test_the_first_beat_and_each_save_are_written_at_once_progress_at_most_every_few_seconds(world):
    store, job, row = world
    clock = Clock()
    log = ProgressLog(store, clock)
    log.beat(job, row, beat(40, 99.0))                       # the previous attempt's beat, still in the file
    assert stored(store, job) is None
    log.beat(job, row, beat(1, 101.0))
    assert stored(store, job) == Progress(first=(101.0, 1), last=(101.0, 1))
    clock.now = 1.0
    log.beat(job, row, beat(2, 102.0))
    assert stored(store, job).last == (101.0, 1)             # throttled
    log.beat(job, row, beat(4, 104.0, ckpt=(3, 103.5), stall=0.4))
    assert stored(store, job) == Progress(first=(101.0, 1), last=(104.0, 4), saves=((3, 103.5),), kept=(103.5, 0.4))
    log.beat(job, row, beat(4, 104.2))
    clock.now = 1.0 + WRITE_EVERY_SECONDS
    log.beat(job, row, beat(5, 105.0))
    assert stored(store, job).last == (105.0, 5)
    log.beat(job, row, beat(6, 106.0))
    log.exited(row)
    assert stored(store, job).last == (106.0, 6)


def test_a_daemon_that_adopts_the_attempt_carries_its_stored_record_on(world):
    store, job, row = world
    before = ProgressLog(store, Clock())
    before.beat(job, row, beat(1, 101.0, ckpt=(1, 101.2)))
    after = ProgressLog(store, Clock())                      # a new daemon: nothing in memory
    after.beat(job, row, beat(9, 140.0, status="finished"))
    assert stored(store, job) == Progress(first=(101.0, 1), last=(140.0, 9), saves=((1, 101.2),), kept=(101.0, 0.0))


def test_a_row_that_is_not_the_jobs_open_attempt_is_not_kept(world):
    store, job, row = world
    log = ProgressLog(store, Clock())
    log.beat(job, row + 1, beat(1, 101.0))
    log.beat(job, None, beat(1, 101.0))
    assert stored(store, job) is None
