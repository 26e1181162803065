"""What a store of this version holds, and how a store an older daemon wrote becomes one.

`TABLES` and `INDEXES` are the whole schema of version `VERSION`: every table and every column. A new
store is created at that version directly. `PRAGMA user_version` says which version a store is at;
`MIGRATIONS[n - 1]` takes a store from version n - 1 to n. `prepare` runs the ones a store lacks and
stamps the version in the same transaction, so a daemon killed meanwhile leaves the store as it
was. A store of a newer version than this code knows is refused: this daemon would not write what
the newer one expects (a new column left empty, a row it cannot read), so it must not start on it.

Changing the schema: change `TABLES`/`INDEXES` (what a new store gets), append the migration that
does the same to a store of the previous version, and bump `VERSION` (tests/unit/test_store_schema.py
checks that a migrated store has the new store's columns).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

from spx.daemon.state.db import StoreRefused

_INCIDENTS = """CREATE TABLE IF NOT EXISTS incidents (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id INTEGER NOT NULL REFERENCES jobs(id),
    attempt INTEGER NOT NULL,
    time REAL NOT NULL,
    reason_class TEXT,
    doc TEXT NOT NULL,
    UNIQUE (job_id, attempt)
)"""
# An incident goes with its job, whoever removes the job (retention, an operator's SQL).
_INCIDENTS_GO_WITH_THE_JOB = """CREATE TRIGGER IF NOT EXISTS incidents_go_with_the_job BEFORE DELETE ON jobs
BEGIN DELETE FROM incidents WHERE job_id = OLD.id; END"""

# Replay verification (run/verification.py): each replay's verdict on the job it verified, removed with
# either job; and the strikes against GPUs a replay found computing wrong numbers, the host's memory
# of its GPUs like the quarantine (kept past the job; cleared when an operator releases the GPU).
_VERIFICATIONS = """CREATE TABLE IF NOT EXISTS verifications (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id INTEGER NOT NULL REFERENCES jobs(id),
    replay_job_id INTEGER NOT NULL REFERENCES jobs(id),
    time REAL NOT NULL,
    verified INTEGER,
    doc TEXT NOT NULL
)"""
_VERIFICATIONS_GO_WITH_THE_JOB = """CREATE TRIGGER IF NOT EXISTS verifications_go_with_the_job BEFORE DELETE ON jobs
BEGIN DELETE FROM verifications WHERE job_id = OLD.id OR replay_job_id = OLD.id; END"""
_GPU_SUSPECTS = """CREATE TABLE IF NOT EXISTS gpu_suspects (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    gpu INTEGER NOT NULL,
    owner_uid INTEGER NOT NULL,
    job TEXT NOT NULL,
    step INTEGER,
    time REAL NOT NULL,
    detail TEXT NOT NULL
)"""

TABLES = (
    """CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL,
    state TEXT NOT NULL,
    reason TEXT,
    owner_uid INTEGER NOT NULL,
    owner TEXT NOT NULL,
    spec_json TEXT NOT NULL,
    spec_file TEXT NOT NULL,
    submitted REAL NOT NULL,
    priority INTEGER NOT NULL DEFAULT 0,
    gpus TEXT NOT NULL DEFAULT '[]',
    backoff_remaining REAL NOT NULL DEFAULT 0,
    no_progress_streak INTEGER NOT NULL DEFAULT 0,
    backoff_level INTEGER NOT NULL DEFAULT 0,
    staging TEXT,
    updated REAL NOT NULL,
    uid TEXT,
    held TEXT
)""",
    """CREATE TABLE IF NOT EXISTS attempts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id INTEGER NOT NULL REFERENCES jobs(id),
    number INTEGER NOT NULL,
    attempt_id TEXT NOT NULL,
    start REAL NOT NULL,
    end REAL,
    exit_code INTEGER,
    signal INTEGER,
    reason TEXT,
    reason_class TEXT,
    resumed_from TEXT,
    resumed_from_step INTEGER,
    max_step INTEGER,
    pgid INTEGER,
    boot_id TEXT,
    start_ticks INTEGER,
    stop_cause TEXT,
    exited REAL,
    port INTEGER,
    root_cause TEXT,
    phases TEXT,
    checkpoint_discovery TEXT,
    generation INTEGER,
    memory_peak INTEGER,
    progress TEXT,
    backoff REAL,
    UNIQUE (job_id, number)
)""",
    # Written once, when the store is created: a store without it was not made whole (integrity.py).
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    # GPUs the health gate found faulty: never allocated until an operator releases them (spx gpu release).
    """CREATE TABLE IF NOT EXISTS gpu_quarantine (
    gpu INTEGER PRIMARY KEY,
    uuid TEXT,
    reason TEXT NOT NULL,
    since REAL NOT NULL
)""",
    # The queue's host-wide switches (spx drain: key 'drained', value = who and why), kept across restarts.
    "CREATE TABLE IF NOT EXISTS queue_settings (key TEXT PRIMARY KEY, value TEXT NOT NULL, since REAL NOT NULL)",
    """CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id INTEGER REFERENCES jobs(id),
    time REAL NOT NULL,
    kind TEXT NOT NULL,
    detail TEXT
)""",
    # One row per failed attempt: what an operator reads after it (run/incidents.py), a bounded JSON document.
    _INCIDENTS,
    _VERIFICATIONS,
    _GPU_SUSPECTS,
)
_FIRST_INDEXES = (
    # Names are unique among live jobs only: a finished job's name may be reused.
    "CREATE UNIQUE INDEX IF NOT EXISTS jobs_live_name ON jobs(name) WHERE state NOT IN ('succeeded', 'failed', 'cancelled')",
    "CREATE INDEX IF NOT EXISTS jobs_name ON jobs(name, id)",
    "CREATE INDEX IF NOT EXISTS jobs_uid ON jobs(uid)",
)
# Added by a migration, for retention (run/retention.py): finished jobs by when they ended, the oldest first
# (the WHERE is the one housekeeping_table.ENDED_SQL queries with, so SQLite uses this partial index), and a
# job's events by job (removing a job's events must not scan every event the host ever had).
_RETENTION_INDEXES = (
    "CREATE INDEX IF NOT EXISTS jobs_ended ON jobs(updated) WHERE state IN ('cancelled', 'failed', 'succeeded')",
    "CREATE INDEX IF NOT EXISTS events_job ON events(job_id)",
)
_VERIFICATION_INDEXES = ("CREATE INDEX IF NOT EXISTS verifications_job ON verifications(job_id)",)
# Added by a migration, for a host with a long history: the live jobs alone (a partial index of a few
# rows however many finished jobs the store keeps). Every turn and every `spx ls` and scrape reads
# them (jobs_table.live, .current); without it each read scanned every job ever kept (measured:
# 29 ms per read at 100,000 finished jobs, several per turn). The WHERE is the one those queries
# use, so SQLite uses this partial index.
_LIVE_INDEX = "CREATE INDEX IF NOT EXISTS jobs_live ON jobs(state) WHERE state NOT IN ('cancelled', 'failed', 'succeeded')"
INDEXES = (*_FIRST_INDEXES, *_RETENTION_INDEXES, _INCIDENTS_GO_WITH_THE_JOB, *_VERIFICATION_INDEXES,
           _VERIFICATIONS_GO_WITH_THE_JOB, _LIVE_INDEX)
_CREATED = "INSERT OR IGNORE INTO meta (key, value) VALUES ('created', datetime('now'))"

# Columns added to the tables of the first release before stores had a version; a store of
# version 0 may lack any of them, so version 1 adds each one it lacks.
_UNVERSIONED_ADDITIONS = (
    ("jobs", "backoff_remaining", "REAL NOT NULL DEFAULT 0"),
    ("attempts", "boot_id", "TEXT"),
    ("attempts", "start_ticks", "INTEGER"),
    ("attempts", "stop_cause", "TEXT"),
    ("attempts", "exited", "REAL"),
    ("jobs", "uid", "TEXT"),
    ("attempts", "phases", "TEXT"),
    ("jobs", "held", "TEXT"),
    ("attempts", "checkpoint_discovery", "TEXT"),
    ("attempts", "generation", "INTEGER"),
)


def _version_1(db: sqlite3.Connection) -> None:
    """A store written before stores had a version: the tables added since its daemon (meta,
    gpu_quarantine, queue_settings), the columns added since, an identity for every job recorded
    before jobs had one, and the creation record."""
    for create in TABLES:
        db.execute(create)
    for table, column, decl in _UNVERSIONED_ADDITIONS:
        have = {r[1] for r in db.execute(f"PRAGMA table_info({table})").fetchall()}
        if column not in have:
            db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
    # So other hosts can tell every job apart (the host-loss record next to its checkpoints carries
    # it; see intake/job_record.py).
    db.execute("UPDATE jobs SET uid = lower(hex(randomblob(16))) WHERE uid IS NULL")
    for index in _FIRST_INDEXES:
        db.execute(index)
    db.execute(_CREATED)


def _version_2(db: sqlite3.Connection) -> None:
    """`attempts.memory_peak`: the attempt cgroup's `memory.peak` in bytes, read when the cgroup is
    removed (`spx history`); NULL where it was not measured (unmanaged cgroups, attempts before)."""
    if "memory_peak" not in {r[1] for r in db.execute("PRAGMA table_info(attempts)").fetchall()}:
        db.execute("ALTER TABLE attempts ADD COLUMN memory_peak INTEGER")


def _version_3(db: sqlite3.Connection) -> None:
    """Retention's indexes: finished jobs by end time, events by job (run/retention.py)."""
    for index in _RETENTION_INDEXES:
        db.execute(index)


