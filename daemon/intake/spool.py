"""Spool intake: notice dropped job files at once, and claim them safely (a user wrote them).

The inotify handler (watchdog, on its own thread) only records names and wakes the main loop; the
main loop claims. A rescan at start-up and every few seconds is the backstop, because inotify queues
overflow: the directory listing is the truth. A file is taken on close-write or moved-to, never on
create (the writer may not be done).

Claiming treats the file as hostile: it is opened relative to the spool's directory fd with
O_NOFOLLOW|O_NONBLOCK (no symlink games, no blocking on a FIFO), and `fstat` on that fd decides —
regular file, one hard link, at most 64 KiB, an allowed owner. The owner's uid from `fstat` is the
job's identity. Accepted content is copied into the root-only state dir; rejected files move to
`rejected/` with a `NAME.error` saying what is wrong.

`rejected/` lives in a directory every submitter can write, so it is trusted only as `fsafe` trusts
a directory: root-owned, 0711, made by the daemon (whatever a user put at that name first is moved
aside). Error files are created in it by fd with O_EXCL|O_NOFOLLOW and handed to the submitter
(0600, fchown on the fd); a rejected spec is made 0600 on its fd before it moves (it may hold
secrets in `env`), and a rejected hard link is dropped, never published. Names are kept within
NAME_MAX (a long one is cut and given a hash).
"""

from __future__ import annotations

import errno
import grp
import hashlib
import os
import pwd
import queue
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from watchdog.events import FileClosedEvent, FileMovedEvent, FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from spx.daemon.core.log import get_logger
from spx.daemon.core.spec import MAX_SPEC_BYTES, JobSpec, SpecError, parse_spec
from spx.daemon.userfs import fsafe

log = get_logger()

IGNORED_SUFFIXES = ("~", ".tmp", ".swp", ".part")
REJECTED = "rejected"
# A file found only by the rescan (no close event seen) must be this old, so a writer that is still
# writing is not claimed half-way.
RESCAN_MIN_AGE_SECONDS = 2.0
REJECTED_MODE = 0o711  # submitters open their own NAME.error by name; nobody lists the directory
NAME_MAX = 255
ERROR_SUFFIX = ".error"


def ignored(name: str) -> bool:
    return not name or name.startswith(".") or name.endswith(IGNORED_SUFFIXES) or name == REJECTED


def fit_name(name: str, suffix: str = "") -> str:
    """`name + suffix`, cut to NAME_MAX bytes with a hash of the full name kept, so two long names
    never collide and no rename or create fails with ENAMETOOLONG."""
    full = name + suffix
    if len(os.fsencode(full)) <= NAME_MAX:
        return full
    digest = hashlib.sha256(os.fsencode(name)).hexdigest()[:16]
    keep = NAME_MAX - len(os.fsencode(suffix)) - len(digest) - 1
    head = os.fsencode(name)[:keep].decode("utf-8", "ignore")
    return f"{head}-{digest}{suffix}"


def error_file_name(rejected_name: str) -> str:
    """The name of the `.error` file written next to `rejected_name` in rejected/."""
    return fit_name(rejected_name, ERROR_SUFFIX)


@dataclass(frozen=True)
class Claimed:
    """A spool entry that passed the checks on its fd: its text (not parsed yet: parsing is up to
    64 KiB of YAML, which is done off the loop) and what identifies the file it was read from."""

    name: str
    text: str
    owner_uid: int
    owner: str
    identity: tuple[int, int, int, int]  # (st_dev, st_ino, st_size, st_mtime_ns) when it was read


@dataclass(frozen=True)
class Accepted:
    name: str
    spec: JobSpec
    text: str
    owner_uid: int
    owner: str
    identity: tuple[int, int, int, int]


@dataclass(frozen=True)
class Rejected:
    name: str
    reason: str
    owner_uid: int | None


