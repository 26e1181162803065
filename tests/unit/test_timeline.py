"""Per-attempt start-up timelines: the heartbeat's phases (hostile input), the worker's marks, the store
column and its migration, the daemon's recorder, and `spx status --timeline`'s rows and table."""

from __future__ import annotations

import json
import sqlite3

import pytest

from spx.daemon.cli import timeline as cli_timeline
from spx.daemon.contract.worker_env import WORKER_PHASES, Heartbeat, parse_heartbeat
from spx.daemon.core.spec import JobSpec
from spx.daemon.run.timeline import Recorder, from_beat
from spx.daemon.state import jobviews
from spx.daemon.state.phases import FAILURE_PHASES, stored
from spx.daemon.state.store import Store
from spx.trainer import phases as worker_phases


def beat_json(**fields: object) -> str:
    return json.dumps({"step": 3, "time": 100.0, **fields})


# --- the heartbeat's phases: from a file the job's user writes ---------------------------------------------


def test_known_phases_with_finite_times_pass_the_parser():
    beat = parse_heartbeat(beat_json(phases={"rendezvous": 90.5, "first_step": 99}))
    assert beat is not None and beat.phases == {"rendezvous": 90.5, "first_step": 99.0}


@pytest.mark.parametrize("phases", [
    "soon", ["first_step"], 7, {"first_step": "now"}, {"first_step": True}, {"first_step": None},
    {"rm -rf": 1.0}, {"first_step": 1e999}, {},
])
def test_odd_phases_are_dropped_and_the_beat_still_counts(phases):
    beat = parse_heartbeat(beat_json(phases=phases))
    assert beat is not None and beat.step == 3, "a beat drives hang detection: odd phases must not cost it"
    assert beat.phases is None


def test_only_known_phases_of_a_mixed_map_survive():
    beat = parse_heartbeat(beat_json(phases={"first_step": 5.0, "evil": 1.0, "rendezvous": float("nan")}))
    assert beat is not None and beat.phases == {"first_step": 5.0}


def test_a_beat_without_phases_parses_as_before():
    beat = parse_heartbeat(beat_json())
    assert beat is not None and beat.phases is None


# --- the worker's side ---------------------------------------------------------------------------------------


def test_a_workers_phase_keeps_its_first_mark_and_unknown_names_are_refused(monkeypatch):
    monkeypatch.setattr(worker_phases, "_marked", {})
    worker_phases.mark("rendezvous", 10.0)
    worker_phases.mark("rendezvous", 20.0)
    assert worker_phases.recorded()["rendezvous"] == 10.0
    with pytest.raises(ValueError, match="not a worker phase"):
        worker_phases.mark("lunch")
    assert set(worker_phases.recorded()) <= set(WORKER_PHASES)


def test_the_trainer_heartbeat_carries_the_marked_phases(tmp_path, monkeypatch):
    from spx.trainer.heartbeat import HeartbeatWriter

    monkeypatch.setattr(worker_phases, "_marked", {"first_step": 42.0})
    HeartbeatWriter(tmp_path / "hb.json").tick(step=1, epoch=0, samples=4, last_checkpoint=None)
    beat = parse_heartbeat((tmp_path / "hb.json").read_text())
    assert beat is not None and beat.phases is not None
    assert beat.phases["first_step"] == 42.0 and "interpreter_up" in beat.phases


# --- the store: column, merge, migration ---------------------------------------------------------------------


def make_store(tmp_path) -> tuple[Store, int, int]:
    store = Store(tmp_path / "state" / "spx.db")
    spec = JobSpec.model_validate({"name": "tl", "launcher": "python", "script": "/bin/true"})
    job_id = store.jobs.add(spec, 0, "root", "/spool/tl.yaml", 1.0)
    row = store.attempts.start(job_id, number=1, attempt_id="a" * 32, now=2.0, resumed_from=None,
                              resumed_from_step=None, port=None)
    return store, job_id, row


