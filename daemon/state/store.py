"""The durable state store: SQLite in WAL mode, one writer (the daemon's main loop), many readers.

Every state change is one transaction (`transition`), so a daemon killed with SIGKILL at any instant
restarts into a consistent store: each job is in exactly one state, each attempt is open or closed.
Readers (the control socket, the exporter) use their own per-thread connections; WAL lets them read
while the main loop writes.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from spx.daemon.core.spec import JobSpec
from spx.daemon.state import fault_points
from spx.daemon.state.states import LIVE, TERMINAL, JobState, check_edge

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
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
    uid TEXT
);
-- Names are unique among live jobs only: a finished job's name may be reused.
CREATE UNIQUE INDEX IF NOT EXISTS jobs_live_name ON jobs(name)
    WHERE state NOT IN ('succeeded', 'failed', 'cancelled');
CREATE INDEX IF NOT EXISTS jobs_name ON jobs(name, id);
CREATE TABLE IF NOT EXISTS attempts (
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
    UNIQUE (job_id, number)
);
-- Written once, when the store is created: a store without it was not made whole (see integrity.py).
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
-- GPUs the health gate found faulty: never allocated until an operator releases them (spx gpu release).
CREATE TABLE IF NOT EXISTS gpu_quarantine (
    gpu INTEGER PRIMARY KEY,
    uuid TEXT,
    reason TEXT NOT NULL,
    since REAL NOT NULL
);
-- The queue's host-wide switches (spx drain: key 'drained', value = who and why), kept across restarts.
CREATE TABLE IF NOT EXISTS queue_settings (key TEXT PRIMARY KEY, value TEXT NOT NULL, since REAL NOT NULL);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id INTEGER REFERENCES jobs(id),
    time REAL NOT NULL,
    kind TEXT NOT NULL,
    detail TEXT
);
"""
# Columns added since the first release: (table, column, declaration), added to an older store at open.
_ADDED_COLUMNS = (
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


_TERMINAL_SQL = ",".join(f"'{s.value}'" for s in sorted(TERMINAL, key=lambda s: s.value))


class DuplicateJob(Exception):
    """A live job with this name exists already."""


class StoreUnavailable(Exception):
    """A write could not be made durable now: the disk is full, failing, or the store stayed locked
    past its timeout. Nothing of the transaction was written; the caller contains it (the job waits
    or fails with this as its reason) rather than letting the daemon crash-loop on it."""


_CREATED = "INSERT OR IGNORE INTO meta (key, value) VALUES ('created', datetime('now'))"
# sqlite3 raises these as OperationalError with only the message to tell them apart.
_UNAVAILABLE = ("database or disk is full", "disk I/O error", "database is locked", "unable to open database file")


@dataclass(frozen=True)
class JobRow:
    id: int
    name: str
    state: JobState
    reason: str | None
    owner_uid: int
    owner: str
    spec: JobSpec
    spec_file: str
    submitted: float
    priority: int
    gpus: list[int]
    backoff_remaining: float  # seconds of backoff left (monotonic), resumed after a daemon restart
    no_progress_streak: int
    backoff_level: int
    staging: str | None
    # Why this version refuses the spec stored when the job was accepted (its bounds tightened
    # since); None when it validates. Such a job's `spec` holds the stored values unvalidated.
    spec_problem: str | None = None
    # The job's identity across hosts: 32 hex digits made when it was submitted, kept when another
    # host adopts it from its checkpoint dir (`spx adopt`), so both name the same job alike.
    uid: str = ""
    held: str | None = None  # who holds it queued (`spx hold`), None when not held


@dataclass(frozen=True)
class AttemptRow:
    id: int
    job_id: int
    number: int
    attempt_id: str
    start: float
    end: float | None
    exit_code: int | None
    signal: int | None
    reason: str | None
    reason_class: str | None
    resumed_from: str | None
    resumed_from_step: int | None
    max_step: int | None
    pgid: int | None
    port: int | None
    root_cause: str | None
    boot_id: str | None = None     # the boot and /proc start time of the pgid leader, to tell it
    start_ticks: int | None = None  # from a later process that reuses the pid
    stop_cause: str | None = None   # why the daemon stops it, stored before the SIGTERM (outlives a restart)
    exited: float | None = None     # when its launcher's exit (exit_code, signal) was seen, before the end
    phases: str | None = None       # JSON {phase: Unix seconds}: where its (re)start spent its time (run/timeline.py)
    checkpoint_discovery: str | None = None  # JSON: the layout found, what was skipped and why (checkpoint_discovery)
    generation: int | None = None   # a job across hosts: the round it joined (run/gang.py)


_JOB_FIELDS = {"gpus", "backoff_remaining", "no_progress_streak", "backoff_level", "staging", "reason", "held", "priority"}
_ATTEMPT_END_FIELDS = {"end", "exit_code", "signal", "reason", "reason_class", "max_step", "root_cause"}
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


_ATTEMPT_COLUMNS = frozenset(AttemptRow.__dataclass_fields__)


def _stored_spec(raw: str) -> tuple[JobSpec, str | None]:
    """The accepted spec, re-validated by this version. A row that no longer validates must not
    make every read raise (the daemon would crash-loop at start on one job): it is returned
    unvalidated with the problem, and `fail_unusable_specs` ends such a job with that reason."""
    try:
        return JobSpec.model_validate_json(raw), None
    except ValidationError as e:
        problem = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors()[:5])
        return JobSpec.model_construct(**json.loads(raw)), problem


