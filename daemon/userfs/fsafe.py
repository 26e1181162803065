"""Root's only way into a directory a user can write: fd-relative, never following a link, capped.

The daemon runs as root; every path inside a spool, log, run, checkpoint, staging or work directory
may have been swapped by a user for a symlink, a FIFO, a huge file or a hard link to a root-only
file, at any moment. The rules here (docs/security.md, "What root does with user paths, and how"):

- walk from a trusted directory fd (a directory the daemon's config names, opened normally), one
  component at a time with `O_NOFOLLOW|O_DIRECTORY`: no component below the trusted base is a link;
- open files `O_NOFOLLOW|O_NONBLOCK` (a FIFO never blocks the open) and decide on `fstat` of that fd:
  regular files only; reads are capped;
- create with `O_EXCL` (a planted name fails the create instead of being written through), set mode
  and owner with `fchmod`/`fchown` on the fd, never on a path;
- a directory the daemon relies on (`spool/rejected`, `log/NAME`, `run/jobs`) is trusted only if it is
  a real directory owned by the daemon's own uid and writable by nobody else; anything else found at
  its name (a link, a file, a directory a user made first) is renamed aside and a fresh one created.

Every failure is an `OSError`; the ones that mean "this path is not what root may touch" are
`UserPathError`, with a message fit for `spx status`.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import time
from pathlib import Path

from spx.daemon.core.log import get_logger

log = get_logger()

_OPEN_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
SMALL_FILE_BYTES = 64 * 1024


class UserPathError(OSError):
    """A path under a user's control is not what root may use (a link, not a regular file, too
    large, someone else's, or the user cannot reach it). The message says which and why."""


def _check_name(name: str) -> None:
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise UserPathError(errno.EINVAL, f"not a single path component: {name!r}")


# --- directories -------------------------------------------------------------------------------


def open_trusted_dir(path: Path) -> int:
    """An fd of a directory the daemon's configuration names (followed normally: the admin chose
    it). Everything below it is walked with `walk`/`open_dir_at`."""
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def open_dir_at(dir_fd: int, name: str) -> int:
    """fd of the directory `name` in `dir_fd`; ELOOP/ENOTDIR (as UserPathError) if it is a link or
    not a directory."""
    _check_name(name)
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UserPathError(e.errno, f"{name} is a symbolic link or not a directory") from e
        raise


def walk(base: Path, rel: str | Path) -> int:
    """fd of `base/rel`, with `base` trusted and every component of `rel` opened O_NOFOLLOW."""
    parts = Path(rel).parts
    if Path(rel).is_absolute() or ".." in parts:
        raise UserPathError(errno.EINVAL, f"{rel} is not a relative path below {base}")
    fd = open_trusted_dir(base)
    try:
        for part in parts:
            nfd = open_dir_at(fd, part)
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def split_below(path: Path, base: Path) -> str:
    """`path` relative to `base` (a ValueError, as UserPathError, if it is not below it)."""
    try:
        return str(path.relative_to(base))
    except ValueError as e:
        raise UserPathError(errno.EINVAL, f"{path} is not below {base}") from e


