"""Find the jobs other hosts left on a checkpoint volume: `*/.spx/job.yaml` below a root (host loss).

The root is the admin's (`spx adopt DIR`, `adopt_checkpoint_roots`); everything below it is users'
trees and hostile, as the spool is (fsafe's rules): the walk goes from the root's fd one directory at a
time with O_NOFOLLOW (a link is never followed, a FIFO never blocks an open), at most MAX_DEPTH levels
down, MAX_ENTRIES names per directory and MAX_DIRS directories in all, and reads at most 64 KiB of a
record (4 KiB of a lease or end marker) through `fsafe`. A lease or end marker that is no lease or
end marker (job_record reads them through core.bounded) refuses its record with the reason.

Who owns a job is decided here, as for a spool file: the owner is the uid owning `job.yaml`, never
what the file says. That uid must also own `.spx/` and the checkpoint dir, neither `.spx/` nor the
record may be writable by anyone else (else another user could have written the spec the job would
run as its owner), the record must have one link, and the owner name it records must be that uid's
name on this host (a volume moved between hosts whose uids differ is refused, not guessed).
A directory holding `.spx/` is a checkpoint dir: the walk does not go below it.
"""

from __future__ import annotations

import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spx.daemon.core.bounded import Garbage
from spx.daemon.intake import job_record
from spx.daemon.intake.job_record import Record, RecordError
from spx.daemon.userfs import fsafe
from spx.daemon.userfs.fsafe import UserPathError

MAX_DEPTH = 3
MAX_ENTRIES = 10_000
MAX_DIRS = 20_000
SPX, RECORD, LEASE, STATE = ".spx", "job.yaml", "lease", "state"
RECORD_MAX_BYTES = 64 * 1024
SMALL_MAX_BYTES = job_record.SMALL_MAX_BYTES


@dataclass(frozen=True)
class Found:
    """A job record that passed every check: its checkpoint dir (as seen on this host), the record,
    its owner (from the file), what it says about its end and its lease."""

    dir: Path
    record: Record
    owner_uid: int
    owner: str
    ended: str | None
    lease: dict[str, Any] | None


@dataclass(frozen=True)
class Refused:
    dir: Path
    why: str


def scan(root: Path) -> list[Found | Refused]:
    """Every `.spx/job.yaml` up to MAX_DEPTH levels below `root` (the root itself included), each
    Found or Refused with the reason. OSError if `root` itself cannot be opened."""
    out: list[Found | Refused] = []
    top = fsafe.open_trusted_dir(root)
    todo: list[tuple[int, Path, int]] = [(top, root, 0)]
    seen = 0
    try:
        while todo:
            fd, path, depth = todo.pop()
            try:
                seen += 1
                if seen > MAX_DIRS:
                    out.append(Refused(path, f"not scanned: more than {MAX_DIRS} directories below {root}"))
                    continue
                found = _job_at(fd, path)
                if found is not None:
                    out.append(found)
                elif depth < MAX_DEPTH:
                    todo.extend(_subdirs(fd, path, depth + 1, out))
            finally:
                os.close(fd)
    finally:
        for fd, _p, _d in todo:
            os.close(fd)
    return sorted(out, key=lambda r: str(r.dir))


def _subdirs(fd: int, path: Path, depth: int, out: list[Found | Refused]) -> list[tuple[int, Path, int]]:
    """fds of the real (not linked) subdirectories of `fd` whose names do not start with '.'."""
    subs: list[tuple[int, Path, int]] = []
    try:
        with os.scandir(fd) as it:
            for n, entry in enumerate(it):
                if n >= MAX_ENTRIES:
                    out.append(Refused(path, f"only the first {MAX_ENTRIES} entries were scanned"))
                    break
                if entry.name.startswith(".") or not entry.is_dir(follow_symlinks=False):
                    continue
                try:
                    subs.append((fsafe.open_dir_at(fd, entry.name), path / entry.name, depth))
                except OSError:
                    continue  # replaced meanwhile, or not ours to enter: nothing to adopt there
    except OSError as e:
        out.append(Refused(path, f"cannot list: {e.strerror}"))
    return subs


def _job_at(fd: int, path: Path) -> Found | Refused | None:
    """The job recorded in `path` (open as `fd`); None if `path` has no `.spx`."""
    try:
        spx = fsafe.open_dir_at(fd, SPX)
    except FileNotFoundError:
        return None
    except UserPathError as e:
        return Refused(path, f"{SPX}: {e.strerror}")
    except OSError as e:
        return Refused(path, f"{SPX}: {e.strerror}")
    try:
        return _examine(fd, spx, path)
    except UserPathError as e:
        return Refused(path, e.strerror or str(e))
    except RecordError as e:
        return Refused(path, str(e))
    except Garbage as e:  # the lease or the end marker is not one: nobody can tell who runs the job
        return Refused(path, f"{e} (remove or fix it to adopt this job)")
    except OSError as e:
        return Refused(path, f"{SPX}/{RECORD}: {e.strerror or e}")
    finally:
        os.close(spx)


def _examine(fd: int, spx: int, path: Path) -> Found | Refused:
    rfd = fsafe.open_regular(spx, RECORD)  # no link, no FIFO (O_NONBLOCK), regular files only
    try:
        st = os.fstat(rfd)
        owners = {os.fstat(fd).st_uid, os.fstat(spx).st_uid}
        if owners != {st.st_uid}:
            return Refused(path, f"{SPX}/{RECORD} belongs to uid {st.st_uid}, but the directories to uid "
                                 f"{sorted(owners)}: one user must own all three")
        if st.st_nlink != 1:
            return Refused(path, f"{SPX}/{RECORD} has {st.st_nlink} hard links")
        for what, mode in ((f"{SPX}/{RECORD}", st.st_mode), (f"{SPX}/", os.fstat(spx).st_mode)):
            if mode & (stat.S_IWGRP | stat.S_IWOTH):
                return Refused(path, f"{what} is writable by others than its owner (mode {stat.S_IMODE(mode):o})")
        raw = fsafe.read_fd_capped(rfd, RECORD_MAX_BYTES, f"{SPX}/{RECORD}")
    finally:
        os.close(rfd)
    record = job_record.parse(raw)
    try:
        name = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        return Refused(path, f"{SPX}/{RECORD} belongs to uid {st.st_uid}, which has no account on this host")
    if name != record.owner:
        return Refused(path, f"the record names owner {record.owner!r}, but its file belongs to {name!r} "
                             f"(uid {st.st_uid}); the owner is the file's owner: refused")
    ended = job_record.ended_state(_small(spx, STATE), record.uid)
    lease = job_record.lease_of(_small(spx, LEASE))
    return Found(path, record, st.st_uid, name, ended, lease)


def _small(spx: int, name: str) -> bytes | None:
    """A lease or end marker, read safely; None if absent or not a small regular file."""
    try:
        return fsafe.read_at(spx, name, SMALL_MAX_BYTES)
    except OSError:
        return None