def test_phases_merge_into_the_attempt_row_and_a_recorded_phase_keeps_its_time(tmp_path):
    store, job_id, row = make_store(tmp_path)
    store.attempts.add_phases(row, {"spawn": 2.0, "rendezvous": 5.0})
    store.attempts.add_phases(row, {"rendezvous": 9.0, "first_step": 6.0})
    assert stored(store.attempts.for_job(job_id)[0].phases) == {"spawn": 2.0, "rendezvous": 5.0, "first_step": 6.0}
    store.close()


def test_a_store_from_before_timelines_gets_the_column_and_keeps_its_attempts(tmp_path):
    store, job_id, _ = make_store(tmp_path)
    store.close()
    db = sqlite3.connect(tmp_path / "state" / "spx.db")
    db.execute("ALTER TABLE attempts DROP COLUMN phases")
    db.execute("PRAGMA user_version = 0")  # what a daemon of then wrote: no version
    db.commit()
    db.close()
    store = Store(tmp_path / "state" / "spx.db")
    (attempt,) = store.attempts.for_job(job_id)
    assert attempt.phases is None and attempt.number == 1
    store.attempts.add_phases(attempt.id, {"spawn": 3.0})
    assert stored(store.attempts.for_job(job_id)[0].phases) == {"spawn": 3.0}
    store.close()


@pytest.mark.parametrize("raw", [None, "", "not json", "[1, 2]", '{"spawn": "x", "evil": 1}', '{"spawn": Infinity}'])
def test_an_odd_stored_timeline_reads_as_empty(raw):
    assert stored(raw) == {}


# --- the daemon's recorder -----------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def test_the_recorder_stores_start_phases_at_spawn_and_each_worker_phase_once(tmp_path):
    store, job_id, row = make_store(tmp_path)
    rec = Recorder(store, Clock())
    rec.before_spawn(job_id, "placed")           # 1001
    rec.before_spawn(job_id, "placed")           # a repeat keeps the first
    rec.before_spawn(job_id, "joined", 1001.5)   # seen off the loop (the join, across hosts), told after
    rec.before_spawn(job_id, "checkpoint_found")    # 1002 (the clock ticked on the repeat too)
    rec.spawned(job_id, row, 1005.0)
    rec.beat(job_id, row, Heartbeat(step=9, time=1004.0, phases={"first_step": 1003.0}))  # before spawn: the old attempt's
    rec.beat(job_id, row, Heartbeat(step=1, time=1010.0, phases={"rendezvous": 1008.0, "first_step": 1009.0}))
    rec.beat(job_id, row, Heartbeat(step=2, time=1020.0, phases={"rendezvous": 1.0, "first_step": 2.0}))
    got = stored(store.attempts.for_job(job_id)[0].phases)
    assert got == {"placed": 1001.0, "joined": 1001.5, "checkpoint_found": 1003.0, "spawn": 1005.0, "rendezvous": 1008.0,
                   "first_step": 1009.0, "first_beat": 1010.0}
    store.close()


def test_failure_phases_go_to_the_failed_attempt_and_a_missing_row_records_nothing(tmp_path):
    store, job_id, row = make_store(tmp_path)
    rec = Recorder(store, Clock())
    rec.phase(row, "launcher_exit", 500.0)
    rec.phase(row, "failure_seen")
    rec.phase(row, "failure_seen")
    rec.phase(None, "group_dead")
    assert stored(store.attempts.for_job(job_id)[0].phases) == {"launcher_exit": 500.0, "failure_seen": 1001.0}
    store.close()


def test_an_adopted_attempt_spawned_by_another_daemon_gets_no_worker_phases(tmp_path):
    store, job_id, row = make_store(tmp_path)
    Recorder(store, Clock()).beat(job_id, row, Heartbeat(step=1, time=5.0, phases={"first_step": 4.0}))
    assert store.attempts.for_job(job_id)[0].phases is None
    store.close()


