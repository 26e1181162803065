"""Spool intake: notice dropped job files at once, and claim them safely (design §4, §9).

The inotify handler (watchdog, on its own thread) only records names and wakes the main loop; the
main loop claims. A rescan at start-up and every few seconds is the backstop, because inotify queues
overflow: the directory listing is the truth. A file is taken on close-write or moved-to, never on
create (the writer may not be done).

Claiming treats the file as hostile: it is opened relative to the spool's directory fd with
O_NOFOLLOW|O_NONBLOCK (no symlink games, no blocking on a FIFO), and `fstat` on that fd decides —
regular file, one hard link, at most 64 KiB, an allowed owner. The owner's uid from `fstat` is the
job's identity. Accepted content is copied into the root-only state dir; rejected files move to
`rejected/` with a `NAME.error` saying what is wrong.
"""

from __future__ import annotations

import errno
import grp
import os
import pwd
import queue
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from watchdog.events import FileClosedEvent, FileMovedEvent, FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from spx.daemon.intake.spec import MAX_SPEC_BYTES, JobSpec, SpecError, parse_spec

IGNORED_SUFFIXES = ("~", ".tmp", ".swp", ".part")
REJECTED = "rejected"
# A file found only by the rescan (no close event seen) must be this old, so a writer that is still
# writing is not claimed half-way.
RESCAN_MIN_AGE_SECONDS = 2.0


def ignored(name: str) -> bool:
    return not name or name.startswith(".") or name.endswith(IGNORED_SUFFIXES) or name == REJECTED


@dataclass(frozen=True)
class Accepted:
    name: str
    spec: JobSpec
    text: str
    owner_uid: int
    owner: str


@dataclass(frozen=True)
class Rejected:
    name: str
    reason: str
    owner_uid: int | None


class _Handler(FileSystemEventHandler):
    """Maps events to names on the queue; nothing else (all handlers share one thread)."""

    def __init__(self, names: queue.SimpleQueue[str], wake: queue.SimpleQueue[object]):
        self._names = names
        self._wake = wake

    def _put(self, path: str | bytes) -> None:
        name = os.path.basename(os.fsdecode(path))
        if not ignored(name):
            self._names.put(name)
            self._wake.put("spool")

    def on_closed(self, event: FileSystemEvent) -> None:
        if isinstance(event, FileClosedEvent):
            self._put(event.src_path)

    def on_moved(self, event: FileSystemEvent) -> None:
        if isinstance(event, FileMovedEvent):
            self._put(event.dest_path)


class SpoolWatcher:
    """The inotify observer plus the rescan; yields names for the main loop to claim."""

    def __init__(self, spool_dir: Path, wake: queue.SimpleQueue[object], rescan_seconds: float):
        self.spool_dir = spool_dir
        self.rescan_seconds = rescan_seconds
        self._names: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._observer = Observer()
        self._observer.schedule(_Handler(self._names, wake), str(spool_dir), recursive=False)
        self._next_rescan = 0.0

    def start(self) -> None:
        self._observer.start()

    def stop(self) -> None:
        self._observer.stop()
        self._observer.join(timeout=5)

    def due_names(self, now_mono: float) -> list[str]:
        """Names announced by inotify, plus, when a rescan is due, every old-enough name listed."""
        names: dict[str, None] = {}
        while True:
            try:
                names[self._names.get_nowait()] = None
            except queue.Empty:
                break
        if now_mono >= self._next_rescan:
            self._next_rescan = now_mono + self.rescan_seconds
            wall = time.time()
            try:
                for entry in os.scandir(self.spool_dir):
                    if ignored(entry.name):
                        continue
                    try:
                        if wall - entry.stat(follow_symlinks=False).st_mtime >= RESCAN_MIN_AGE_SECONDS:
                            names[entry.name] = None
                    except FileNotFoundError:
                        continue
            except OSError:
                pass
        return list(names)