def _trusted_dir(st: os.stat_result) -> bool:
    return (stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()
            and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def move_aside(dir_fd: int, name: str) -> str:
    """Rename `name` in `dir_fd` to `.NAME.untrusted-<ns>` (a dotfile: the spool ignores it), so a
    fresh entry can be made; returns the new name. The entry itself is never opened."""
    aside = f".{name}.untrusted-{time.time_ns()}"
    os.rename(name, aside, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    log.warning("untrusted_entry_moved_aside", name=name, moved_to=aside)
    return aside


def ensure_root_dir_at(dir_fd: int, name: str, mode: int) -> int:
    """fd of `name` in `dir_fd`, a directory owned by the daemon's uid with `mode` and writable by no
    one else. Created if missing; anything else found there is moved aside first (a user who made
    it, or a link, must not decide what root writes into). The fd is what callers use: the
    directory checked is the one written."""
    _check_name(name)
    for _ in range(5):
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            try:
                os.mkdir(name, mode, dir_fd=dir_fd)
            except FileExistsError:
                continue
        else:
            if not _trusted_dir(st):
                move_aside(dir_fd, name)
                continue
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT):
                continue
            raise
        if not _trusted_dir(os.fstat(fd)):
            os.close(fd)
            move_aside(dir_fd, name)
            continue
        if stat.S_IMODE(os.fstat(fd).st_mode) != mode:
            os.fchmod(fd, mode)
        return fd
    raise UserPathError(errno.EAGAIN, f"{name}: keeps being replaced; cannot make a trusted directory")


def open_root_dir(path: Path, mode: int) -> int:
    """`ensure_root_dir_at` for `path`, whose parent is trusted (a configured directory)."""
    parent = open_trusted_dir(path.parent)
    try:
        return ensure_root_dir_at(parent, path.name, mode)
    finally:
        os.close(parent)


def ensure_root_dir(path: Path, mode: int) -> None:
    """Make `path` a trusted root-owned directory (see `ensure_root_dir_at`)."""
    os.close(open_root_dir(path, mode))


def remove_tree_at(dir_fd: int, name: str) -> bool:
    """Delete the directory `name` in `dir_fd` (a directory only root can write) and all below it,
    fd-relative and never following a link (shutil.rmtree's symlink-attack-safe walk). False if it
    was not there."""
    _check_name(name)
    if not shutil.rmtree.avoids_symlink_attacks:
        raise UserPathError(errno.ENOTSUP, "this platform's rmtree follows links; not removing as root")
    try:
        shutil.rmtree(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True


def ensure_owned_dir_at(dir_fd: int, name: str, mode: int, uid: int, gid: int) -> int:
    """fd of `name` in `dir_fd` (a directory only root can write), handed to `uid`: created by root
    and given away with fchown on its fd. An existing entry is kept only if it is a real directory
    (root made it earlier in this trusted parent); anything else is moved aside."""
    _check_name(name)
    for _ in range(5):
        try:
            os.mkdir(name, mode, dir_fd=dir_fd)
        except FileExistsError:
            pass
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                move_aside(dir_fd, name)
                continue
            if e.errno == errno.ENOENT:
                continue
            raise
        st = os.fstat(fd)
        if st.st_uid not in (uid, os.geteuid()):
            os.close(fd)
            move_aside(dir_fd, name)
            continue
        os.fchown(fd, uid, gid)
        os.fchmod(fd, mode)
        return fd
    raise UserPathError(errno.EAGAIN, f"{name}: keeps being replaced; cannot make the directory")


# --- files -------------------------------------------------------------------------------------


def lexists_at(dir_fd: int, name: str) -> bool:
    """Whether `name` is an entry of the directory (a link counts as itself, never followed)."""
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False


def chmod_socket_at(dir_fd: int, name: str, mode: int) -> None:
    """chmod the Unix socket `name` in `dir_fd` without following a link: Linux has no lchmod, so
    the entry is opened O_PATH|O_NOFOLLOW, checked to be a socket, and changed through its fd's
    /proc path (a link there is refused, never followed)."""
    _check_name(name)
    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            raise UserPathError(errno.EINVAL, f"{name}: not a socket")
        os.chmod(f"/proc/self/fd/{fd}", mode)
    finally:
        os.close(fd)


def open_regular(dir_fd: int, name: str, flags: int = os.O_RDONLY) -> int:
    """Open `name` in `dir_fd` without following a link or blocking on a FIFO; regular files only."""
    _check_name(name)
    try:
        fd = os.open(name, flags | _OPEN_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UserPathError(e.errno, f"{name} is a symbolic link") from e
        if e.errno == errno.ENXIO:
            raise UserPathError(e.errno, f"{name} is a FIFO or socket, not a regular file") from e
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UserPathError(errno.EINVAL, f"{name} is not a regular file")
    return fd


def read_fd_capped(fd: int, cap: int, name: str = "file") -> bytes:
    """All of an open regular file, or UserPathError(EFBIG) if it holds more than `cap` bytes."""
    if os.fstat(fd).st_size > cap:
        raise UserPathError(errno.EFBIG, f"{name} is larger than {cap} bytes")
    chunks: list[bytes] = []
    size = 0
    while size <= cap:
        chunk = os.read(fd, cap + 1 - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    if size > cap:
        raise UserPathError(errno.EFBIG, f"{name} is larger than {cap} bytes")
    return b"".join(chunks)


def read_at(dir_fd: int, name: str, cap: int = SMALL_FILE_BYTES) -> bytes:
    """Content of the regular file `name` in `dir_fd`, at most `cap` bytes (else UserPathError)."""
    fd = open_regular(dir_fd, name)
    try:
        return read_fd_capped(fd, cap, name)
    finally:
        os.close(fd)


def read_file(path: Path, base: Path, cap: int = SMALL_FILE_BYTES) -> bytes:
    """Content of `path`, walked from the trusted `base` without following any link below it."""
    rel = Path(split_below(path, base))
    dir_fd = walk(base, rel.parent)
    try:
        return read_at(dir_fd, rel.name, cap)
    finally:
        os.close(dir_fd)


def read_tail(path: Path, base: Path, max_bytes: int) -> bytes:
    """The last `max_bytes` of the regular file `path` (walked from `base` as `read_file`)."""
    rel = Path(split_below(path, base))
    dir_fd = walk(base, rel.parent)
    try:
        fd = open_regular(dir_fd, rel.name)
    finally:
        os.close(dir_fd)
    try:
        size = os.fstat(fd).st_size
        os.lseek(fd, max(0, size - max_bytes), os.SEEK_SET)
        return read_fd_capped_tail(fd, max_bytes)
    finally:
        os.close(fd)


def read_fd_capped_tail(fd: int, max_bytes: int) -> bytes:
    """Read from the current offset, at most `max_bytes` (a file still growing is cut, not raised)."""
    chunks: list[bytes] = []
    size = 0
    while size < max_bytes:
        chunk = os.read(fd, max_bytes - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def create_excl(dir_fd: int, name: str, mode: int, uid: int = -1, gid: int = -1, extra_flags: int = 0) -> int:
    """A new file `name` in `dir_fd` (O_EXCL: whatever was planted at the name makes this fail, it
    is never written through), its mode and owner set on the fd. Returns the write fd."""
    _check_name(name)
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _OPEN_FLAGS | extra_flags, mode, dir_fd=dir_fd)
    try:
        os.fchmod(fd, mode)
        if uid != -1 or gid != -1:
            os.fchown(fd, uid, gid)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_append(dir_fd: int, name: str, mode: int, uid: int = -1, gid: int = -1) -> int:
    """A write fd (O_APPEND) on `name` in `dir_fd`: created as by `create_excl`, or an existing
    regular file with one link owned by `uid` or the daemon (never a link, FIFO or someone else's),
    given `mode`, `uid` and `gid` on its fd if it had others (a file from before a change of them)."""
    try:
        return create_excl(dir_fd, name, mode, uid, gid, os.O_APPEND)
    except FileExistsError:
        pass
    fd = open_regular(dir_fd, name, os.O_WRONLY | os.O_APPEND)
    try:
        st = os.fstat(fd)
        if st.st_nlink != 1 or st.st_uid not in (uid, os.geteuid()):
            raise UserPathError(errno.EPERM, f"{name} has {st.st_nlink} links or belongs to uid {st.st_uid}")
        if stat.S_IMODE(st.st_mode) != mode:
            os.fchmod(fd, mode)
        if (uid != -1 and st.st_uid != uid) or (gid != -1 and st.st_gid != gid):
            os.fchown(fd, uid, gid)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def append_text(path: Path, base: Path, text: str, mode: int = 0o640, uid: int = -1, gid: int = -1) -> None:
    """Append `text` to `path` (walked from the trusted `base`), creating it as `open_append` does."""
    rel = Path(split_below(path, base))
    dir_fd = walk(base, rel.parent)
    try:
        fd = open_append(dir_fd, rel.name, mode, uid, gid)
    finally:
        os.close(dir_fd)
    try:
        write_all(fd, text.encode("utf-8", "replace"))
    finally:
        os.close(fd)
