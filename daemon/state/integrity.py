"""Before the daemon opens its state store: is it whole, is it ours, and is nobody else using it?

A damaged store must stop the daemon, never be papered over. SQLite treats a missing or empty file as a
new, empty database, and the daemon would then run every job it had ever accepted again — a finished
job a second time, a running one twice at once. So at start:

- `lock_state_dir` takes an exclusive flock on `state_dir/daemon.lock` for the life of the process: a
  second daemon on the same root refuses to start instead of sharing the store and the jobs.
- `check_store` reads the file's header, asks SQLite (`PRAGMA quick_check`), checks the schema and
  the `meta` row the store writes at creation, refuses a store of a newer schema version than this
  code knows (`schema.py`), and takes the write lock once. A missing or empty file counts as a new
  store only when nothing shows that this host had state before (no backup, no accepted job file).

Both raise `StoreRefused` with a message that is one line: what is wrong, where, and how to restore.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
from pathlib import Path

from spx.daemon.state import schema
from spx.daemon.state.db import StoreRefused

SQLITE_HEADER = b"SQLite format 3\x00"
REQUIRED_TABLES = ("jobs", "attempts", "events")
META_TABLE = "meta"
LOCK_TIMEOUT_SECONDS = 2.0


def lock_state_dir(state_dir: Path) -> int:
    """Take `state_dir/daemon.lock` exclusively (flock, released by the kernel when this process dies)
    and write our pid into it. Returns the fd, which must stay open for the life of the daemon."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / "daemon.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise StoreRefused(
            f"another spx-trainer (pid {holder}) is running on {state_dir} (it holds {path}); stop it first: "
            "two daemons on one state store would run every job twice", 3) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def backups(backup_dir: Path) -> list[Path]:
    """Backups, oldest first (their names sort by time)."""
    try:
        return sorted(p for p in backup_dir.iterdir() if p.name.startswith("spx-") and p.suffix == ".sqlite")
    except OSError:
        return []


def had_state(state_dir: Path, backup_dir: Path) -> str | None:
    """What shows this host had a store before (a backup, an accepted job file), or None."""
    found = backups(backup_dir)
    if found:
        return f"backup {found[-1]} exists"
    jobs = state_dir / "jobs"
    try:
        accepted = next((p for p in jobs.iterdir() if p.suffix == ".yaml"), None)
    except OSError:
        accepted = None
    return f"accepted job file {accepted} exists" if accepted else None


def _restore_hint(path: Path, backup_dir: Path) -> str:
    found = backups(backup_dir)
    aside = f"or move it aside to start empty: mv {path} {path}.damaged (accepted jobs would run again)"
    if not found:
        return f"no backup in {backup_dir}; {aside}"
    return (f"restore the newest backup: rm -f {path}-wal {path}-shm && cp {found[-1]} {path}; {aside}")


def _header_problem(path: Path, size: int) -> str | None:
    """What the first 100 bytes say is wrong (not SQLite; shorter than the database it describes)."""
    with path.open("rb") as f:
        header = f.read(100)
    if not header.startswith(SQLITE_HEADER[: len(header)]) or len(header) < len(SQLITE_HEADER):
        return f"not an SQLite database (starts with {header[:16]!r})"
    if len(header) < 100:
        return f"truncated to {size} bytes"
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    # The in-header size is valid only when its version stamp matches the change counter.
    if header[24:28] == header[92:96] and pages * page_size > size:
        return f"truncated: {size} bytes where the header says {pages * page_size}"
    return None


def _holders(path: Path) -> str:
    """Processes holding POSIX locks on the store (from /proc/locks), for the refusal message."""
    inodes = set()
    for p in (path, Path(f"{path}-shm")):
        try:
            st = p.stat()
        except OSError:
            continue
        inodes.add(f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}")
    pids = set()
    try:
        for line in Path("/proc/locks").read_text().splitlines():
            fields = line.split()
            if len(fields) > 5 and fields[5] in inodes and fields[4].isdigit() and int(fields[4]) != os.getpid():
                pids.add(int(fields[4]))
    except OSError:
        pass
    names = []
    for pid in sorted(pids):
        try:
            names.append(f"{Path(f'/proc/{pid}/comm').read_text().strip()} (pid {pid})")
        except OSError:
            names.append(f"pid {pid}")
    return ", ".join(names) if names else "another process"


def check_store(path: Path, backup_dir: Path) -> None:
    """Raise `StoreRefused` unless `path` is a whole store of ours (or there is none and there never
    was one). Changes nothing in it, so a refused store is left as found for the restore."""
    state_dir = path.parent
    size = path.stat().st_size if path.exists() else None
    wal = Path(f"{path}-wal")
    wal_size = wal.stat().st_size if wal.exists() else 0
    if not size and not wal_size:
        before = had_state(state_dir, backup_dir)
        if before is None:
            return  # a new host: the store starts empty
        what = "missing" if size is None else "empty (0 bytes)"
        raise StoreRefused(f"state store {path} is {what} but this host had state ({before}); "
                           f"{_restore_hint(path, backup_dir)}", 2)
    if not size:
        # A store in WAL mode has its header page in the main file from creation on; SQLite would
        # open this as a new database and throw the write-ahead log away.
        raise StoreRefused(f"state store {path} is {'missing' if size is None else 'empty (0 bytes)'} beside a "
                           f"{wal_size}-byte write-ahead log {wal}; {_restore_hint(path, backup_dir)}", 2)
    problem = _header_problem(path, size)
    if problem is None:
        problem = _sqlite_problem(path, state_dir, backup_dir)
    if problem is not None:
        raise StoreRefused(f"state store {path} is damaged ({problem}); {_restore_hint(path, backup_dir)}", 2)


def _sqlite_problem(path: Path, state_dir: Path, backup_dir: Path) -> str | None:
    try:
        db = sqlite3.connect(path, timeout=LOCK_TIMEOUT_SECONDS, isolation_level=None)
    except sqlite3.Error as e:
        return f"cannot open: {e}"
    try:
        try:
            # The write lock first: a store another process holds must be refused as in use, not damaged.
            db.execute("BEGIN IMMEDIATE")
            db.execute("ROLLBACK")
            schema.refuse_newer(path, int(db.execute("PRAGMA user_version").fetchone()[0]))
            result = [r[0] for r in db.execute("PRAGMA quick_check").fetchall()]
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            created = db.execute(f"SELECT value FROM {META_TABLE} WHERE key = 'created'").fetchone() \
                if META_TABLE in tables else None
        except sqlite3.OperationalError as e:
            if "locked" in str(e) or "busy" in str(e):
                raise StoreRefused(f"state store {path} is locked by {_holders(path)}; stop it and start again "
                                   "(the daemon must be the store's only writer)", 3) from None
            return str(e)
        except sqlite3.DatabaseError as e:
            return str(e)
    finally:
        db.close()
    if result != ["ok"]:
        return "quick_check: " + "; ".join(" ".join(r.split()) for r in result[:3])
    missing = [t for t in REQUIRED_TABLES if t not in tables]
    if missing and (tables or had_state(state_dir, backup_dir)):
        return f"tables missing: {', '.join(missing)}"
    if META_TABLE in tables and created is None:
        return "its creation record (meta 'created') is missing"
    return None
