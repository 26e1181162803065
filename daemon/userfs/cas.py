"""The one compare-and-swap the daemons of several hosts share, in a job's checkpoint dir.

    with cas.Locked(dir_fd, "lease.lock") as lk:     # exclusive flock, for the read-check-write only
        now = lk.read("lease")                         # Record(doc, gen)
        if <now is free, or ours>:
            lk.write("lease", {...}, bump=True)        # gen := one more than any handed out here

Used for `.spx/lease` (userfs/spx_dir.py: which daemon runs a job) and `.spx-gang/generation`
(userfs/gang_dir.py: the round every host of a job runs in). Runs only inside `user_actions`, as
the job's owner, in a directory the caller has checked is the owner's alone (`private_dir`).

Why `flock`, held only around the read-check-write: every daemon of every host takes the same lock
file, so "read the record, decide, write" is one step however many daemons race (a link/rename
protocol without a lock left two holders when three daemons broke one expired lease). The lock goes
with its process: a daemon that dies inside never leaves it held. It is waited for a bounded time
(a holder keeps it for milliseconds; a user holding their own lock file stalls only their own job).

Every record carries a generation `gen`. A write either keeps it (a lease renewed by its holder)
or moves it to one more than any generation handed out in this directory before: the lock file
itself keeps the highest, so a record removed (a lease given up) and written again never repeats
one. That number is the fencing token: an attempt is launched with its lease's generation and
publishes a checkpoint only while the lease is still at it (contract/fencing.py).

Supported file systems are those where `flock` is a lock between hosts: local ones, NFSv4 (and
NFSv3 with a working lockd, not mounted `nolock` or `local_lock=flock|all`), Lustre mounted `-o flock`,
CephFS, GPFS. Where `flock` fails (ENOLCK, EOPNOTSUPP) nothing is written: `LocksUnsupported`, and
the job does not start there with that reason (`spx doctor` checks the checkpoints root).
Every record is replaced whole (a temporary name, fsync, rename, fsync of the directory), so a
reader that takes no lock (`spx adopt`'s scan, a beat) sees the old record or the new one.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import time
from dataclasses import dataclass
from typing import Any

from spx.daemon.contract.fencing import (
    LOCK_WAIT_SECONDS,
    MAX_GENERATION,
    RECORD_MAX_BYTES,
    LocksUnsupported,
    flock_within,
    private_problem,
)
from spx.daemon.core import bounded

__all__ = ["LOCK_WAIT_SECONDS", "Locked", "LocksUnsupported", "NotPrivate", "Record", "private_dir",
           "read_regular", "replace_file"]

_COUNTER_BYTES = 32


class NotPrivate(PermissionError):
    """A directory or file that is not the job owner's alone: never used, never "fixed"."""


@dataclass(frozen=True)
class Record:
    """A record as read: its JSON object (None when absent or not one) and its generation (0 then)."""

    doc: dict[str, Any] | None
    gen: int


def private_dir(fd: int, shown: str) -> None:
    """NotPrivate unless the directory `fd` belongs to this process's user (the job's owner) and
    nobody else may write it: what another user made or can write there is never trusted."""
    problem = private_problem(os.fstat(fd), shown)
    if problem:
        raise NotPrivate(errno.EPERM, f"{problem}; spx refuses to use it (remove it, and keep it the owner's alone)")


def read_regular(dfd: int, name: str, cap: int = RECORD_MAX_BYTES) -> tuple[bytes, int] | None:
    """(content, inode) of the owner's regular file `name` in `dfd`, at most `cap` (+1) bytes; None
    if absent. A link is not followed, a FIFO never blocks, another user's file is NotPrivate."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise OSError(e.errno, f"{name} is a symbolic link") from None
        raise
    try:
        st = _owners_regular_file(fd, name)
        return os.read(fd, cap + 1), st.st_ino
    finally:
        os.close(fd)


def _owners_regular_file(fd: int, name: str) -> os.stat_result:
    """The fstat of `fd`, opened as `name`: OSError unless it is a regular file, NotPrivate unless it
    belongs to this process's user (the job's owner). A record or lock file another user made, or a
    FIFO or device in its place, is never read, locked or trusted."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise OSError(errno.EINVAL, f"{name} is not a regular file")
    if st.st_uid != os.geteuid():
        raise NotPrivate(errno.EPERM, f"{name} belongs to uid {st.st_uid}, not to the job's owner")
    return st