def parse_claimed(claimed: Claimed) -> Accepted | Rejected:
    """The claimed text as a job spec, or the entry rejected with the parser's words (pure CPU:
    up to 64 KiB of YAML, so it runs off the main loop)."""
    try:
        spec = parse_spec(claimed.text)
    except SpecError as e:
        return Rejected(claimed.name, e.render(claimed.name), claimed.owner_uid)
    return Accepted(claimed.name, spec, claimed.text, claimed.owner_uid, claimed.owner, claimed.identity)


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
        if self._observer.is_alive():  # a daemon that could not start never started it
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
        self._dir_fd = os.open(spool_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        os.close(self._rejected_fd())

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

    def owner_of(self, name: str) -> int | None:
        """The uid owning spool entry `name` (not following a link), or None if it is gone."""
        try:
            return os.stat(name, dir_fd=self._dir_fd, follow_symlinks=False).st_uid
        except OSError:
            return None

    def unchanged(self, claimed: Claimed) -> bool:
        """Is the entry still the file `claimed` was read from, unmodified? (Checked before it is
        taken out of the spool: a user who rewrote it meanwhile gets the new file claimed anew.)"""
        try:
            st = os.stat(claimed.name, dir_fd=self._dir_fd, follow_symlinks=False)
        except OSError:
            return False
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) == claimed.identity

    def claim(self, name: str) -> Claimed | Rejected | None:
        """Check one entry on its fd and read it. None if it vanished (already claimed, or taken
        back by its writer)."""
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
        return Claimed(name, text, st.st_uid, pwd.getpwuid(st.st_uid).pw_name,
                       (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))

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

    def _rejected_fd(self) -> int:
        """fd of rejected/, verified (or re-made) root-owned on every use."""
        return fsafe.ensure_root_dir_at(self._dir_fd, REJECTED, REJECTED_MODE)

    def reject(self, rejected: Rejected) -> Path | None:
        """Move the entry to rejected/ (never following a link) and write NAME.error next to it,
        readable by the submitter only. The error file appears complete (written under a temporary
        name, then linked in, never replacing anything), so `spx submit` never reads half of it.
        Returns the error file; None if it could not be written (logged: a reject never raises, it
        is the daemon's last word on a bad file)."""
        try:
            self._protect(rejected.name)
            rfd = self._rejected_fd()
        except OSError as e:
            log.error("reject_failed", spool_file=rejected.name, error=str(e))
            return None
        tmp = f".error-{time.time_ns()}-{os.getpid()}"
        try:
            efd = fsafe.create_excl(rfd, tmp, 0o600)
            try:
                stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                fsafe.write_all(efd, f"{rejected.name}: rejected {stamp}\n{rejected.reason}\n".encode("utf-8", "replace"))
                if rejected.owner_uid is not None:
                    os.fchown(efd, rejected.owner_uid, -1)
            finally:
                os.close(efd)
            target = self._free_slot(rfd, rejected.name)
            try:
                os.rename(rejected.name, target, src_dir_fd=self._dir_fd, dst_dir_fd=rfd)
            except FileNotFoundError:
                pass
            self._drop_hard_link(rfd, target)
            os.link(tmp, error_file_name(target), src_dir_fd=rfd, dst_dir_fd=rfd, follow_symlinks=False)
            return self.rejected_dir / error_file_name(target)
        except OSError as e:
            log.error("reject_failed", spool_file=rejected.name, error=str(e))
            return None
        finally:
            try:
                os.unlink(tmp, dir_fd=rfd)
            except FileNotFoundError:
                pass
            os.close(rfd)

    def _protect(self, name: str) -> None:
        """Before the move: a rejected regular file of one link becomes 0600 on its fd (rejected/ is
        traversable by all, and the spec may hold secrets). Links, FIFOs and the like are left as
        they are (they are not opened beyond this check)."""
        try:
            fd = fsafe.open_regular(self._dir_fd, name)
        except OSError:
            return
        try:
            if os.fstat(fd).st_nlink == 1:
                os.fchmod(fd, 0o600)
        finally:
            os.close(fd)

    def _drop_hard_link(self, rfd: int, target: str) -> None:
        """A regular file with more than one link names content that may not be the submitter's to
        publish: the moved link is removed (the other names are untouched)."""
        try:
            st = os.stat(target, dir_fd=rfd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
            os.unlink(target, dir_fd=rfd)

    def _free_slot(self, rfd: int, name: str) -> str:
        """A name in rejected/ free for the entry and for its error file (only root writes there)."""
        for n in range(10_000):
            target = fit_name(name) if n == 0 else fit_name(name, f".{n}")
            if not fsafe.lexists_at(rfd, target) and not fsafe.lexists_at(rfd, error_file_name(target)):
                return target
        raise fsafe.UserPathError(errno.EEXIST, f"no free name in {self.rejected_dir} for {name}")
