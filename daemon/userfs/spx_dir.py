"""A job's `.spx/` directory inside its checkpoint dir: what survives the loss of the host.

    CHECKPOINT_DIR/.spx/job.yaml   the accepted spec, name, owner and the job's uid (intake/job_record.py)
    CHECKPOINT_DIR/.spx/lease      {"host", "job", "expires"}: which daemon runs the job, until when
    CHECKPOINT_DIR/.spx/state      {"job", "state", ...}: written when the job ended (never re-run it)

Runs only in `user_actions`, that is as the job's owner (the directory is in the owner's tree, so the
kernel decides what may be written there, for them). stdlib only (and core.bounded, which is too).
Every file is replaced atomically (a temporary name, fsync, rename, fsync of the directory), so a
reader on another host sees the old content or the new one, never half.

The lease is the one compare-and-swap. Every read-decide-write of it runs under an exclusive
`flock` of `.spx/lease.lock` (network file systems map it to their byte-range locks; the lock goes
with the process, so a dead daemon never leaves it held). Inside: a daemon takes a free lease by
`link`ing a complete temporary file to `lease` (fails if one is there: O_EXCL with the content
already in place), renews its own by rename, and breaks one only once it expired (renamed aside,
checked to be the very inode it judged expired, else put back), then takes it by `link` again. The
lock is what makes "break, then take" one step: without it, a third daemon that read the old lease
could move a fresh one aside between another's break and link (two holders). Where the file system
has no locks at all (ENOLCK), the link protocol alone still leaves one holder in all but that
three-way interleaving. Clocks of the hosts are assumed to agree within a small
part of the lease's length (NTP).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import stat
import time
from typing import Any

from spx.daemon.core import bounded

SPX = ".spx"
RECORD = "job.yaml"
LEASE = "lease"
LEASE_LOCK = "lease.lock"
LOCK_WAIT_SECONDS = 10.0
STATE = "state"
RECORD_MAX_BYTES = 64 * 1024
SMALL_MAX_BYTES = 4096
_UID_LINE = re.compile(rb'^uid: "([0-9a-f]{32})"$', re.M)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_spx(ckpt_dir: str, create: bool) -> int | None:
    return open_subdir(ckpt_dir, SPX, create)


def open_subdir(parent: str, name: str, create: bool) -> int | None:
    """fd of PARENT/NAME (made 0700 when `create`); None if it is not there. A link at NAME is an
    error, not followed. Also `.spx-gang` (gang_dir.py)."""
    base = os.open(parent, _DIR_FLAGS)
    try:
        return open_subdir_at(base, name, create, parent)
    finally:
        os.close(base)


def open_subdir_at(base: int, name: str, create: bool, shown: str = ".") -> int | None:
    """`open_subdir` below the directory fd `base` (`shown`: its path, for errors)."""
    if create:
        try:
            os.mkdir(name, 0o700, dir_fd=base)
        except FileExistsError:
            pass
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=base)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise OSError(e.errno, f"{shown}/{name} is a symbolic link or not a directory") from e
        raise


def read_small(dfd: int, name: str, cap: int = SMALL_MAX_BYTES) -> bytes | None:
    """The regular file `name` (at most `cap` bytes), None if absent."""
    found = _read(dfd, name, cap)
    return found[0][:cap] if found is not None else None


def _read(dfd: int, name: str, cap: int) -> tuple[bytes, int] | None:
    """(content, inode) of the regular file `name`, at most `cap` bytes; None if absent."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, f"{SPX}/{name} is not a regular file")
        return os.read(fd, cap + 1)[:cap + 1], st.st_ino
    finally:
        os.close(fd)


def _write_tmp(dfd: int, data: bytes, mode: int = 0o600) -> str:
    tmp = f".{os.getpid()}-{time.time_ns()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dfd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    return tmp


def replace_file(dfd: int, name: str, data: bytes) -> None:
    """`name` in `dfd` now holds `data`, whole (temp file, fsync, rename, fsync of the dir)."""
    _replace(dfd, name, data)


