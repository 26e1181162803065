"""run/executor.py: the dispatcher performs every kind of action the machine has, in order, never
raises (an error is ActionFailed; a store that cannot take a write now, a retryable one), and makes no
write of a batch after one the store refused. A real store; no job processes."""

from __future__ import annotations

import pytest

from spx.daemon.core.config import load_config
from spx.daemon.core.lanes import Lanes
from spx.daemon.core.spec import parse_spec
from spx.daemon.lifecycle.actions import ACTIONS, DumpStacks, MarkStarting, Note, SaveBackoff
from spx.daemon.lifecycle.machine import placed
from spx.daemon.lifecycle.observations import ActionFailed, Tick
from spx.daemon.run.executor import Executor
from spx.daemon.run.tracking import limits_of
from spx.daemon.state.db import StoreUnavailable
from spx.daemon.state.states import JobState
from spx.daemon.state.store import Store


@pytest.fixture
def dispatch(tmp_path):
    cfg = load_config(None, tmp_path / "root")
    store = Store(tmp_path / "spx.sqlite")
    lanes = Lanes(2, 1)
    job = store.jobs.get(store.jobs.add(parse_spec("name: d\nscript: /bin/true\n"), 1000, "u", "/spool/d", 1.0))
    record = placed(job.id, job.name, limits_of(job, cfg), JobState.QUEUED, ())
    yield Executor(cfg, store, lanes, None), store, job, record
    lanes.close()
    store.close()


def test_every_action_of_the_machine_has_a_performer(dispatch):
    executor, *_ = dispatch
    assert set(executor.performers) == set(ACTIONS)


def test_after_a_refused_write_the_batchs_later_writes_are_not_made(dispatch, monkeypatch):
    executor, store, job, record = dispatch
    saved = []

    def full(*args, **kwargs):
        raise StoreUnavailable("state store: database or disk is full")

    monkeypatch.setattr(store.jobs, "transition", full)
    monkeypatch.setattr(store.jobs, "update", lambda *a, **kw: saved.append(kw))
    mark, backoff = MarkStarting((0,), "GPUs allocated"), SaveBackoff(5.0)
    answers = executor.perform(job, record, [mark, Note("between"), backoff])
    assert answers == [ActionFailed(mark, "state store: database or disk is full", retry=True),
                       ActionFailed(backoff, "waiting for an earlier write", retry=True)]
    assert saved == [] and executor.store_error == "state store: database or disk is full"


def test_an_action_that_raises_is_answered_with_its_error(dispatch):
    executor, store, job, record = dispatch
    dump = DumpStacks(1)
    assert executor.perform(job, record, [dump]) == [ActionFailed(dump, f"KeyError: {job.id}")]


def test_what_is_seen_of_a_job_without_an_attempt_is_time_passing(dispatch):
    executor, store, job, record = dispatch
    assert executor.observe(job, record) == [Tick()]