def _version_4(db: sqlite3.Connection) -> None:
    """`incidents`: one row per failed attempt (run/incidents.py), removed with its job (a trigger)."""
    db.execute(_INCIDENTS)
    db.execute(_INCIDENTS_GO_WITH_THE_JOB)


def _version_5(db: sqlite3.Connection) -> None:
    """The goodput ledger's facts (state/goodput.py): an attempt's progress record (its first beat,
    last progress, saves, how far it is known kept: state/attempt_progress.py) and the backoff
    decided at its end; the ledger reads a job's events through retention's index (version 3).
    Attempts recorded before have neither record: their time is `running`/`unknown` in the ledger."""
    have = {r[1] for r in db.execute("PRAGMA table_info(attempts)").fetchall()}
    for column, decl in (("progress", "TEXT"), ("backoff", "REAL")):
        if column not in have:  # a version-0 store without the table got it from `TABLES` in version 1
            db.execute(f"ALTER TABLE attempts ADD COLUMN {column} {decl}")


def _version_6(db: sqlite3.Connection) -> None:
    """Replay verification: `verifications` (a replay's verdict, removed with its jobs: a trigger) and
    `gpu_suspects` (the strikes against a GPU; run/verification.py)."""
    for statement in (_VERIFICATIONS, _GPU_SUSPECTS, *_VERIFICATION_INDEXES, _VERIFICATIONS_GO_WITH_THE_JOB):
        db.execute(statement)


