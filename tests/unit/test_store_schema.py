"""The store's schema is `state/schema.py`: a new store is made at the latest version, a store an
older daemon wrote (no version, the first release's tables) is migrated to it in one transaction and
stamped, and a store a newer version wrote is refused, by the daemon's open and by the start check."""

from __future__ import annotations

import sqlite3

import pytest

from spx.daemon.core.spec import parse_spec
from spx.daemon.state import integrity, schema
from spx.daemon.state.db import StoreRefused
from spx.daemon.state.store import Store

# The tables of the first release, before any column was added: what the oldest store holds.
OLDEST = """
CREATE TABLE jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, state TEXT NOT NULL, reason TEXT,
    owner_uid INTEGER NOT NULL, owner TEXT NOT NULL, spec_json TEXT NOT NULL, spec_file TEXT NOT NULL,
    submitted REAL NOT NULL, priority INTEGER NOT NULL DEFAULT 0, gpus TEXT NOT NULL DEFAULT '[]',
    no_progress_streak INTEGER NOT NULL DEFAULT 0, backoff_level INTEGER NOT NULL DEFAULT 0, staging TEXT,
    updated REAL NOT NULL
);
CREATE UNIQUE INDEX jobs_live_name ON jobs(name) WHERE state NOT IN ('succeeded', 'failed', 'cancelled');
CREATE TABLE attempts (
    id INTEGER PRIMARY KEY AUTOINCREMENT, job_id INTEGER NOT NULL REFERENCES jobs(id), number INTEGER NOT NULL,
    attempt_id TEXT NOT NULL, start REAL NOT NULL, end REAL, exit_code INTEGER, signal INTEGER, reason TEXT,
    reason_class TEXT, resumed_from TEXT, resumed_from_step INTEGER, max_step INTEGER, pgid INTEGER,
    port INTEGER, root_cause TEXT, UNIQUE (job_id, number)
);
CREATE TABLE events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, job_id INTEGER REFERENCES jobs(id), time REAL NOT NULL,
    kind TEXT NOT NULL, detail TEXT
);
INSERT INTO jobs (name, state, owner_uid, owner, spec_json, spec_file, submitted, updated)
    VALUES ('old', 'queued', 1000, 'alice', '{"name": "old", "script": "a.py"}', '/x', 1.0, 1.0);
INSERT INTO attempts (job_id, number, attempt_id, start) VALUES (1, 1, 'u1', 2.0);
"""


def columns(path, table: str) -> dict[str, tuple]:
    db = sqlite3.connect(path)
    try:
        return {r[1]: (r[2], r[3], r[4]) for r in db.execute(f"PRAGMA table_info({table})")}  # type, notnull, default
    finally:
        db.close()


def schema_of(path) -> tuple[dict, set[str], int]:
    """{table: {column: (type, notnull, default)}}, the index names, and the version."""
    db = sqlite3.connect(path)
    try:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        indexes = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL")}
        version = db.execute("PRAGMA user_version").fetchone()[0]
    finally:
        db.close()
    return {t: columns(path, t) for t in tables if t != "sqlite_sequence"}, indexes, version


def test_a_new_store_is_made_at_the_latest_version(tmp_path):
    path = tmp_path / "s.sqlite"
    Store(path).close()
    tables, indexes, version = schema_of(path)
    assert version == schema.VERSION
    assert set(tables) == {"jobs", "attempts", "events", "meta", "gpu_quarantine", "queue_settings", "incidents",
                           "verifications", "gpu_suspects"}
    assert {"jobs_live_name", "jobs_name", "jobs_uid"} <= indexes
    assert "held" in tables["jobs"] and "generation" in tables["attempts"]


