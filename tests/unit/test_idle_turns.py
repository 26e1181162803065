"""What a running job costs the main loop each turn (issue 29, bench/bench_idle.py): its heartbeat is
parsed only when its content changed, and a running attempt with nothing new is told of time
passing once a second, not every turn — while a job in any other phase, or with something observed,
still gets its Tick at once. Files in a scratch directory, a fake clock; no processes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from spx.daemon.contract.worker_env import Heartbeat, write_heartbeat
from spx.daemon.core.config import load_config
from spx.daemon.core.lanes import Lanes
from spx.daemon.core.spec import parse_spec
from spx.daemon.lifecycle.actions import SaveBackoff
from spx.daemon.lifecycle.machine import placed
from spx.daemon.lifecycle.observations import Tick
from spx.daemon.lifecycle.record import Phase
from spx.daemon.run.executor import RUNNING_TICK_SECONDS, Executor
from spx.daemon.run.tracking import limits_of
from spx.daemon.state.states import JobState
from spx.daemon.state.store import Store
from spx.daemon.userfs import heartbeat as heartbeat_reader
from spx.daemon.userfs.heartbeat import HeartbeatFile


@pytest.fixture
def beat_file(tmp_path):
    (tmp_path / "jobs" / "1-j").mkdir(parents=True)
    return tmp_path / "jobs" / "1-j" / "heartbeat.json"


def test_an_unchanged_heartbeat_is_not_parsed_again(beat_file, monkeypatch):
    parsed = []
    parse = heartbeat_reader.load_heartbeat
    monkeypatch.setattr(heartbeat_reader, "load_heartbeat", lambda raw: parsed.append(raw) or parse(raw))
    hb = HeartbeatFile(beat_file)
    assert hb.read().beat is None and hb.read().problem is None  # none yet
    write_heartbeat(beat_file, Heartbeat(step=1, time=100.0))
    first = hb.read()
    assert first.beat is not None and first.beat.step == 1
    assert hb.read() is first and len(parsed) == 1
    write_heartbeat(beat_file, Heartbeat(step=2, time=101.0))
    assert hb.read().beat.step == 2 and len(parsed) == 2
    # as the one-off read says: garbage is no beat, with why
    beat_file.write_text("{not json")
    assert hb.read() == heartbeat_reader.read(beat_file) and hb.read().problem


def test_a_heartbeat_replaced_by_a_link_is_refused(beat_file, tmp_path):
    hb = HeartbeatFile(beat_file)
    write_heartbeat(beat_file, Heartbeat(step=1, time=100.0))
    assert hb.read().beat is not None
    secret = tmp_path / "secret.json"
    write_heartbeat(secret, Heartbeat(step=99, time=100.0))
    beat_file.unlink()
    beat_file.symlink_to(secret)
    seen = hb.read()
    assert seen.beat is None and "link" in (seen.problem or "")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def executor(tmp_path):
    cfg = load_config(None, tmp_path / "root")
    store = Store(tmp_path / "spx.sqlite")
    lanes = Lanes(2, 1)
    clock = Clock()
    job = store.jobs.get(store.jobs.add(parse_spec("name: d\nscript: /bin/true\n"), 1000, "u", "/spool/d", 1.0))
    record = placed(job.id, job.name, limits_of(job, cfg), JobState.QUEUED, ())
    yield Executor(cfg, store, lanes, None, clock=clock), clock, job, record
    lanes.close()
    store.close()


def test_a_running_attempt_with_nothing_new_gets_a_tick_once_a_second(executor):
    ex, clock, job, record = executor
    running = replace(record, phase=Phase.RUNNING)
    assert ex.observe(job, running) == [Tick()]
    assert ex.observe(job, running) == []
    clock.now += RUNNING_TICK_SECONDS - 0.01
    assert ex.observe(job, running) == []
    clock.now += 0.01
    assert ex.observe(job, running) == [Tick()]


def test_other_phases_and_pending_writes_get_their_tick_every_turn(executor):
    ex, clock, job, record = executor
    assert [ex.observe(job, record) for _ in range(3)] == [[Tick()]] * 3  # ready: placed, not yet started
    running = replace(record, phase=Phase.RUNNING)
    assert ex.observe(job, running) == []  # just started: its last Tick was this instant
    waiting = replace(running, pending=(SaveBackoff(5.0),))
    assert ex.observe(job, waiting) == [Tick()]  # a refused write is retried on the next Tick, at once
    ex.forget(job.id)
    assert ex.observe(job, running) == [Tick()]  # a job tracked again starts afresh