def _replace(dfd: int, name: str, data: bytes) -> None:
    tmp = _write_tmp(dfd, data)
    os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    os.fsync(dfd)


def _unlink(dfd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dfd)
    except FileNotFoundError:
        pass


def _lease_doc(raw: bytes) -> dict[str, Any] | None:
    """A lease's content, or None when it is not one (treated as expired: a lease is written whole,
    so garbage there is nobody's). Read through core.bounded: `expires` is a time in range (1e300
    or 10**400 there is garbage, never an OverflowError here or in the daemon that gets it back)."""
    try:
        f = bounded.Fields(bounded.parse_json(raw, "lease", max_bytes=SMALL_MAX_BYTES), "lease")
        f.text("host", 4096)
        f.real("expires", 0.0, bounded.MAX_TIME)
    except bounded.Garbage:
        return None
    return f.doc


class DirLock:
    """The exclusive `flock` of the lock file `name` in `dfd` around one read-decide-write (the
    lease's take/renew/break: see the module docstring; gang_dir's generation). Waits up to
    LOCK_WAIT_SECONDS (another daemon holds it for milliseconds), then raises TimeoutError; on a
    file system without locks it lets the caller go on unlocked."""

    def __init__(self, dfd: int, name: str = LEASE_LOCK) -> None:
        self.dfd = dfd
        self.name = name
        self.fd = -1

    def __enter__(self) -> DirLock:
        self.fd = os.open(self.name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600, dir_fd=self.dfd)
        try:
            if not stat.S_ISREG(os.fstat(self.fd).st_mode):
                raise OSError(errno.EINVAL, f"{self.name} is not a regular file")
            deadline = time.monotonic() + LOCK_WAIT_SECONDS
            while True:
                try:
                    fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return self
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{self.name} held by another daemon for over {LOCK_WAIT_SECONDS:.0f} s") from None
                    time.sleep(0.01)
                except OSError as e:
                    if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP):
                        return self
                    raise
        except BaseException:
            os.close(self.fd)
            raise

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)  # releases the flock


def take_lease(dfd: int, mine: dict[str, Any], now: float) -> dict[str, Any] | None:
    """Take or renew the lease in `.spx` for `mine["host"]`. None when held now; else the valid
    lease of another host, which keeps it."""
    with DirLock(dfd):
        return _take_locked(dfd, mine, now)