def _job(row: sqlite3.Row) -> JobRow:
    spec, spec_problem = _stored_spec(row["spec_json"])
    return JobRow(
        id=row["id"],
        name=row["name"],
        state=JobState(row["state"]),
        reason=row["reason"],
        owner_uid=row["owner_uid"],
        owner=row["owner"],
        spec=spec,
        spec_file=row["spec_file"],
        submitted=row["submitted"],
        priority=row["priority"],
        gpus=json.loads(row["gpus"]),
        backoff_remaining=row["backoff_remaining"],
        no_progress_streak=row["no_progress_streak"],
        backoff_level=row["backoff_level"],
        staging=row["staging"],
        spec_problem=spec_problem,
        uid=row["uid"] or "",
        held=row["held"],
    )


def _attempt(row: sqlite3.Row) -> AttemptRow:
    return AttemptRow(**{k: row[k] for k in row.keys() if k in _ATTEMPT_COLUMNS})  # noqa: SIM118 (sqlite3.Row iterates values)


class _ThreadConnection:
    """One thread's connection, closed as the thread ends (its `threading.local` entry goes, and
    with it this holder) — not at some later garbage collection, which a connection left to itself
    waits for: every control request and every scrape is a thread of its own, and a burst of them
    held two file descriptors (the database and its WAL) per finished thread until then (measured:
    ~80 after 40 `spx ls`)."""

    __slots__ = ("db",)

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __del__(self) -> None:
        self.db.close()


