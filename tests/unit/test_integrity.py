"""The state store at start: damage and loss are refused with one line that says what, where and how
to restore; backups are whole SQLite files that restore. A second user of the store and a full disk,
with real processes and a real mount: tests/processes/test_integrity_live.py."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest
from store_fixtures import make_store, refusal, state_dir

from spx.daemon.state import integrity
from spx.daemon.state.backup import Backups
from spx.daemon.state.store import Store


@pytest.fixture
def state(tmp_path) -> Path:
    return state_dir(tmp_path)


def test_a_new_host_starts_with_an_empty_store_that_records_its_creation(state):
    integrity.check_store(state / "spx.sqlite", state / "backup")
    make_store(state, jobs=0)
    with sqlite3.connect(state / "spx.sqlite") as db:
        assert db.execute("SELECT value FROM meta WHERE key = 'created'").fetchone()
    integrity.check_store(state / "spx.sqlite", state / "backup")


def test_a_whole_store_passes(state):
    make_store(state)
    integrity.check_store(state / "spx.sqlite", state / "backup")


def test_a_store_truncated_to_zero_on_a_host_with_backups_is_refused_and_names_the_backup(state):
    path = make_store(state)
    newest = Backups(path, state / "backup", 900, 3).backup_now()
    os.truncate(path, 0)
    for side in ("-wal", "-shm"):
        Path(f"{path}{side}").unlink(missing_ok=True)
    err = refusal(state)
    assert err.exit_code == 2
    assert f"state store {path} is empty (0 bytes)" in str(err)
    assert f"cp {newest} {path}" in str(err)
    assert f"rm -f {path}-wal {path}-shm" in str(err)
    assert path.stat().st_size == 0, "the check writes nothing"


def test_a_missing_store_where_accepted_job_files_exist_is_refused(state):
    (state / "jobs").mkdir()
    (state / "jobs" / "a.0.1.yaml").write_text("name: a\n")
    err = refusal(state)
    assert "is missing but this host had state (accepted job file" in str(err)
    assert "no backup in" in str(err) and "accepted jobs would run again" in str(err)


def test_a_store_truncated_mid_file_is_refused(state):
    path = make_store(state, jobs=200)
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    os.truncate(path, path.stat().st_size // 2)
    err = refusal(state)
    assert "is damaged (truncated" in str(err)


def test_garbage_is_refused_not_treated_as_a_store(state):
    (state / "spx.sqlite").write_bytes(os.urandom(8192))
    err = refusal(state)
    assert "is damaged (not an SQLite database" in str(err) and err.exit_code == 2


def test_corrupted_pages_are_found_by_quick_check(state):
    path = make_store(state, jobs=300)
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    page = 4096
    with path.open("r+b") as f:  # scribble over a b-tree page of the jobs table, keep the header
        f.seek(3 * page)
        f.write(b"\xff" * page)
    err = refusal(state)
    assert "is damaged (" in str(err)


def test_a_store_without_its_creation_record_is_refused(state):
    path = make_store(state)
    with sqlite3.connect(path) as db:
        db.execute("DELETE FROM meta")
    assert "creation record" in str(refusal(state))


def test_a_store_from_before_the_creation_record_is_accepted_and_gets_one(state):
    path = make_store(state)
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE meta")
        db.execute("PRAGMA user_version = 0")  # what a daemon of then wrote: no version
    integrity.check_store(path, state / "backup")
    Store(path).close()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT count(*) FROM meta WHERE key = 'created'").fetchone() == (1,)


def test_backups_are_whole_single_file_stores_and_the_oldest_are_pruned(state):
    path = make_store(state)
    clock = iter(range(1_800_000_000, 1_800_000_100, 10))
    backups = Backups(path, state / "backup", every_seconds=900, keep=2, wall=lambda: float(next(clock)))
    made = [backups.backup_now() for _ in range(3)]
    assert integrity.backups(state / "backup") == made[1:]
    assert sorted(p.name for p in (state / "backup").iterdir()) == [p.name for p in made[1:]], "no temp files left"
    restored = state / "restored" / "spx.sqlite"
    restored.parent.mkdir()
    restored.write_bytes(made[-1].read_bytes())
    integrity.check_store(restored, state / "backup")
    assert [j.name for j in Store(restored, readonly=True).jobs.all()] == ["j0", "j1", "j2"]


def test_backups_run_at_start_and_then_every_period(state):
    path = make_store(state)
    clock = iter(range(1_800_000_000, 1_800_000_100, 10))
    backups = Backups(path, state / "backup", every_seconds=900, keep=5, wall=lambda: float(next(clock)))
    for now in (100.0, 101.0, 999.0):
        backups.tick(now)
    assert len(integrity.backups(state / "backup")) == 1
    backups.tick(1000.0)
    assert len(integrity.backups(state / "backup")) == 2
