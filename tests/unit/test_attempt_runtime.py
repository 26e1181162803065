"""run/attempt_runtime.py and run/adoption.py: what the executor sees of an attempt each turn, and an
attempt a previous daemon left open taken on. Files in a temporary root; no job processes (an attempt
whose processes are all gone is the case that needs none)."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
from structlog.testing import capture_logs

from spx.daemon.contract.worker_env import Heartbeat, write_heartbeat
from spx.daemon.core.config import load_config
from spx.daemon.core.spec import parse_spec
from spx.daemon.lifecycle.actions import Log, SignalKill
from spx.daemon.lifecycle.machine import adopted, placed
from spx.daemon.lifecycle.observations import AllGone, HeartbeatSeen, LauncherExited
from spx.daemon.run import adoption, attempt_files, attempt_monitor, launcher, timeline
from spx.daemon.run.attempt_runtime import AttemptHandles, AttemptRuntime
from spx.daemon.run.tracking import limits_of
from spx.daemon.state.states import JobState
from spx.daemon.state.store import Store


@pytest.fixture
def world(tmp_path):
    cfg = load_config(None, tmp_path / "root")
    for d in (cfg.log_dir, cfg.run_dir):
        d.mkdir(parents=True)
    store = Store(tmp_path / "spx.sqlite")
    job = store.jobs.get(store.jobs.add(parse_spec("name: rt\nscript: /bin/true\n"), os.getuid(), "u", "/spool/rt", 1.0))
    store.jobs.transition(job.id, JobState.STARTING, "s", 2.0)
    row_id = store.attempts.start(job.id, number=1, attempt_id="gone-attempt-tag", now=3.0, resumed_from=None,
                                 resumed_from_step=None, port=1)
    runtime = AttemptRuntime(cfg, timeline.Recorder(store, lambda: 10.0), clock=lambda: 100.0)
    yield cfg, store, store.jobs.get(job.id), store.attempts.open_for(job.id), row_id, runtime
    store.close()


def running(cfg, job):
    base = placed(job.id, job.name, limits_of(job, cfg), JobState.RUNNING, ())
    return adopted(base, 1, 0.0, None, 100.0)[0]


def test_an_adopted_attempt_with_nothing_left_and_no_record_is_lost_then_gone(world):
    cfg, store, job, row, row_id, runtime = world
    stranger = replace(row, pgid=os.getpid(), boot_id="another-boot", start_ticks=1)  # a pid now someone else's
    ended = adoption.adopt(cfg, runtime, None, job, stranger)
    assert ended == LauncherExited(None, None, lost=True)
    h = runtime.handles[job.id]
    assert (h.row_id, h.attempt_id, h.pgid, h.pids) == (row_id, "gone-attempt-tag", None, [])
    seen = runtime.observe(job, running(cfg, job))
    assert seen == [LauncherExited(None, None, lost=True), AllGone()]


def test_an_adopted_attempt_that_ended_meanwhile_is_decided_on_its_monitors_record(world):
    cfg, store, job, row, row_id, runtime = world
    (cfg.log_dir / job.name).mkdir()
    fd = os.open(cfg.log_dir / job.name, os.O_RDONLY | os.O_DIRECTORY)
    try:
        attempt_monitor.write_record(fd, launcher.exit_record_name("attempt-1.log"), {
            "attempt_id": "gone-attempt-tag", "launched": True, "exit_code": 3, "signal": None, "stop_signal": None,
            "end": 55.0})
    finally:
        os.close(fd)
    assert adoption.adopt(cfg, runtime, None, job, row) == LauncherExited(3, None, ended_wall=55.0)


def test_the_heartbeat_of_the_attempt_is_seen_and_a_launch_under_way_is_left_alone(world):
    cfg, store, job, row, row_id, runtime = world
    files = attempt_files.paths(cfg, job, 1)
    files.heartbeat_file.parent.mkdir(parents=True)
    write_heartbeat(files.heartbeat_file, Heartbeat(step=12, time=90.0, status="running"))
    h = runtime.handles[job.id] = AttemptHandles(number=1, files=files, row_id=row_id, attempt_id="gone-attempt-tag",
                                                 launching=True)
    assert runtime.observe(job, running(cfg, job)) == [], "its launch has not landed: nothing of it to see"
    runtime.signal(job, SignalKill())  # nothing to signal yet: no error either
    h.launching = False
    seen = runtime.observe(job, running(cfg, job))
    assert seen[0] == HeartbeatSeen(12, 90.0, "running")


def test_a_retried_spawn_keeps_the_handles_with_its_row_and_an_ended_attempt_is_not_polled(world):
    cfg, store, job, row, row_id, runtime = world
    files = attempt_files.paths(cfg, job, 2)
    runtime.prepared(job, 2, files, {"layout": "epoch-step"})
    runtime.handles[job.id].row_id = 77
    runtime.prepared(job, 2, files, {"layout": "again"})
    h = runtime.handles[job.id]
    assert (h.row_id, h.discovery) == (77, {"layout": "again"}) and runtime.row_of(job.id, 2) == 77
    assert runtime.row_of(job.id, 1) is None
    runtime.attempt_over(job.id, 2)
    assert (h.row_id, h.proc, h.pids) == (None, None, [])


def test_a_log_line_the_machine_asks_for_gets_the_attempts_pids(world):
    cfg, store, job, row, row_id, runtime = world
    runtime.handles[job.id] = AttemptHandles(number=1, pids=[11, 12])
    with capture_logs() as lines:
        runtime.log(job, running(cfg, job), Log("leftover_processes", "warning"))
    assert lines == [{"event": "leftover_processes", "log_level": "warning", "job": "rt", "attempt": 1,
                      "pids": [11, 12], "cgroup": None}]