class Store:
    """Jobs, attempts and events. Writers must be on the thread that owns the daemon's main loop;
    any thread may read (each gets its own connection)."""

    def __init__(self, path: Path, readonly: bool = False):
        self.path = path
        self.readonly = readonly
        self._local = threading.local()
        if not readonly:
            path.parent.mkdir(parents=True, exist_ok=True)
            # Schema and creation record in one transaction: a store is either not there or whole.
            self._db.executescript(f"BEGIN IMMEDIATE;\n{SCHEMA}\n{_CREATED};\nCOMMIT;")
            self._add_columns()

    def _add_columns(self) -> None:
        """A store written by an older daemon gets the columns added since (each ALTER is atomic)."""
        for table, column, decl in _ADDED_COLUMNS:
            have = {r[1] for r in self._db.execute(f"PRAGMA table_info({table})").fetchall()}
            if column not in have:
                self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
        # Jobs recorded before `uid` existed get one, so every job has an identity other hosts can
        # tell apart (the host-loss record next to its checkpoints carries it; see intake/job_record.py).
        self._db.execute("UPDATE jobs SET uid = lower(hex(randomblob(16))) WHERE uid IS NULL")
        self._db.execute("CREATE INDEX IF NOT EXISTS jobs_uid ON jobs(uid)")

    @property
    def _db(self) -> sqlite3.Connection:
        held: _ThreadConnection | None = getattr(self._local, "held", None)
        if held is None:
            if self.readonly:
                db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=10, isolation_level=None)
            else:
                db = sqlite3.connect(self.path, timeout=10, isolation_level=None)
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=FULL")
            db.row_factory = sqlite3.Row
            db.execute("PRAGMA foreign_keys=ON")
            held = self._local.held = _ThreadConnection(db)
        return held.db

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction. A full or failing disk, or a lock held past the timeout, raises
        `StoreUnavailable` with nothing written."""
        db = self._db
        if fault_points.ACTIVE:  # tests/faults only: name the write, maybe die around its commit
            op = sys._getframe(2).f_code.co_name
            number = fault_points.begin(op)
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
            if fault_points.ACTIVE:
                fault_points.reached("before-commit", number, op)
            db.execute("COMMIT")
            if fault_points.ACTIVE:
                fault_points.reached("after-commit", number, op)
        except sqlite3.OperationalError as e:
            if db.in_transaction:
                try:
                    db.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            if any(m in str(e) for m in _UNAVAILABLE):
                raise StoreUnavailable(f"state store {self.path}: {e}") from e
            raise

    def close(self) -> None:
        """Close this thread's connection now (the next use opens a fresh one)."""
        self._local.held = None

    # --- writes -----------------------------------------------------------------------------------

    def add_job(self, spec: JobSpec, owner_uid: int, owner: str, spec_file: str, now: float, *,
                uid: str | None = None, submitted: float | None = None, event: str | None = None) -> int:
        """A new queued job. `uid`, `submitted` and `event` are given for a job adopted from another
        host's checkpoint dir (its identity and submission time are kept; the event says from where);
        a submitted job gets a fresh uid."""
        try:
            with self._tx() as db:
                cur = db.execute(
                    "INSERT INTO jobs (name, state, owner_uid, owner, spec_json, spec_file, submitted,"
                    " priority, updated, uid) VALUES (?, 'queued', ?, ?, ?, ?, ?, ?, ?, ?)",
                    (spec.name, owner_uid, owner, spec.model_dump_json(by_alias=True), spec_file,
                     now if submitted is None else submitted, spec.priority, now, uid or uuid.uuid4().hex),
                )
                job_id = int(cur.lastrowid or 0)
                db.execute(
                    "INSERT INTO events (job_id, time, kind, detail) VALUES (?, ?, 'submitted', ?)",
                    (job_id, now, event or f"by {owner} (uid {owner_uid})"),
                )
                return job_id
        except sqlite3.IntegrityError as e:
            raise DuplicateJob(spec.name) from e

    def transition(self, job_id: int, new: JobState, reason: str | None, now: float, **fields: object) -> None:
        """The only writer of a job's state: checks the edge, writes state, reason and any of the
        job's bookkeeping fields, and records an event, all in one transaction."""
        unknown = set(fields) - _JOB_FIELDS
        if unknown:
            raise ValueError(f"not job fields: {sorted(unknown)}")
        with self._tx() as db:
            self._transition(db, job_id, new, reason, now, fields)

    def _transition(self, db: sqlite3.Connection, job_id: int, new: JobState, reason: str | None, now: float,
                    fields: dict[str, object]) -> None:
        row = db.execute("SELECT state FROM jobs WHERE id = ?", (job_id,)).fetchone()
        check_edge(JobState(row["state"]), new)
        self._set(db, job_id, {"state": new.value, "reason": reason, **fields}, now)
        db.execute(
            "INSERT INTO events (job_id, time, kind, detail) VALUES (?, ?, ?, ?)",
            (job_id, now, new.value, reason),
        )

    def update_job(self, job_id: int, now: float, **fields: object) -> None:
        unknown = set(fields) - _JOB_FIELDS
        if unknown:
            raise ValueError(f"not job fields: {sorted(unknown)}")
        with self._tx() as db:
            self._set(db, job_id, fields, now)

    @staticmethod
    def _set(db: sqlite3.Connection, job_id: int, fields: dict, now: float) -> None:
        values = {k: (json.dumps(v) if k == "gpus" else v) for k, v in fields.items()}
        values["updated"] = now
        cols = ", ".join(f"{k} = ?" for k in values)
        db.execute(f"UPDATE jobs SET {cols} WHERE id = ?", (*values.values(), job_id))

    def start_attempt(
        self,
        job_id: int,
        *,
        number: int,
        attempt_id: str,
        now: float,
        resumed_from: str | None,
        resumed_from_step: int | None,
        port: int | None,
        checkpoint_discovery: str | None = None,
        generation: int | None = None,
    ) -> int:
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO attempts (job_id, number, attempt_id, start, resumed_from, resumed_from_step, port,"
                " checkpoint_discovery, generation) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (job_id, number, attempt_id, now, resumed_from, resumed_from_step, port, checkpoint_discovery,
                 generation),
            )
            return int(cur.lastrowid or 0)

    def attempt_running(self, job_id: int, attempt_row: int, *, pgid: int, boot_id: str | None,
                        start_ticks: int | None, reason: str | None, now: float) -> None:
        """The attempt's launcher exec'd: its process group (with what identifies its leader across a
        daemon restart) and the job → running, in one transaction."""
        with self._tx() as db:
            db.execute("UPDATE attempts SET pgid = ?, boot_id = ?, start_ticks = ? WHERE id = ?",
                       (pgid, boot_id, start_ticks, attempt_row))
            self._transition(db, job_id, JobState.RUNNING, reason, now, {})

    def attempt_stopping(self, attempt_row: int, cause: str) -> None:
        """Why the daemon stops the attempt ("cancel", "hang", "daemon-stop", "daemon-restart"), stored
        before the SIGTERM: a daemon restarted before the end still cancels a cancelled attempt and
        never counts one the daemon stopped as the job's own failure."""
        with self._tx() as db:
            db.execute("UPDATE attempts SET stop_cause = ? WHERE id = ?", (cause, attempt_row))

    def attempt_exited(self, attempt_row: int, exit_code: int | None, signal: int | None, stop_cause: str | None,
                       now: float) -> None:
        """The launcher's exit status (and why the daemon was stopping it, if it was), as soon as it is
        seen: the attempt may still have leftovers to kill and a diagnosis to make, and a daemon
        restarted meanwhile must decide on this status, not lose it."""
        with self._tx() as db:
            db.execute("UPDATE attempts SET exit_code = ?, signal = ?, stop_cause = ?, exited = ? WHERE id = ?",
                       (exit_code, signal, stop_cause, now, attempt_row))

    def add_attempt_phases(self, attempt_row: int, phases: dict[str, float]) -> None:
        """Merge `phases` into the attempt's timeline (a phase already recorded keeps its time)."""
        with self._tx() as db:
            row = db.execute("SELECT phases FROM attempts WHERE id = ?", (attempt_row,)).fetchone()
            if row is None:
                return
            merged = {**phases, **json.loads(row[0] or "{}")}
            db.execute("UPDATE attempts SET phases = ? WHERE id = ?", (json.dumps(merged, sort_keys=True), attempt_row))

    def finish_attempt(self, job_id: int, attempt_row: int | None, new_state: JobState, reason: str | None,
                       now: float, attempt_fields: dict[str, object], job_fields: dict[str, object]) -> None:
        """End the attempt row (if any) AND move the job, in ONE transaction: a daemon killed at any
        instant leaves either both written or neither."""
        unknown = (set(attempt_fields) - _ATTEMPT_END_FIELDS) | (set(job_fields) - _JOB_FIELDS)
        if unknown:
            raise ValueError(f"not attempt/job fields: {sorted(unknown)}")
        # An integer SQLite cannot hold (a step from a user's file, were one unchecked) is dropped,
        # not raised: refused, this write would leave the job `running` here while given up in memory.
        attempt_fields = {k: None if type(v) is int and not _INT64_MIN <= v <= _INT64_MAX else v
                          for k, v in attempt_fields.items()}
        with self._tx() as db:
            if attempt_row is not None and attempt_fields:
                cols = ", ".join(f"{k} = ?" for k in attempt_fields)
                db.execute(f"UPDATE attempts SET {cols} WHERE id = ?", (*attempt_fields.values(), attempt_row))
            self._transition(db, job_id, new_state, reason, now, job_fields)

    def fault_attempts(self, job_id: int) -> int:
        """Closed attempts that ended by the job's own fault — what `restart.max_restarts` counts. A
        daemon stop or restart, a lost attempt, a cancel and a daemon error are not the job's."""
        return sum(self.fault_attempts_by_class(job_id).values())

    def fault_attempts_by_class(self, job_id: int) -> dict[str, int]:
        """`fault_attempts` by failure class (the attempts' reason_class): what a class's
        `restart.on_failure` rule counts."""
        rows = self._db.execute(
            "SELECT reason_class, COUNT(*) FROM attempts WHERE job_id = ? AND end IS NOT NULL AND reason_class IS NOT NULL"
            " AND reason_class NOT IN ('daemon-restart', 'lost', 'peer-restart', 'cancelled', 'daemon-error', 'launch')"
            " GROUP BY reason_class",
            (job_id,),
        ).fetchall()
        return {str(cls): int(n) for cls, n in rows}

    def end_attempt(self, attempt_row: int, **fields: object) -> None:
        unknown = set(fields) - _ATTEMPT_END_FIELDS
        if unknown:
            raise ValueError(f"not attempt fields: {sorted(unknown)}")
        with self._tx() as db:
            cols = ", ".join(f"{k} = ?" for k in fields)
            db.execute(f"UPDATE attempts SET {cols} WHERE id = ?", (*fields.values(), attempt_row))

    def add_event(self, job_id: int | None, kind: str, detail: str | None, now: float) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO events (job_id, time, kind, detail) VALUES (?, ?, ?, ?)", (job_id, now, kind, detail)
            )

    # --- GPU quarantine -------------------------------------------------------------------------------

    def quarantine_gpu(self, gpu: int, uuid: str | None, reason: str, now: float) -> bool:
        """Record GPU `gpu` as faulty (the first reason is kept). True if it was not quarantined yet."""
        with self._tx() as db:
            cur = db.execute("INSERT OR IGNORE INTO gpu_quarantine (gpu, uuid, reason, since) VALUES (?, ?, ?, ?)",
                             (gpu, uuid, reason, now))
            if cur.rowcount:
                db.execute("INSERT INTO events (job_id, time, kind, detail) VALUES (NULL, ?, 'gpu-quarantined', ?)",
                           (now, f"GPU {gpu}: {reason}"))
            return bool(cur.rowcount)

    def release_gpu(self, gpu: int, by: str, now: float) -> bool:
        """An operator's release of a quarantined GPU. False if it was not quarantined."""
        with self._tx() as db:
            cur = db.execute("DELETE FROM gpu_quarantine WHERE gpu = ?", (gpu,))
            if cur.rowcount:
                db.execute("INSERT INTO events (job_id, time, kind, detail) VALUES (NULL, ?, 'gpu-released', ?)",
                           (now, f"GPU {gpu} released by {by}"))
            return bool(cur.rowcount)

    def quarantined_gpus(self) -> dict[int, tuple[str | None, str, float]]:
        """{gpu index: (uuid, reason, since)} of every quarantined GPU."""
        rows = self._db.execute("SELECT gpu, uuid, reason, since FROM gpu_quarantine").fetchall()
        return {int(r[0]): (r[1], str(r[2]), float(r[3])) for r in rows}

    def fail_unusable_specs(self, now: float) -> list[JobRow]:
        """At start: live jobs without an open attempt whose stored spec this version refuses end
        `failed` with the reason (resubmitting it shows what to change). Returns them."""
        failed = []
        for job in self.live_jobs():
            if job.spec_problem is not None and self.open_attempt(job.id) is None:
                self.transition(job.id, JobState.FAILED,
                                f"its accepted spec is not valid in this version ({job.spec_problem}); "
                                "fix and resubmit it", now, gpus=[])
                failed.append(job)
        return failed

    # --- queue switches (spx drain) -------------------------------------------------------------------

    def drained(self) -> str | None:
        """Who drained the host (no new starts), or None."""
        row = self._db.execute("SELECT value FROM queue_settings WHERE key = 'drained'").fetchone()
        return str(row[0]) if row else None

    def set_drained(self, by: str | None, now: float) -> None:
        """Drain (`by` says who) or undrain (None), with an event, in one transaction."""
        with self._tx() as db:
            if by is None:
                db.execute("DELETE FROM queue_settings WHERE key = 'drained'")
            else:
                db.execute("INSERT OR REPLACE INTO queue_settings (key, value, since) VALUES ('drained', ?, ?)",
                           (by, now))
            db.execute("INSERT INTO events (job_id, time, kind, detail) VALUES (NULL, ?, ?, ?)",
                       (now, "drained" if by else "undrained", by))

    def set_reasons(self, reasons: dict[int, str], now: float) -> None:
        """Why each of these jobs waits (the scheduler's `Plan.waiting`), in one transaction: a
        thousand queued jobs must not cost a thousand commits."""
        with self._tx() as db:
            db.executemany("UPDATE jobs SET reason = ?, updated = ? WHERE id = ?",
                           [(why, now, job_id) for job_id, why in reasons.items()])

    def jobs_named_before(self, name: str, before_id: int, limit: int = 64) -> list[JobRow]:
        """Jobs called `name` submitted before job `before_id`, newest first (what `after:` names)."""
        rows = self._db.execute("SELECT * FROM jobs WHERE name = ? AND id < ? ORDER BY id DESC LIMIT ?",
                                (name, before_id, limit)).fetchall()
        return [_job(r) for r in rows]

    # --- reads ------------------------------------------------------------------------------------

    def live_jobs(self) -> list[JobRow]:
        marks = ",".join("?" * len(LIVE))
        rows = self._db.execute(
            f"SELECT * FROM jobs WHERE state IN ({marks}) ORDER BY priority DESC, submitted, id",
            [s.value for s in LIVE],
        ).fetchall()
        return [_job(r) for r in rows]

    def all_jobs(self) -> list[JobRow]:
        return [_job(r) for r in self._db.execute("SELECT * FROM jobs ORDER BY id").fetchall()]

    def current_jobs(self, finished_since: float) -> list[JobRow]:
        """One job per name, the one `job_by_name` gives (the live one, else the newest finished),
        without finished ones that ended before `finished_since`."""
        rows = self._db.execute(
            "SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY name ORDER BY "
            f"  (state IN ({_TERMINAL_SQL})), id DESC) AS newest FROM jobs) "
            f"WHERE newest = 1 AND (state NOT IN ({_TERMINAL_SQL}) OR updated >= ?) ORDER BY id",
            (finished_since,),
        ).fetchall()
        return [_job(r) for r in rows]

    def job(self, job_id: int) -> JobRow:
        return _job(self._db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone())

    def job_by_uid(self, uid: str) -> JobRow | None:
        """The job with this identity (see `JobRow.uid`), whatever its state; None if unknown here."""
        row = self._db.execute("SELECT * FROM jobs WHERE uid = ? ORDER BY id DESC LIMIT 1", (uid,)).fetchone()
        return _job(row) if row else None

    def ended_since(self, since: float) -> list[JobRow]:
        """Jobs in a terminal state whose last change was at or after `since` (wall clock)."""
        rows = self._db.execute(
            f"SELECT * FROM jobs WHERE state IN ({_TERMINAL_SQL}) AND updated >= ? ORDER BY id", (since,)
        ).fetchall()
        return [_job(r) for r in rows]

    def job_by_name(self, name: str) -> JobRow | None:
        """The live job of that name, else the most recent finished one."""
        row = self._db.execute(
            f"SELECT * FROM jobs WHERE name = ? ORDER BY (state IN ({_TERMINAL_SQL})), id DESC LIMIT 1",
            (name,),
        ).fetchone()
        return _job(row) if row else None

    def attempts(self, job_id: int) -> list[AttemptRow]:
        rows = self._db.execute("SELECT * FROM attempts WHERE job_id = ? ORDER BY number", (job_id,)).fetchall()
        return [_attempt(r) for r in rows]

    def open_attempt(self, job_id: int) -> AttemptRow | None:
        row = self._db.execute(
            "SELECT * FROM attempts WHERE job_id = ? AND end IS NULL ORDER BY number DESC LIMIT 1", (job_id,)
        ).fetchone()
        return _attempt(row) if row else None

    def restarts_by_reason(self, job_id: int) -> dict[str, int]:
        """Closed attempts that were followed by a relaunch, counted by failure class."""
        rows = self._db.execute(
            "SELECT a.reason_class, COUNT(*) FROM attempts a WHERE a.job_id = ? AND a.end IS NOT NULL"
            " AND EXISTS (SELECT 1 FROM attempts b WHERE b.job_id = a.job_id AND b.number = a.number + 1)"
            " GROUP BY a.reason_class",
            (job_id,),
        ).fetchall()
        return {r[0] or "unknown": r[1] for r in rows}

    def spec_files_known(self) -> set[str]:
        return {r[0] for r in self._db.execute("SELECT spec_file FROM jobs").fetchall()}