def _version_7(db: sqlite3.Connection) -> None:
    """The live jobs' partial index (`_LIVE_INDEX`): reads of the live jobs no longer scan the
    finished ones (bench/bench_scale.py)."""
    db.execute(_LIVE_INDEX)


MIGRATIONS: tuple[Callable[[sqlite3.Connection], None], ...] = (_version_1, _version_2, _version_3, _version_4, _version_5,
                                                               _version_6, _version_7)
VERSION = len(MIGRATIONS)


def refuse_newer(path: Path, found: int) -> None:
    """Raise `StoreRefused` if the store's version `found` is one this code does not know."""
    if found > VERSION:
        raise StoreRefused(
            f"state store {path} is at schema version {found}, written by a newer spx-trainer (this one knows "
            f"up to {VERSION}); run that version again, or restore a backup this version wrote", 2)


def prepare(db: sqlite3.Connection, path: Path) -> None:
    """Make the store at `path` (this connection's) one of `VERSION`: create it if it has no tables,
    else run the migrations it lacks; one transaction, stamped with the version. Raises
    `StoreRefused` for a store of a newer version (nothing written)."""
    db.execute("BEGIN IMMEDIATE")
    try:
        found = int(db.execute("PRAGMA user_version").fetchone()[0])
        refuse_newer(path, found)
        if found < VERSION:
            if db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'jobs'").fetchone() is None:
                _create(db)
            else:
                for migrate in MIGRATIONS[found:]:
                    migrate(db)
            db.execute(f"PRAGMA user_version = {VERSION}")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _create(db: sqlite3.Connection) -> None:
    """A new store, at the latest version, with its creation record."""
    for statement in (*TABLES, *INDEXES, _CREATED):
        db.execute(statement)


def check_readable(db: sqlite3.Connection, path: Path) -> None:
    """For a read-only opener: refuse a store of a newer version (`StoreRefused`)."""
    refuse_newer(path, int(db.execute("PRAGMA user_version").fetchone()[0]))
