"""Data staging (`data.stage` in the job spec): copy a job's working set to local disk, resumably.

    python -m spx.daemon.staging /mnt/volume/data /nvme/data [--bwlimit 200M]

The supervisor runs exactly that, before a job's first attempt, as a subprocess with the job owner's
uid/gid (so every read and write is checked against the user's permissions, never root's), and reads
its stdout: one JSON line `{"event": "progress", ...}` about every 0.5 s, then one final line,
`{"event": "done", ...}` (exit 0) or `{"event": "error", "error": "..."}` (exit 1). `parse_event()`
turns a line back into a `StageProgress`, `StageResult` or `StageFailure`.

Contract:
- A file whose copy in DST has the source's size and mtime (ns) is skipped: it was staged before
  (rsync's quick check). Files are only ever renamed into place complete, fsynced and with the
  source's mtime, so a killed copier never leaves a final name that passes that check half-written.
- A file is copied into `NAME.spx-part` and renamed when done. A part left by an interrupted run is
  continued from its length if it belongs to the same source version (size and mtime recorded in a
  `user.spx.source` xattr when the part is created); otherwise it is discarded and restarted. So an
  interrupt + resume copies each byte once. Where xattrs are unsupported parts are restarted.
- Symlinks are never followed: a link that points inside the tree is recreated as a relative link,
  one that points outside it (or nowhere) is skipped and reported in `warnings`. Fifos, sockets and
  devices are skipped the same way. Files in DST that the source lacks are left alone.
- Free space on DST's filesystem is checked up front against what still has to be copied, and the
  error says it plainly: "no space on /nvme: need 1.0 GiB, 200 MiB free". Every error names the file.
- Bytes move in the kernel (copy_file_range, then sendfile, then read/write as fallbacks).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import re
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

PART_SUFFIX = ".spx-part"
PART_XATTR = "user.spx.source"
CHUNK_BYTES = 8 << 20
PROGRESS_INTERVAL_SECONDS = 0.5


class StageError(Exception):
    """Staging cannot finish; the message is the reason shown in `spx status` (names the file)."""


@dataclass(frozen=True)
class StageProgress:
    """Where a staging run is. `bytes_done`/`files_done` include files skipped as already staged and
    the resumed part of interrupted files, so `bytes_done / bytes_total` is the completion ratio;
    `bytes_copied` is what this run wrote."""

    files_total: int
    files_done: int
    bytes_total: int
    bytes_done: int
    bytes_copied: int
    elapsed_s: float
    current: str | None = None

    @property
    def bytes_per_second(self) -> float:
        return self.bytes_copied / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def summary(self) -> str:
        """One line for `spx status` / JobView.staging, e.g.
        "staging 412.0 MiB / 1.0 GiB (40%), 310/1000 files, 85.2 MiB/s"."""
        pct = 100 * self.bytes_done // self.bytes_total if self.bytes_total else 100
        return (
            f"staging {human_bytes(self.bytes_done)} / {human_bytes(self.bytes_total)} ({pct}%), "
            f"{self.files_done}/{self.files_total} files, {human_bytes(self.bytes_per_second)}/s"
        )


@dataclass(frozen=True)
class StageResult:
    """A finished staging run. bytes_total = bytes_skipped + bytes_resumed + bytes_copied."""

    files_total: int
    files_copied: int
    files_skipped: int
    files_resumed: int
    bytes_total: int
    bytes_copied: int
    bytes_skipped: int
    bytes_resumed: int
    elapsed_s: float
    warnings: list[str] = field(default_factory=list)
    # The copier's own /proc/self/io counters at the end (subprocess entry only; {} in-process).
    io: dict[str, int] = field(default_factory=dict)

    @property
    def bytes_per_second(self) -> float:
        return self.bytes_copied / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def summary(self) -> str:
        return (
            f"staged {human_bytes(self.bytes_total)} in {self.files_total} files: copied "
            f"{human_bytes(self.bytes_copied)} ({self.files_copied} files, {self.files_resumed} resumed), "
            f"{self.files_skipped} already staged, {self.elapsed_s:.1f} s, "
            f"{human_bytes(self.bytes_per_second)}/s"
        )


@dataclass(frozen=True)
class StageFailure:
    """The final line of a failed subprocess run."""

    error: str


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def parse_bytes(text: str) -> int:
    """'200M', '1.5G', '4096' → bytes (binary units)."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise ValueError(f"not a size: {text!r} (e.g. 200M, 1G)")
    scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m.group(2).upper()]
    return int(float(m.group(1)) * scale)


# --- planning ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _File:
    rel: str
    size: int
    mtime_ns: int
    atime_ns: int
    mode: int