class SpoolClaimer:
    """Opens, checks and moves one spool entry. Holds the spool's directory fd."""

    def __init__(self, spool_dir: Path, submit_group: str | None):
        self.spool_dir = spool_dir
        self.rejected_dir = spool_dir / REJECTED
        self.submit_group = submit_group
        self._dir_fd = os.open(spool_dir, os.O_RDONLY | os.O_DIRECTORY)

    def close(self) -> None:
        os.close(self._dir_fd)

    def owner_allowed(self, uid: int) -> str | None:
        """None if `uid` may submit, else why not."""
        try:
            user = pwd.getpwuid(uid)
        except KeyError:
            return f"owner uid {uid} has no account on this host"
        if uid == 0 or self.submit_group is None:
            return None
        try:
            group = grp.getgrnam(self.submit_group)
        except KeyError:
            return f"submit_group {self.submit_group!r} does not exist; nobody but root may submit"
        if user.pw_gid == group.gr_gid or user.pw_name in group.gr_mem:
            return None
        return f"user {user.pw_name} is not in group {self.submit_group!r}, which may submit jobs"

    def claim(self, name: str) -> Accepted | Rejected | None:
        """Check one entry. None if it vanished (already claimed, or taken back by its writer)."""
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=self._dir_fd)
        except FileNotFoundError:
            return None
        except OSError as e:
            if e.errno == errno.ELOOP:
                return self._owner_of_link(name, "is a symbolic link; drop the file itself")
            if e.errno == errno.EISDIR:
                return self._owner_of_link(name, "is a directory, not a job file")
            return Rejected(name, f"cannot be opened: {e.strerror}", None)
        try:
            st = os.fstat(fd)
            problem = self._check_stat(st)
            if problem:
                return Rejected(name, problem, st.st_uid)
            data = os.read(fd, MAX_SPEC_BYTES + 1)
        finally:
            os.close(fd)
        if len(data) > MAX_SPEC_BYTES:
            return Rejected(name, f"is larger than {MAX_SPEC_BYTES // 1024} KiB", st.st_uid)
        problem = self.owner_allowed(st.st_uid)
        if problem:
            return Rejected(name, problem, st.st_uid)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return Rejected(name, "is not UTF-8 text", st.st_uid)
        try:
            spec = parse_spec(text)
        except SpecError as e:
            return Rejected(name, e.render(name), st.st_uid)
        return Accepted(name, spec, text, st.st_uid, pwd.getpwuid(st.st_uid).pw_name)

    def _owner_of_link(self, name: str, why: str) -> Rejected:
        try:
            uid = os.stat(name, dir_fd=self._dir_fd, follow_symlinks=False).st_uid
        except OSError:
            uid = None
        return Rejected(name, why, uid)

    @staticmethod
    def _check_stat(st: os.stat_result) -> str | None:
        if stat.S_ISFIFO(st.st_mode):
            return "is a FIFO, not a regular file"
        if not stat.S_ISREG(st.st_mode):
            return "is not a regular file"
        if st.st_nlink != 1:
            return f"has {st.st_nlink} hard links; drop a file with exactly one"
        if st.st_size > MAX_SPEC_BYTES:
            return f"is larger than {MAX_SPEC_BYTES // 1024} KiB ({st.st_size} bytes)"
        return None

    def remove(self, name: str) -> None:
        """Take an accepted file out of the spool (its content was already copied)."""
        try:
            os.unlink(name, dir_fd=self._dir_fd)
        except FileNotFoundError:
            pass

    def reject(self, rejected: Rejected) -> Path:
        """Move the entry to rejected/ (never following a link) and write NAME.error next to it,
        readable by the submitter."""
        self.rejected_dir.mkdir(mode=0o711, exist_ok=True)
        target = self._free_name(rejected.name)
        try:
            os.rename(rejected.name, target, src_dir_fd=self._dir_fd)
        except FileNotFoundError:
            pass
        error_file = target.with_name(target.name + ".error")
        error_file.write_text(
            f"{rejected.name}: rejected {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n{rejected.reason}\n"
        )
        if rejected.owner_uid is not None:
            os.chown(error_file, rejected.owner_uid, -1)
        return error_file

    def _free_name(self, name: str) -> Path:
        target = self.rejected_dir / name
        n = 1
        while target.exists() or target.is_symlink() or target.with_name(target.name + ".error").exists():
            target = self.rejected_dir / f"{name}.{n}"
            n += 1
        return target
