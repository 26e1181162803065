"""Containment: the supervisor with a real store and executor (no job processes): one job's fault,
its owner gone, a store that refuses writes — each stays with its job."""

from __future__ import annotations

import pytest

from spx.daemon.lifecycle import machine as st
from spx.daemon.state.states import JobState


@pytest.fixture
def supervised(tmp_path):
    from spx.daemon.core.config import load_config
    from spx.daemon.run.supervisor import Supervisor
    from spx.daemon.state.store import Store

    cfg = load_config(None, tmp_path / "root")
    for d in (cfg.log_dir, cfg.run_dir, cfg.checkpoints_root):
        d.mkdir(parents=True, exist_ok=True)
    store = Store(cfg.store_path)
    sup = Supervisor(cfg, store)
    yield sup, store
    sup.close(wait=True)
    store.close()


def _add(store, name, owner_uid=0):
    from spx.daemon.core.spec import parse_spec

    return store.add_job(parse_spec(f"name: {name}\nscript: /bin/true\n"), owner_uid, "someone", f"/spool/{name}", 1.0)


def _tick_until(sup, predicate, timeout=15.0):
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        sup.tick()
        time.sleep(0.05)


def test_a_deleted_owner_fails_only_that_job_with_the_reason(supervised):
    from spx.daemon.run.scheduler import Start

    sup, store = supervised
    gone = _add(store, "orphan", owner_uid=54321)  # no such account
    sup.start(Start(gone, (), store.job(gone)))
    _tick_until(sup, lambda: store.job(gone).state is JobState.FAILED)
    reason = store.job(gone).reason or ""
    assert reason.startswith("cannot prepare the attempt") and "54321" in reason, reason
    assert gone not in sup.tracked()


def test_a_bug_in_one_jobs_turn_fails_that_job_and_the_others_go_on(supervised, monkeypatch):
    sup, store = supervised
    ids = {}
    for name in ("buggy", "bystander"):
        ids[name] = _add(store, name)
        store.transition(ids[name], JobState.STARTING, "starting", 2.0)
        store.transition(ids[name], JobState.RESTARTING, "exit code 1", 3.0, backoff_remaining=0.3)
    real_advance = st.advance

    def advance_with_a_bug(s, obs, now):
        if s.job.name == "buggy":
            raise ZeroDivisionError("injected")
        return real_advance(s, obs, now)

    monkeypatch.setattr(st, "advance", advance_with_a_bug)
    sup.recover()
    _tick_until(sup, lambda: any(w.job_id == ids["bystander"] for w in sup.waiting()))
    buggy = store.job(ids["buggy"])
    assert buggy.state is JobState.FAILED and buggy.reason == "daemon error: ZeroDivisionError: injected"
    assert store.job(ids["bystander"]).state is JobState.RESTARTING and ids["buggy"] not in sup.tracked()


def test_a_refused_store_write_is_kept_and_retried_on_the_next_tick(supervised, monkeypatch):
    from spx.daemon.state.store import StoreUnavailable

    sup, store = supervised
    jid = _add(store, "patient")
    store.transition(jid, JobState.STARTING, "starting", 2.0)
    store.transition(jid, JobState.RESTARTING, "exit code 1", 3.0, backoff_remaining=60.0)
    sup.recover()
    real = store.finish_attempt
    refusals = []

    def full_disk(*args, **kwargs):
        if len(refusals) < 2:
            refusals.append(1)
            raise StoreUnavailable("state store: database or disk is full")
        return real(*args, **kwargs)

    monkeypatch.setattr(store, "finish_attempt", full_disk)
    sup.cancel(store.job(jid), "root")
    assert store.job(jid).state is JobState.RESTARTING and sup.store_problem()
    _tick_until(sup, lambda: store.job(jid).state is JobState.CANCELLED)
    assert len(refusals) == 2 and sup.store_problem() is None and jid not in sup.tracked()


def test_the_status_line_says_when_the_state_store_refuses_writes():
    from spx.daemon.service.status_line import format_status

    text = format_status([], 0, None, 0.0, "state store /s.sqlite: database or disk is full")
    assert text == ("0 running, no GPUs (CPU jobs only); "
                    "STATE STORE NOT WRITABLE: state store /s.sqlite: database or disk is full")
    assert format_status([], 0, None, 0.0) == "0 running, no GPUs (CPU jobs only)"


def test_a_job_stored_running_without_an_attempt_is_relaunched_after_a_restart(supervised):
    sup, store = supervised
    jid = _add(store, "lost")
    store.transition(jid, JobState.STARTING, "GPUs allocated", 2.0)
    store.transition(jid, JobState.RUNNING, "fresh start", 3.0)  # its attempt row never made it
    sup.recover()
    _tick_until(sup, lambda: any(w.job_id == jid for w in sup.waiting()))
    job = store.job(jid)
    assert job.state is JobState.RESTARTING and job.reason.startswith("lost")
