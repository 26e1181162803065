"""Retention's choices (run/retention.py, state/housekeeping_table.py, run/retention_files.py): which
finished jobs go, that live ones and what a live job's `after:` names stay, rows only after files,
and the log cap's order. A real store and real dirs under tmp_path; the lanes are a recorder whose
tasks the test runs (what core.lanes would do on its threads), the clocks are fixed numbers."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from spx.daemon.core.config import load_config
from spx.daemon.core.lanes import Outcome
from spx.daemon.core.spec import parse_spec
from spx.daemon.run import attempt_files
from spx.daemon.run.retention import DAEMON_LANE, Retention
from spx.daemon.state.states import JobState
from spx.daemon.state.store import Store

NOW = 10_000_000.0
DAY = 86400.0


@dataclass
class RecordedLanes:
    """Takes tasks like core.lanes and runs them when the test says (`run_all`), answering on_done."""

    tasks: list[tuple[int, str, Any, Any]] = field(default_factory=list)

    def submit(self, owner: int, kind: str, work: Any, deadline: float, on_done: Any) -> None:
        self.tasks.append((owner, kind, work, on_done))

    def run_all(self, fail: bool = False) -> list[tuple[int, str]]:
        ran, self.tasks = self.tasks, []
        for _owner, _kind, work, on_done in ran:
            on_done(Outcome(error=OSError("disk says no")) if fail else Outcome(value=work()))
        return [(o, k) for o, k, _w, _d in ran]


def _setup(tmp_path, **retention):
    cfg = load_config(None, tmp_path / "root")
    cfg = cfg.model_copy(update={"retention": cfg.retention.model_copy(update=retention)})
    for d in (cfg.state_dir / "jobs", cfg.log_dir, cfg.run_dir / "jobs", cfg.spool_dir):
        d.mkdir(parents=True, exist_ok=True)
    store = Store(cfg.store_path)
    lanes = RecordedLanes()
    return cfg, store, lanes, Retention(cfg, store, lanes, clock=lambda: 0.0, wall=lambda: NOW)  # type: ignore[arg-type]


def _job(cfg, store, name, *, ended=None, state=JobState.FAILED, after=(), uid=1000, log_bytes=0):
    text = f"name: {name}\nscript: a.py\n" + (f"after: [{', '.join(after)}]\n" if after else "")
    copy = cfg.state_dir / "jobs" / f"{name}.yaml"
    copy.write_text(text)
    jid = store.jobs.add(parse_spec(text), uid, "alice", str(copy), 1.0)
    fd = attempt_files.job_log_dir_fd(cfg, store.jobs.get(jid))  # log/NAME with its .job-id marker
    try:
        with open(os.open("attempt-1.log", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd), "wb") as f:
            f.write(b"x" * log_bytes)
    finally:
        os.close(fd)
    if ended is not None:
        if state is JobState.SUCCEEDED:
            store.jobs.transition(jid, JobState.STARTING, None, ended)
        store.jobs.transition(jid, state, "exit 1", ended)
    return jid


def test_only_jobs_that_ended_before_the_cutoff_are_chosen_oldest_first(tmp_path):
    cfg, store, _lanes, _r = _setup(tmp_path)
    old = _job(cfg, store, "old", ended=NOW - 40 * DAY)
    older = _job(cfg, store, "older", ended=NOW - 50 * DAY, state=JobState.CANCELLED)
    _job(cfg, store, "recent", ended=NOW - DAY)
    _job(cfg, store, "live")
    found = store.housekeeping.expired(NOW - 30 * DAY, 10)
    assert [j.id for j in found] == [older, old]
    assert [j.id for j in store.housekeeping.expired(NOW - 30 * DAY, 1)] == [older]  # the limit holds


def test_a_finished_job_a_live_jobs_after_names_is_kept(tmp_path):
    cfg, store, lanes, retention = _setup(tmp_path, finished_jobs_days=30.0)
    prep = _job(cfg, store, "prep", ended=NOW - 40 * DAY, state=JobState.SUCCEEDED)
    gone = _job(cfg, store, "other", ended=NOW - 40 * DAY)
    assert [j.id for j in store.housekeeping.expired(NOW - 30 * DAY, 10, frozenset({"prep"}))] == [gone]
    _job(cfg, store, "train", after=("prep",))  # waits for prep: prep must still resolve when it is checked
    retention.tick()
    lanes.run_all()
    retention.tick()
    assert store.jobs.by_name("other") is None
    assert store.jobs.get(prep).state is JobState.SUCCEEDED and (cfg.log_dir / "prep").is_dir()


def test_the_store_never_removes_a_live_job_whatever_it_is_asked(tmp_path):
    cfg, store, _lanes, _r = _setup(tmp_path)
    live = _job(cfg, store, "live")
    done = _job(cfg, store, "done", ended=NOW - 40 * DAY)
    assert store.housekeeping.remove_finished([live, done]) == [done]
    assert store.jobs.get(live).state is JobState.QUEUED
    assert store.jobs.by_name("done") is None


def test_a_pass_removes_files_in_the_owners_lane_then_rows_on_the_next_turn(tmp_path):
    cfg, store, lanes, retention = _setup(tmp_path, finished_jobs_days=30.0)
    done = _job(cfg, store, "done", ended=NOW - 40 * DAY, uid=1234)
    _job(cfg, store, "running", uid=1234)
    _job(cfg, store, "recent", ended=NOW - DAY)
    retention.tick()
    assert sorted(lanes.run_all()) == [(DAEMON_LANE, "retention-sweep"), (1234, "retention")]
    assert not (cfg.log_dir / "done").exists() and not (cfg.state_dir / "jobs" / "done.yaml").exists()
    assert store.jobs.get(done).state is JobState.FAILED  # rows only on the loop's next turn
    retention.tick()
    assert store.jobs.by_name("done") is None
    assert store.attempts.for_job(done) == []
    assert not [e for e in store.housekeeping.events_after(0, 1000) if e.job_id == done]
    assert (cfg.log_dir / "running").is_dir() and (cfg.log_dir / "recent").is_dir()
    assert ("spx_retention_removed_jobs_total", {}, 1) in retention.samples()


def test_a_job_whose_files_could_not_be_removed_keeps_its_rows(tmp_path):
    cfg, store, lanes, retention = _setup(tmp_path, finished_jobs_days=30.0)
    done = _job(cfg, store, "done", ended=NOW - 40 * DAY)
    retention.tick()
    lanes.run_all(fail=True)
    retention.tick()
    assert store.jobs.get(done).state is JobState.FAILED
    assert retention.removed_jobs == 0


def test_the_log_cap_removes_the_oldest_finished_logs_first_and_keeps_rows_and_live_logs(tmp_path):
    cfg, store, lanes, retention = _setup(tmp_path, finished_jobs_days=None, logs_max_bytes=150_000)
    first = _job(cfg, store, "first", ended=NOW - 3 * DAY, log_bytes=100_000)
    _job(cfg, store, "second", ended=NOW - 2 * DAY, log_bytes=100_000)
    _job(cfg, store, "live", log_bytes=500_000)  # never counted, never removed
    retention.tick()
    assert lanes.run_all() == [(DAEMON_LANE, "retention-sweep")]
    assert lanes.run_all() == [(1000, "retention-logs")]
    assert not (cfg.log_dir / "first").exists()
    assert (cfg.log_dir / "second").is_dir() and (cfg.log_dir / "live").is_dir()
    assert store.jobs.get(first).state is JobState.FAILED
    assert [e.kind for e in store.housekeeping.events_after(0, 1000) if e.job_id == first][-1] == "logs-removed"


def test_a_log_dir_whose_marker_names_another_job_is_not_taken(tmp_path):
    cfg, store, lanes, retention = _setup(tmp_path, finished_jobs_days=30.0)
    _job(cfg, store, "name", ended=NOW - 40 * DAY)
    reused = _job(cfg, store, "name")  # the name reused: the old job's dir moved aside, log/name is the new one's
    assert (cfg.log_dir / "name.job-1").is_dir()
    retention.tick()
    lanes.run_all()
    assert not (cfg.log_dir / "name.job-1").exists()
    assert (cfg.log_dir / "name").is_dir() and store.jobs.get(reused).state is JobState.QUEUED


def test_nothing_is_removed_when_retention_is_off(tmp_path):
    cfg, store, lanes, retention = _setup(tmp_path, finished_jobs_days=None, logs_max_bytes=None)
    done = _job(cfg, store, "done", ended=NOW - 4000 * DAY, log_bytes=10_000)
    retention.tick()
    assert lanes.run_all() == [(DAEMON_LANE, "retention-sweep")]
    retention.tick()
    assert store.jobs.get(done).state is JobState.FAILED and (cfg.log_dir / "done").is_dir()


def test_the_sweep_measures_finished_logs_only_and_removes_old_rejected_files_and_leftovers(tmp_path):
    import time

    from spx.daemon.run import retention_files

    cfg, store, _lanes, _r = _setup(tmp_path)
    done = _job(cfg, store, "done", ended=NOW - DAY, log_bytes=50_000)
    live = _job(cfg, store, "live", log_bytes=70_000)
    rejected = cfg.spool_dir / "rejected"
    rejected.mkdir(mode=0o711)
    rejected.chmod(0o711)
    (rejected / "bad.yaml").write_text("name: [")
    trash = cfg.log_dir / f"{retention_files.TRASH_PREFIX}9-1"
    (trash / "rank-0").mkdir(parents=True)
    now = time.time()
    # A cutoff before the rejected file came, and a leftover younger than TRASH_MIN_AGE_SECONDS: kept.
    kept = retention_files.sweep(cfg, now - 3600, frozenset({live}), now)
    assert kept.rejected_removed == 0 and kept.trash_removed == 0 and trash.exists()
    assert set(kept.log_bytes) == {done} and kept.log_bytes[done] >= 50_000
    # Seen from two hours on, with a cutoff after it: both go; logs are never the sweep's to remove.
    later = retention_files.sweep(cfg, now + 10, frozenset({live}), now + 7200)
    assert later.rejected_removed == 1 and later.trash_removed == 1
    assert not (rejected / "bad.yaml").exists() and not trash.exists() and (cfg.log_dir / "done").is_dir()


def test_one_removal_per_owner_at_a_time_and_the_next_as_soon_as_it_ends(tmp_path):
    cfg, store, lanes, retention = _setup(tmp_path, finished_jobs_days=30.0)
    for n in range(3):
        _job(cfg, store, f"a{n}", ended=NOW - (50 - n) * DAY, uid=1000)
    _job(cfg, store, "b0", ended=NOW - 40 * DAY, uid=2000)
    retention.tick()
    assert sorted(o for o, k, _w, _d in lanes.tasks if k == "retention") == [1000, 2000]  # a0 and b0, not a1
    lanes.run_all()
    retention.tick()  # a0's removal ended: the pass is due again at once, not in check_every_seconds
    assert [(o, k) for o, k, _w, _d in lanes.tasks if k == "retention"] == [(1000, "retention")]
    lanes.run_all()
    retention.tick()
    lanes.run_all()
    retention.tick()
    assert store.jobs.all() == []
    assert retention.removed_jobs == 4