@dataclass
class _Plan:
    dirs: list[tuple[str, int]] = field(default_factory=list)
    files: list[_File] = field(default_factory=list)
    links: list[tuple[str, str]] = field(default_factory=list)  # (rel, relative target)
    warnings: list[str] = field(default_factory=list)


def _scan(src: Path) -> _Plan:
    """Walk SRC without following symlinks."""
    plan = _Plan()
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
                plan.files.append(_File(rel, st.st_size, st.st_mtime_ns, st.st_atime_ns, stat.S_IMODE(st.st_mode)))
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


def _identity(f: _File) -> bytes:
    return f"{f.size}:{f.mtime_ns}".encode()


def _already_staged(dst_file: str, f: _File) -> bool:
    try:
        st = os.stat(dst_file, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size == f.size and st.st_mtime_ns == f.mtime_ns


def _resumable_length(part: str, f: _File) -> int:
    """Bytes of PART that can be kept: all of it if it was started for this source version."""
    try:
        st = os.stat(part, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode) or st.st_size > f.size:
            return 0
        return st.st_size if os.getxattr(part, PART_XATTR) == _identity(f) else 0
    except OSError:
        return 0


def _mount_point(path: str) -> str:
    path = os.path.realpath(path)
    while not os.path.ismount(path):
        path = os.path.dirname(path)
    return path


def _existing_ancestor(path: Path) -> str:
    p = os.path.abspath(path)
    while not os.path.exists(p):
        p = os.path.dirname(p)
    return p


def _check_space(dst: Path, need: int, statvfs: Callable[[str], os.statvfs_result]) -> None:
    where = _existing_ancestor(dst)
    st = statvfs(where)
    free = st.f_bavail * st.f_frsize
    if need > free:
        raise StageError(
            f"no space on {_mount_point(where)}: need {human_bytes(need)}, {human_bytes(free)} free"
        )


# --- copying ----------------------------------------------------------------------------------


class _Copier:
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


def _copy_file(copier: _Copier, src_file: str, dst_file: str, f: _File, keep: int) -> None:
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
                        f"no space on {_mount_point(part)} while writing {dst_file}: "
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


def stage_tree(
    src: Path,
    dst: Path,
    progress: Callable[[StageProgress], None] | None = None,
    *,
    bwlimit: int | None = None,
    statvfs: Callable[[str], os.statvfs_result] = os.statvfs,
    clock: Callable[[], float] = time.monotonic,
) -> StageResult:
    """Make DST a copy of SRC's files, copying only what is not already there (see the module doc).

    `progress` is called about every 0.5 s during the copy and once at the end. `bwlimit` caps the
    copy rate in bytes/s (a shared network volume should not be saturated by one job's staging).
    `statvfs` is injectable so the free-space check can be tested without filling a disk.
    Raises StageError with a reason that names the file.
    """
    src, dst = Path(src), Path(dst)
    t0 = clock()
    if not src.is_dir():
        raise StageError(f"staging source {src} is not a directory")
    real_src, real_dst = os.path.realpath(src), os.path.realpath(dst)
    if real_dst == real_src or real_dst.startswith(real_src + os.sep):
        raise StageError(f"staging target {dst} is inside the source {src}")
    plan = _scan(src)
    root = real_src
    todo: list[tuple[_File, int]] = []
    bytes_skipped = files_skipped = 0
    for f in plan.files:
        dst_file = os.path.join(dst, f.rel)
        if _already_staged(dst_file, f):
            bytes_skipped += f.size
            files_skipped += 1
        else:
            todo.append((f, _resumable_length(dst_file + PART_SUFFIX, f)))
    try:
        block = statvfs(_existing_ancestor(dst)).f_frsize or 4096
    except OSError as e:
        raise StageError(f"cannot check free space for {dst}: {e.strerror}") from e
    need = sum(-(-(f.size - keep) // block) * block for f, keep in todo)
    _check_space(dst, need, statvfs)

    try:
        os.makedirs(dst, exist_ok=True)
        for rel, mode in plan.dirs:
            os.makedirs(os.path.join(dst, rel), mode=(mode & 0o777) | 0o700, exist_ok=True)
    except OSError as e:
        raise StageError(f"cannot create directory under {dst}: {e.strerror} ({e.filename})") from e

    run = _Run(len(plan.files), sum(f.size for f in plan.files), files_skipped, bytes_skipped, t0, clock, progress)
    copier = _Copier(bwlimit, run.on_bytes)
    bytes_resumed = files_resumed = 0
    for f, keep in todo:
        run.current = f.rel
        if keep:
            bytes_resumed += keep
            files_resumed += 1
            run.bytes_done += keep
        _copy_file(copier, os.path.join(root, f.rel), os.path.join(dst, f.rel), f, keep)
        run.files_done += 1
    run.current = None
    for rel, target in plan.links:
        _place_link(os.path.join(dst, rel), target)
    if progress is not None:
        progress(run.snapshot())
    return StageResult(
        files_total=len(plan.files),
        files_copied=len(todo),
        files_skipped=files_skipped,
        files_resumed=files_resumed,
        bytes_total=run.bytes_total,
        bytes_copied=run.bytes_copied,
        bytes_skipped=bytes_skipped,
        bytes_resumed=bytes_resumed,
        elapsed_s=clock() - t0,
        warnings=plan.warnings,
    )


@dataclass
class _Run:
    """Counters of one stage_tree call, and its throttled progress reports."""

    files_total: int
    bytes_total: int
    files_done: int
    bytes_done: int
    t0: float
    clock: Callable[[], float]
    progress: Callable[[StageProgress], None] | None
    bytes_copied: int = 0
    current: str | None = None
    last_report: float = 0.0

    def snapshot(self) -> StageProgress:
        return StageProgress(
            self.files_total, self.files_done, self.bytes_total, self.bytes_done, self.bytes_copied,
            self.clock() - self.t0, self.current,
        )

    def on_bytes(self, n: int) -> None:
        self.bytes_done += n
        self.bytes_copied += n
        now = self.clock()
        if self.progress is not None and now - max(self.last_report, self.t0) >= PROGRESS_INTERVAL_SECONDS:
            self.last_report = now
            self.progress(self.snapshot())


def _place_link(path: str, target: str) -> None:
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


# --- subprocess protocol ----------------------------------------------------------------------


def command(src: Path, dst: Path, python: str = sys.executable, bwlimit: int | None = None) -> list[str]:
    """The argv the supervisor runs (as the job's user) to stage SRC into DST."""
    argv = [python, "-m", "spx.daemon.staging", str(src), str(dst)]
    return [*argv, "--bwlimit", str(bwlimit)] if bwlimit else argv


def spawn(
    src: Path,
    dst: Path,
    *,
    uid: int,
    gid: int,
    python: str = sys.executable,
    bwlimit: int | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[str]:
    """Start the copier as the job's user, the way the supervisor does before attempt 1.

    stdout carries the JSON lines (stderr is merged into it: a traceback shows up as lines that
    `parse_event` rejects, to be logged as text). Own session, so cancel can kill its group. The
    interpreter and the installed package must be readable by that user. As a non-root daemon
    (`--root`) the copier simply runs as the daemon's own user.
    """
    ids: dict[str, Any] = {}
    if os.geteuid() == 0:
        ids = {"user": uid, "group": gid, "extra_groups": []}
    return subprocess.Popen(
        command(src, dst, python, bwlimit), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        text=True, cwd="/", start_new_session=True,
        env=env if env is not None else {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"},
        **ids,
    )


def parse_event(line: str) -> StageProgress | StageResult | StageFailure:
    """One stdout line of the subprocess → its value. Raises ValueError on anything else."""
    doc = json.loads(line)
    event = doc.pop("event", None)
    if event == "progress":
        doc.pop("bytes_per_second", None)
        return StageProgress(**doc)
    if event == "done":
        doc.pop("bytes_per_second", None)
        return StageResult(**doc)
    if event == "error":
        return StageFailure(doc["error"])
    raise ValueError(f"not a staging event: {line!r}")


def _proc_io() -> dict[str, int]:
    try:
        with open("/proc/self/io") as fh:
            return {k: int(v) for k, v in (line.split(": ") for line in fh if ": " in line)}
    except OSError:
        return {}


def _emit(event: str, doc: dict) -> None:
    sys.stdout.write(json.dumps({"event": event, **doc}, sort_keys=True) + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spx.daemon.staging", description=__doc__.splitlines()[0])
    parser.add_argument("src", type=Path)
    parser.add_argument("dst", type=Path)
    parser.add_argument("--bwlimit", type=parse_bytes, default=None, help="max copy rate, e.g. 200M (per second)")
    args = parser.parse_args(argv)

    def report(p: StageProgress) -> None:
        _emit("progress", {**asdict(p), "bytes_per_second": round(p.bytes_per_second)})

    try:
        result = stage_tree(args.src, args.dst, report, bwlimit=args.bwlimit)
    except StageError as e:
        _emit("error", {"error": str(e)})
        return 1
    doc = asdict(result)
    doc["io"] = _proc_io()
    _emit("done", {**doc, "bytes_per_second": round(result.bytes_per_second)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