def test_the_oldest_store_is_migrated_to_every_column_and_stamped(tmp_path):
    fresh, old = tmp_path / "fresh.sqlite", tmp_path / "old.sqlite"
    Store(fresh).close()
    db = sqlite3.connect(old)
    db.executescript(OLDEST)
    db.close()
    assert schema_of(old)[2] == 0
    store = Store(old)
    # Every table, column (with its type, NOT NULL and default) and index a new store has.
    assert schema_of(old) == schema_of(fresh)
    job = store.jobs.by_name("old")
    assert job is not None and job.backoff_remaining == 0.0 and job.held is None and len(job.uid) == 32
    (attempt,) = store.attempts.for_job(job.id)
    assert attempt.generation is None and attempt.phases is None
    assert store.host.quarantined_gpus() == {} and store.host.drained() is None
    created = store.db.conn.execute("SELECT value FROM meta WHERE key = 'created'").fetchone()
    assert created is not None
    store.jobs.add(parse_spec("name: new\nscript: a.py\n"), 1000, "alice", "/y", 3.0)
    store.close()
    integrity.check_store(old, tmp_path / "backup")  # a migrated store is whole and ours
    again = Store(old)  # opening a migrated store again changes nothing
    assert [j.name for j in again.jobs.all()] == ["old", "new"] and again.jobs.get(job.id).uid == job.uid
    again.close()


def test_a_migration_that_fails_leaves_the_store_as_it_was(tmp_path):
    """One transaction: columns added before the failure are rolled back with it, no version stamped."""
    path = tmp_path / "s.sqlite"
    db = sqlite3.connect(path)
    db.executescript(OLDEST)
    # A trigger that refuses an update of a job: the migration's identity backfill (after its
    # columns are added) fails.
    db.execute("CREATE TRIGGER refuse BEFORE UPDATE ON jobs BEGIN SELECT RAISE(ABORT, 'refused'); END")
    db.commit()
    db.close()
    before = schema_of(path)
    with pytest.raises(sqlite3.IntegrityError, match="refused"):
        Store(path)
    assert schema_of(path) == before and "held" not in before[0]["jobs"]


def test_a_store_of_a_newer_version_is_refused(tmp_path):
    path = tmp_path / "s.sqlite"
    store = Store(path)
    store.jobs.add(parse_spec("name: a\nscript: a.py\n"), 0, "root", "/x", 1.0)
    store.close()
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {schema.VERSION + 1}")
    db.commit()
    db.close()
    for open_it in (lambda: Store(path), lambda: Store(path, readonly=True),
                    lambda: integrity.check_store(path, tmp_path / "backup")):
        with pytest.raises(StoreRefused) as err:
            open_it()
        assert f"schema version {schema.VERSION + 1}" in str(err.value) and "newer spx-trainer" in str(err.value)
        assert err.value.exit_code == 2
    assert schema_of(path)[2] == schema.VERSION + 1  # left as found


def test_a_version_4_store_gains_the_ledgers_columns(tmp_path):
    """Version 5 (the goodput ledger's facts): a store a version-4 daemon wrote (memory_peak,
    retention's indexes, incidents, no progress record, no backoff) gets them, keeps its rows, and is
    then a new store's twin."""
    fresh, path = tmp_path / "fresh.sqlite", tmp_path / "s.sqlite"
    Store(fresh).close()
    store = Store(path)
    jid = store.jobs.add(parse_spec("name: a\nscript: a.py\n"), 1000, "alice", "/x", 1.0)
    store.close()
    db = sqlite3.connect(path)
    db.execute("INSERT INTO attempts (job_id, number, attempt_id, start, memory_peak) VALUES (?, 1, 'u1', 2.0, 5)",
               (jid,))
    for column in ("progress", "backoff"):
        db.execute(f"ALTER TABLE attempts DROP COLUMN {column}")
    db.execute("PRAGMA user_version = 4")
    db.commit()
    db.close()
    assert "progress" not in schema_of(path)[0]["attempts"]
    store = Store(path)
    try:
        assert schema_of(path) == schema_of(fresh) and schema_of(path)[2] == schema.VERSION == 7
        store.attempts.set_progress(store.attempts.for_job(jid)[0].id, '{"first": [2.5, 1]}')
        (attempt,) = store.attempts.for_job(jid)
        assert (attempt.memory_peak, attempt.progress, attempt.backoff) == (5, '{"first": [2.5, 1]}', None)
    finally:
        store.close()