def test_from_beat_names_the_beat_itself_first_beat_for_scripts_without_spx_trainer():
    assert from_beat(Heartbeat(step=1, time=7.0), spawned=6.0) == {"first_beat": 7.0}
    assert from_beat(Heartbeat(step=1, time=5.0), spawned=6.0) == {}


def test_job_views_carry_each_attempts_phases(tmp_path):
    store, job_id, row = make_store(tmp_path)
    store.attempts.add_phases(row, {"spawn": 2.5})
    view = jobviews.job_view(store, store.jobs.get(job_id), tmp_path / "run", with_history=True)
    assert view.to_json(with_history=True)["history"][0]["phases"] == {"spawn": 2.5}
    store.close()


# --- spx status --timeline -----------------------------------------------------------------------------------


def doc() -> dict:
    return {"name": "tl", "submitted": 100.0, "history": [
        {"number": 1, "reason": "exit code 1", "phases": {
            "placed": 100.5, "spawn": 101.0, "first_step": 108.0,
            "launcher_exit": 120.0, "failure_seen": 120.2, "group_dead": 120.3, "end_recorded": 120.4}},
        {"number": 2, "reason": None, "phases": {"spawn": 121.0, "rendezvous": 126.0, "first_step": 127.5}},
    ]}


def test_timeline_rows_count_from_the_submission_then_from_the_previous_failure():
    rows = cli_timeline.rows(doc())
    first = [r for r in rows if r["attempt"] == 1]
    assert [r["phase"] for r in first] == ["placed", "spawn", "first_step"]
    assert [r["from_origin"] for r in first] == [0.5, 1.0, 8.0] and first[-1]["from_spawn"] == 7.0
    second = [r for r in rows if r["attempt"] == 2]
    assert [r["phase"] for r in second] == [*FAILURE_PHASES[1:], "spawn", "rendezvous", "first_step"]
    assert second[0]["from_origin"] == 0.0 and second[-1]["from_origin"] == 7.5
    assert [r["from_spawn"] for r in second] == [None] * 4 + [0.0, 5.0, 6.5]


def test_a_workers_death_comes_first_and_is_the_relaunchs_origin():
    """The daemon saw a worker die (worker_exit) and killed the attempt at once: its monitor recorded
    no launcher_exit, and the next attempt counts from the death."""
    d = doc()
    failed = d["history"][0]["phases"]
    del failed["launcher_exit"]
    failed["worker_exit"] = 119.9
    second = [r for r in cli_timeline.rows(d) if r["attempt"] == 2]
    assert [r["phase"] for r in second][:4] == ["worker_exit", "failure_seen", "group_dead", "end_recorded"]
    assert second[0]["from_origin"] == 0.0 and second[-1]["from_origin"] == 7.6


def test_timeline_table_names_each_attempts_origin_and_shows_deltas():
    text = cli_timeline.render(doc())
    assert "attempt 1  (from the job's submission)" in text
    assert "attempt 2  (from attempt 1's failure: exit code 1)" in text
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("first_step") and "+7.50 s" in ln)
    assert "+6.50 s" in line


def test_a_job_without_phases_says_so():
    assert "no phases recorded yet" in cli_timeline.render({"name": "x", "history": [{"number": 1, "phases": {}}]})


def test_timeline_bars_show_where_each_phase_began_and_how_long_it_took():
    assert cli_timeline.bars([0.5, 1.0, 8.0], width=16) == ["█", " █", "  ██████████████"]
    assert cli_timeline.bars([0.0, None, 0.0], width=8) == ["▏", "", "▏"]
    first_step = next(ln for ln in cli_timeline.render(doc()).splitlines() if ln.strip().startswith("first_step"))
    assert first_step.endswith("█" * 28)  # attempt 1: 1.0 → 8.0 s of 8.0 s, 32 characters wide