def _take_locked(dfd: int, mine: dict[str, Any], now: float) -> dict[str, Any] | None:
    data = json.dumps(mine).encode()
    other: dict[str, Any] | None = None
    for _ in range(4):
        tmp = _write_tmp(dfd, data)
        try:
            try:
                os.link(tmp, LEASE, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
                os.fsync(dfd)
                return None
            except FileExistsError:
                pass
            found = _read(dfd, LEASE, SMALL_MAX_BYTES)
            if found is None:
                continue
            raw, ino = found
            other = _lease_doc(raw)
            if other is not None and other["host"] == mine["host"]:
                os.rename(tmp, LEASE, src_dir_fd=dfd, dst_dir_fd=dfd)  # our own: renewed in place
                os.fsync(dfd)
                return None
            if other is not None and float(other["expires"]) > now:
                return other
            _break(dfd, ino)
        finally:
            _unlink(dfd, tmp)
    return other or {"host": "(unknown)", "expires": now, "job": None}


def _break(dfd: int, ino: int) -> None:
    """Move the expired lease (inode `ino`) out of the way; a fresh one that replaced it meanwhile
    is put back."""
    aside = f".lease-expired-{os.getpid()}-{time.time_ns()}"
    try:
        os.rename(LEASE, aside, src_dir_fd=dfd, dst_dir_fd=dfd)
    except FileNotFoundError:
        return
    try:
        if os.stat(aside, dir_fd=dfd, follow_symlinks=False).st_ino != ino:
            try:
                os.link(aside, LEASE, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
            except FileExistsError:
                pass
    finally:
        _unlink(dfd, aside)


def record_uid(dfd: int) -> str | None:
    """The job uid of `.spx/job.yaml`, None if there is none (or it is unreadable)."""
    try:
        found = _read(dfd, RECORD, RECORD_MAX_BYTES)
    except OSError:
        return None
    if found is None:
        return None
    m = _UID_LINE.search(found[0])
    return m.group(1).decode() if m else None


def publish(args: dict[str, Any]) -> dict[str, Any]:
    """At a job's preparation: take its lease, then write `.spx/job.yaml` (args: dir, record, lease,
    now). {"held": true} or {"held": false, "holder": <the other host's lease>} (nothing written)."""
    dfd = _open_spx(args["dir"], create=True)
    assert dfd is not None
    try:
        other = take_lease(dfd, args["lease"], float(args["now"]))
        if other is not None:
            return {"held": False, "holder": other}
        _replace(dfd, RECORD, str(args["record"]).encode())
        return {"held": True}
    finally:
        os.close(dfd)


def renew(args: dict[str, Any]) -> list[dict[str, Any]]:
    """For each {"dir", "lease"} in args["jobs"]: renew the lease where `.spx/job.yaml` names this
    job (a job not prepared yet has none: nothing to do). One answer per job: "held", "absent",
    "other" (with the holder) or "error" (with why)."""
    out: list[dict[str, Any]] = []
    now = float(args["now"])
    for job in args["jobs"]:
        try:
            dfd = _open_spx(job["dir"], create=False)
        except OSError as e:
            out.append({"result": "error", "error": str(e)})
            continue
        if dfd is None:
            out.append({"result": "absent"})
            continue
        try:
            if record_uid(dfd) != job["lease"]["job"]:
                out.append({"result": "absent"})
                continue
            other = take_lease(dfd, job["lease"], now)
            out.append({"result": "held"} if other is None else {"result": "other", "holder": other})
        except OSError as e:
            out.append({"result": "error", "error": str(e)})
        finally:
            os.close(dfd)
    return out


def mark_ended(args: dict[str, Any]) -> list[str]:
    """For each {"dir", "host", "state": {...}} in args["jobs"]: write `.spx/state` where
    `.spx/job.yaml` names that job and no other host holds a valid lease, then give the lease up.
    One word per job: "written", "absent" (no record of that job there), "other" (another host runs
    it now) or "error: …"."""
    out: list[str] = []
    now = float(args["now"])
    for job in args["jobs"]:
        try:
            dfd = _open_spx(job["dir"], create=False)
        except OSError as e:
            out.append(f"error: {e}")
            continue
        if dfd is None:
            out.append("absent")
            continue
        try:
            if record_uid(dfd) != job["state"]["job"]:
                out.append("absent")
                continue
            with DirLock(dfd):
                found = _read(dfd, LEASE, SMALL_MAX_BYTES)
                lease = _lease_doc(found[0]) if found else None
                if lease is not None and lease["host"] != job["host"] and float(lease["expires"]) > now:
                    out.append("other")
                    continue
                _replace(dfd, STATE, json.dumps(job["state"]).encode())
                if lease is not None and lease["host"] == job["host"]:
                    _unlink(dfd, LEASE)
            out.append("written")
        except OSError as e:
            out.append(f"error: {e}")
        finally:
            os.close(dfd)
    return out


def claim(args: dict[str, Any]) -> dict[str, Any]:
    """At adoption: take the lease of the job recorded in `dir` (args: dir, lease, now), only if
    `.spx/job.yaml` still names it. {"held": bool, "holder"?: lease, "why"?: text}."""
    dfd = _open_spx(args["dir"], create=False)
    if dfd is None:
        return {"held": False, "why": f"{args['dir']}/{SPX} is gone"}
    try:
        if record_uid(dfd) != args["lease"]["job"]:
            return {"held": False, "why": f"{args['dir']}/{SPX}/{RECORD} changed meanwhile"}
        other = take_lease(dfd, args["lease"], float(args["now"]))
        return {"held": True} if other is None else {"held": False, "holder": other}
    finally:
        os.close(dfd)
