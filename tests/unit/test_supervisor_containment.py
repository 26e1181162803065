"""Containment: the supervisor with a real store and executor (no job processes): one job's fault,
its owner gone, a store that refuses writes — each stays with its job. The test plays the main loop:
its clock moves on by hand, and the executor's wake (work sent off the loop came back) is an event."""

from __future__ import annotations

import threading

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
    loop = MainLoop()
    sup = Supervisor(cfg, store, wake=loop.wake, clock=loop.clock)
    yield sup, store, loop
    sup.close(wait=True)
    store.close()


class MainLoop:
    """The main loop's side of the supervisor, played by the test: its clock, moved on by hand, and
    the executor's wake (slow work sent off the loop came back) as an event to wait on."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.woke = threading.Event()

    def clock(self) -> float:
        return self.now

    def wake(self) -> None:
        self.woke.set()


def _add(store, name, owner_uid=0):
    from spx.daemon.core.spec import parse_spec

    return store.jobs.add(parse_spec(f"name: {name}\nscript: /bin/true\n"), owner_uid, "someone", f"/spool/{name}", 1.0)


def _turns_until(sup, loop, predicate, turns=10):
    """Main-loop turns until `predicate` holds, the clock one second on after each (a short backoff
    runs out); a bounded count of turns, not a wait."""
    for _ in range(turns):
        if predicate():
            return
        sup.tick()
        loop.now += 1.0
    assert predicate(), f"not within {turns} turns of the main loop"


def test_a_deleted_owner_fails_only_that_job_with_the_reason(supervised):
    from spx.daemon.run.scheduler import Start

    sup, store, loop = supervised
    gone = _add(store, "orphan", owner_uid=54321)  # no such account
    sup.start(Start(gone, (), store.jobs.get(gone)))
    assert loop.woke.wait(15), "the attempt's preparation, off the loop, came back"
    _turns_until(sup, loop, lambda: store.jobs.get(gone).state is JobState.FAILED)
    reason = store.jobs.get(gone).reason or ""
    assert reason.startswith("cannot prepare the attempt") and "54321" in reason, reason
    assert gone not in sup.tracked()


def test_a_bug_in_one_jobs_turn_fails_that_job_and_the_others_go_on(supervised, monkeypatch):
    sup, store, loop = supervised
    ids = {}
    for name in ("buggy", "bystander"):
        ids[name] = _add(store, name)
        store.jobs.transition(ids[name], JobState.STARTING, "starting", 2.0)
        store.jobs.transition(ids[name], JobState.RESTARTING, "exit code 1", 3.0, backoff_remaining=0.3)
    real_advance = st.advance

    def advance_with_a_bug(s, obs, now):
        if s.job.name == "buggy":
            raise ZeroDivisionError("injected")
        return real_advance(s, obs, now)

    monkeypatch.setattr(st, "advance", advance_with_a_bug)
    sup.recover()
    _turns_until(sup, loop, lambda: any(w.job_id == ids["bystander"] for w in sup.waiting()))
    buggy = store.jobs.get(ids["buggy"])
    assert buggy.state is JobState.FAILED and buggy.reason == "daemon error: ZeroDivisionError: injected"
    assert store.jobs.get(ids["bystander"]).state is JobState.RESTARTING and ids["buggy"] not in sup.tracked()


def test_a_refused_store_write_is_kept_and_retried_on_the_next_tick(supervised, monkeypatch):
    from spx.daemon.state.db import StoreUnavailable

    sup, store, loop = supervised
    jid = _add(store, "patient")
    store.jobs.transition(jid, JobState.STARTING, "starting", 2.0)
    store.jobs.transition(jid, JobState.RESTARTING, "exit code 1", 3.0, backoff_remaining=60.0)
    sup.recover()
    real = store.attempts.finish
    refusals = []

    def full_disk(*args, **kwargs):
        if len(refusals) < 2:
            refusals.append(1)
            raise StoreUnavailable("state store: database or disk is full")
        return real(*args, **kwargs)

    monkeypatch.setattr(store.attempts, "finish", full_disk)
    sup.cancel(store.jobs.get(jid), "root")
    assert store.jobs.get(jid).state is JobState.RESTARTING and sup.store_problem()
    _turns_until(sup, loop, lambda: store.jobs.get(jid).state is JobState.CANCELLED)
    assert len(refusals) == 2 and sup.store_problem() is None and jid not in sup.tracked()


def test_the_status_line_says_when_the_state_store_refuses_writes():
    from spx.daemon.service.status_line import format_status

    text = format_status([], 0, None, 0.0, "state store /s.sqlite: database or disk is full")
    assert text == ("0 running, no GPUs (CPU jobs only); "
                    "STATE STORE NOT WRITABLE: state store /s.sqlite: database or disk is full")
    assert format_status([], 0, None, 0.0) == "0 running, no GPUs (CPU jobs only)"


def test_a_job_stored_running_without_an_attempt_is_relaunched_after_a_restart(supervised):
    sup, store, loop = supervised
    jid = _add(store, "lost")
    store.jobs.transition(jid, JobState.STARTING, "GPUs allocated", 2.0)
    store.jobs.transition(jid, JobState.RUNNING, "fresh start", 3.0)  # its attempt row never made it
    sup.recover()
    _turns_until(sup, loop, lambda: any(w.job_id == jid for w in sup.waiting()))
    job = store.jobs.get(jid)
    assert job.state is JobState.RESTARTING and job.reason.startswith("lost")
