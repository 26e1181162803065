"""The copy engine behind `spx.daemon.staging.copier`: walk the source without following links, decide what
is already staged, and move bytes in the kernel into `NAME.spx-part` files renamed into place.
See staging.py for the contract; this file holds the mechanics."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

PART_SUFFIX = ".spx-part"
PART_XATTR = "user.spx.source"
CHUNK_BYTES = 8 << 20


class StageError(Exception):
    """Staging cannot finish; the message is the reason shown in `spx status` (names the file)."""


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


# --- planning ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class FileEntry:
    rel: str
    size: int
    mtime_ns: int
    atime_ns: int
    mode: int


@dataclass
class Plan:
    dirs: list[tuple[str, int]] = field(default_factory=list)
    files: list[FileEntry] = field(default_factory=list)
    links: list[tuple[str, str]] = field(default_factory=list)  # (rel, relative target)
    warnings: list[str] = field(default_factory=list)


def scan_tree(src: Path) -> Plan:
    """Walk SRC without following symlinks."""
    plan = Plan()
    root = os.path.realpath(src)
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        abs_dir = os.path.join(root, rel_dir)
        try:
            entries = sorted(os.scandir(abs_dir), key=lambda e: e.name)
        except OSError as e:
            raise StageError(f"cannot list {abs_dir}: {e.strerror}") from e
        for entry in entries:
            rel = os.path.join(rel_dir, entry.name)
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError as e:
                raise StageError(f"cannot stat {entry.path}: {e.strerror}") from e
            if stat.S_ISDIR(st.st_mode):
                plan.dirs.append((rel, stat.S_IMODE(st.st_mode)))
                stack.append(rel)
            elif stat.S_ISREG(st.st_mode):
                if entry.name.endswith(PART_SUFFIX):
                    plan.warnings.append(f"skipped {entry.path}: the source holds a staging part file")
                    continue
                plan.files.append(FileEntry(rel, st.st_size, st.st_mtime_ns, st.st_atime_ns, stat.S_IMODE(st.st_mode)))
            elif stat.S_ISLNK(st.st_mode):
                target, why = _link_inside(root, rel)
                if target is None:
                    plan.warnings.append(f"skipped symlink {entry.path} -> {os.readlink(entry.path)}: {why}")
                else:
                    plan.links.append((rel, target))
            else:
                plan.warnings.append(f"skipped {entry.path}: not a regular file, directory or symlink")
    plan.files.sort(key=lambda f: f.rel)
    return plan


def _link_inside(root: str, rel: str) -> tuple[str | None, str]:
    """(relative target to recreate, "") for the link at ROOT/REL, or (None, why not)."""
    resolved = os.path.realpath(os.path.join(root, rel))
    if resolved != root and not resolved.startswith(root + os.sep):
        return None, f"points outside {root}"
    if not os.path.exists(resolved):
        return None, "dangling"
    return os.path.relpath(resolved, os.path.dirname(os.path.join(root, rel))), ""


def _identity(f: FileEntry) -> bytes:
    return f"{f.size}:{f.mtime_ns}".encode()


def already_staged(dst_file: str, f: FileEntry) -> bool:
    try:
        st = os.stat(dst_file, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size == f.size and st.st_mtime_ns == f.mtime_ns


def resumable_length(part: str, f: FileEntry) -> int:
    """Bytes of PART that can be kept: all of it if it was started for this source version."""
    try:
        st = os.stat(part, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode) or st.st_size > f.size:
            return 0
        return st.st_size if os.getxattr(part, PART_XATTR) == _identity(f) else 0
    except OSError:
        return 0


def mount_point(path: str) -> str:
    path = os.path.realpath(path)
    while not os.path.ismount(path):
        path = os.path.dirname(path)
    return path


def existing_ancestor(path: Path) -> str:
    p = os.path.abspath(path)
    while not os.path.exists(p):
        p = os.path.dirname(p)
    return p


def check_space(dst: Path, need: int, statvfs: Callable[[str], os.statvfs_result]) -> None:
    where = existing_ancestor(dst)
    st = statvfs(where)
    free = st.f_bavail * st.f_frsize
    if need > free:
        raise StageError(
            f"no space on {mount_point(where)}: need {human_bytes(need)}, {human_bytes(free)} free"
        )


# --- copying ----------------------------------------------------------------------------------


class Copier:
    """Moves bytes fd→fd in the kernel, degrading once per run when a method is unsupported."""

    def __init__(self, bwlimit: int | None, on_bytes: Callable[[int], None]) -> None:
        self.method = "copy_file_range" if hasattr(os, "copy_file_range") else "sendfile"
        self.bwlimit = bwlimit
        # Under a rate limit, chunks of ~0.1 s keep the rate smooth and the progress reports regular.
        self.chunk = max(64 << 10, min(CHUNK_BYTES, bwlimit // 10)) if bwlimit else CHUNK_BYTES
        self.on_bytes = on_bytes
        self._t0 = time.monotonic()
        self._sent = 0

    def copy(self, src_fd: int, dst_fd: int, offset: int, end: int) -> None:
        while offset < end:
            count = min(self.chunk, end - offset)
            n = self._one(src_fd, dst_fd, offset, count)
            if n == 0:
                raise EOFError
            offset += n
            self.on_bytes(n)
            self._throttle(n)

    def _one(self, src_fd: int, dst_fd: int, offset: int, count: int) -> int:
        if self.method == "copy_file_range":
            try:
                return os.copy_file_range(src_fd, dst_fd, count, offset, offset)
            except OSError as e:
                if e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.EBADF):
                    raise
                self.method = "sendfile"
        if self.method == "sendfile":
            try:
                os.lseek(dst_fd, offset, os.SEEK_SET)
                return os.sendfile(dst_fd, src_fd, offset, count)
            except OSError as e:
                if e.errno not in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                    raise
                self.method = "readwrite"
        data = os.pread(src_fd, count, offset)
        return os.pwrite(dst_fd, data, offset) if data else 0

    def _throttle(self, n: int) -> None:
        if not self.bwlimit:
            return
        self._sent += n
        ahead = self._sent / self.bwlimit - (time.monotonic() - self._t0)
        if ahead > 0:
            time.sleep(ahead)


def copy_file(copier: Copier, src_file: str, dst_file: str, f: FileEntry, keep: int) -> None:
    """Copy SRC_FILE into DST_FILE.spx-part from byte KEEP, then fsync, set mode/mtime, rename."""
    part = dst_file + PART_SUFFIX
    try:
        src_fd = os.open(src_file, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise StageError(f"cannot read {src_file}: {e.strerror}") from e
    try:
        st = os.fstat(src_fd)
        if (st.st_size, st.st_mtime_ns) != (f.size, f.mtime_ns):
            raise StageError(f"{src_file} changed while staging (size or mtime); run staging again")
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | (0 if keep else os.O_TRUNC)
        try:
            dst_fd = os.open(part, flags, 0o600)
        except OSError as e:
            raise StageError(f"cannot write {part}: {e.strerror}") from e
        try:
            if not keep:
                # Without xattrs here an interrupted part is restarted, not continued.
                with contextlib.suppress(OSError):
                    os.setxattr(dst_fd, PART_XATTR, _identity(f))
            try:
                copier.copy(src_fd, dst_fd, keep, f.size)
            except EOFError:
                raise StageError(f"{src_file} shrank while staging; run staging again") from None
            except OSError as e:
                if e.errno in (errno.ENOSPC, errno.EDQUOT):
                    free = os.statvfs(os.path.dirname(part))
                    raise StageError(
                        f"no space on {mount_point(part)} while writing {dst_file}: "
                        f"{human_bytes(free.f_bavail * free.f_frsize)} free"
                    ) from e
                raise StageError(f"cannot copy {src_file} to {part}: {e.strerror}") from e
            os.fsync(dst_fd)
            os.fchmod(dst_fd, f.mode & 0o777)
            os.utime(dst_fd, ns=(f.atime_ns, f.mtime_ns))
            with contextlib.suppress(OSError):
                os.removexattr(dst_fd, PART_XATTR)
        finally:
            os.close(dst_fd)
        try:
            os.rename(part, dst_file)
        except OSError as e:
            raise StageError(f"cannot rename {part} to {dst_file}: {e.strerror}") from e
    finally:
        os.close(src_fd)


def place_link(path: str, target: str) -> None:
    try:
        if os.path.islink(path) and os.readlink(path) == target:
            return
        if os.path.lexists(path):
            if os.path.isdir(path) and not os.path.islink(path):
                raise StageError(f"cannot place symlink {path}: a directory is in the way")
            os.unlink(path)
        os.symlink(target, path)
    except OSError as e:
        raise StageError(f"cannot create symlink {path}: {e.strerror}") from e
