"""The store's SQLite file: a connection per thread, and write transactions that either happen whole
or not at all.

SQLite in WAL mode with one writer (the daemon's main loop) and many readers: the control socket
and the exporter read on threads of their own while the main loop writes. Every write is one
`Database.write(point)` transaction, so a daemon killed with SIGKILL at any instant restarts into a
consistent store. `point` names the write for the tests' kill-at-a-write hook (`fault_points`).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from spx.daemon.state import fault_points

# sqlite3 raises these as OperationalError with only the message to tell them apart.
_UNAVAILABLE = ("database or disk is full", "disk I/O error", "database is locked", "unable to open database file")
# Each connection's page cache, in KiB (SQLite's default is 2,000). Every thread that reads holds a
# connection, and the long-lived ones (the loop, the lanes' workers, the lease keeper) each filled
# theirs as the store grew: the daemon's memory rose with the store. The reads are indexed and a miss
# is a read from the OS's page cache, so a small cache costs them little.
CACHE_KIB = 512


class StoreUnavailable(Exception):
    """A write could not be made durable now: the disk is full, failing, or the store stayed locked
    past its timeout. Nothing of the transaction was written; the caller contains it (the job waits
    or fails with this as its reason) rather than letting the daemon crash-loop on it."""


class StoreRefused(Exception):
    """The daemon must not start on this store (damaged, in use, or written by a newer version).
    `str()` is the one line to log; `exit_code` is the process's exit status (2: restarting cannot
    help; 3: in use, it may when the other goes)."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


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
        try:
            self.db.close()
        except sqlite3.ProgrammingError:  # collected at exit on another thread: the process ends anyway
            pass


class Database:
    """The store's file. Writes must be on the thread that owns the daemon's main loop; any thread
    may read (each gets its own connection, `conn`)."""

    def __init__(self, path: Path, readonly: bool):
        self.path = path
        self.readonly = readonly
        self._local = threading.local()
        self._commits = 0  # write transactions committed through this object (the main loop's)

    @property
    def conn(self) -> sqlite3.Connection:
        """This thread's connection, opened at its first use."""
        held: _ThreadConnection | None = getattr(self._local, "held", None)
        if held is None:
            if self.readonly:
                db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=10, isolation_level=None)
            else:
                db = sqlite3.connect(self.path, timeout=10, isolation_level=None)
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=FULL")
            db.row_factory = sqlite3.Row
            db.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
            db.execute("PRAGMA foreign_keys=ON")
            held = self._local.held = _ThreadConnection(db)
        return held.db

    @contextmanager
    def write(self, point: str | None) -> Iterator[sqlite3.Connection]:
        """One write transaction, named `point` for the tests' fault hook (None: a write no fault point
        stops at). A full or failing disk, or a lock held past the timeout, raises `StoreUnavailable`
        with nothing written."""
        db = self.conn
        number = fault_points.begin() if fault_points.ACTIVE and point else None
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
            if number is not None:
                fault_points.reached("before-commit", number, str(point))
            db.execute("COMMIT")
            self._commits += 1
            if number is not None:
                fault_points.reached("after-commit", number, str(point))
        except sqlite3.OperationalError as e:
            if db.in_transaction:
                try:
                    db.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            if any(m in str(e) for m in _UNAVAILABLE):
                raise StoreUnavailable(f"state store {self.path}: {e}") from e
            raise

    def version(self) -> tuple[int, int]:
        """Changes as a number that differs whenever anything was committed since it was last read:
        this object's own writes counted, and SQLite's `data_version` for any other connection's (a
        reader that keeps a result until the store changes must miss no write, whoever made it)."""
        return self._commits, int(self.conn.execute("PRAGMA data_version").fetchone()[0])

    def close(self) -> None:
        """Close this thread's connection now (the next use opens a fresh one)."""
        self._local.held = None