def replace_file(dfd: int, name: str, data: bytes) -> None:
    """`name` in `dfd` now holds `data`, whole (temp file 0600, fsync, rename, fsync of the dir)."""
    tmp = f".{os.getpid()}-{time.time_ns()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp, dir_fd=dfd)
        raise
    os.close(fd)
    os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    os.fsync(dfd)


def _record(raw: bytes | None) -> Record:
    if raw is None or len(raw) > RECORD_MAX_BYTES:
        return Record(None, 0)
    try:  # through core.bounded: deep nesting, 1e400 or 10**400 there is garbage, never an exception
        doc = bounded.parse_json(raw, "record", max_bytes=RECORD_MAX_BYTES)
    except bounded.Garbage:
        return Record(None, 0)
    if not isinstance(doc, dict):
        return Record(None, 0)
    gen = doc.get("gen")
    if isinstance(gen, int) and not isinstance(gen, bool) and 0 <= gen < MAX_GENERATION:
        return Record(doc, gen)
    return Record(doc, 0)


class Locked:
    """The exclusive flock of `lock_name` in `dfd` (the owner's lock file, made 0600 if missing)
    around one read-check-write; see the module doc. TimeoutError if another process keeps it past
    `wait` seconds, LocksUnsupported where the file system has no locks."""

    def __init__(self, dfd: int, lock_name: str, wait: float = LOCK_WAIT_SECONDS) -> None:
        self.dfd = dfd
        self.lock_name = lock_name
        self.wait = wait
        self._fd = -1
        self._counter = 0
        self._read: dict[str, Record] = {}

    def __enter__(self) -> Locked:
        fd = os.open(self.lock_name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600,
                     dir_fd=self.dfd)
        try:
            _owners_regular_file(fd, self.lock_name)
            flock_within(fd, exclusive=True, wait=self.wait, what=self.lock_name)
            text = os.pread(fd, _COUNTER_BYTES, 0).decode("ascii", "replace").strip()
            self._counter = int(text) if text.isdigit() and len(text) < 17 else 0
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self._fd)  # releases the flock
        self._fd = -1

    def read(self, name: str) -> Record:
        """The record `name` now (Record(None, 0) when absent or not a JSON object)."""
        found = read_regular(self.dfd, name)
        record = _record(found[0] if found is not None else None)
        self._read[name] = record
        return record

    def write(self, name: str, fields: dict[str, Any], *, bump: bool, floor: int = 0) -> dict[str, Any]:
        """Replace `name` (read first, in this block) with `fields` and a generation: the one read
        (`bump` False), or one more than the highest of that one, every one handed out in this
        directory, and `floor`. Returns the record written."""
        before = self._read[name]
        gen = max(before.gen, self._counter, floor) + 1 if bump else before.gen
        if gen >= MAX_GENERATION:
            raise OSError(errno.EOVERFLOW, f"{name}: generation {gen} out of range")
        doc = {**fields, "gen": gen}
        if gen > self._counter:
            self._keep_counter(gen)
        replace_file(self.dfd, name, json.dumps(doc).encode())
        self._read[name] = Record(doc, gen)
        return doc

    def remove(self, name: str) -> None:
        """`name` is gone (its generation stays counted in the lock file)."""
        before = self._read.get(name)
        if before is not None and before.gen > self._counter:
            self._keep_counter(before.gen)
        try:
            os.unlink(name, dir_fd=self.dfd)
        except FileNotFoundError:
            pass
        self._read[name] = Record(None, 0)

    def _keep_counter(self, gen: int) -> None:
        """The highest generation handed out here, in the lock file (written before the record)."""
        data = f"{gen}\n".encode()
        os.pwrite(self._fd, data, 0)
        os.ftruncate(self._fd, len(data))
        os.fsync(self._fd)
        self._counter = gen
