"""Data staging (`data.stage` in the job spec): copy a job's working set to local disk, resumably.

    python -m spx.daemon.staging.copier /mnt/volume/data /nvme/data [--bwlimit 200M]

The supervisor runs exactly that, before a job's first attempt, as a subprocess that becomes the job's
owner — uid, gid and supplementary groups (`--become UID:GID:G1,G2`, applied right after start-up,
before any path is touched, so the interpreter may live where the user cannot read it) — so every read
and write is checked against the user's permissions, with their groups, never root's; and reads
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
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from spx.daemon.staging.copy_engine import (
    PART_SUFFIX,
    Copier,
    FileEntry,
    StageError,
    already_staged,
    check_space,
    copy_file,
    existing_ancestor,
    human_bytes,
    place_link,
    resumable_length,
    scan_tree,
)
from spx.daemon.userfs.identity import become

PROGRESS_INTERVAL_SECONDS = 0.5


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


def parse_bytes(text: str) -> int:
    """'200M', '1.5G', '4096' → bytes (binary units)."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise ValueError(f"not a size: {text!r} (e.g. 200M, 1G)")
    scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m.group(2).upper()]
    return int(float(m.group(1)) * scale)


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
    plan = scan_tree(src)
    root = real_src
    todo: list[tuple[FileEntry, int]] = []
    bytes_skipped = files_skipped = 0
    for f in plan.files:
        dst_file = os.path.join(dst, f.rel)
        if already_staged(dst_file, f):
            bytes_skipped += f.size
            files_skipped += 1
        else:
            todo.append((f, resumable_length(dst_file + PART_SUFFIX, f)))
    try:
        block = statvfs(existing_ancestor(dst)).f_frsize or 4096
    except OSError as e:
        raise StageError(f"cannot check free space for {dst}: {e.strerror}") from e
    need = sum(-(-(f.size - keep) // block) * block for f, keep in todo)
    check_space(dst, need, statvfs)

    try:
        os.makedirs(dst, exist_ok=True)
        for rel, mode in plan.dirs:
            os.makedirs(os.path.join(dst, rel), mode=(mode & 0o777) | 0o700, exist_ok=True)
    except OSError as e:
        raise StageError(f"cannot create directory under {dst}: {e.strerror} ({e.filename})") from e

    run = _Run(len(plan.files), sum(f.size for f in plan.files), files_skipped, bytes_skipped, t0, clock, progress)
    copier = Copier(bwlimit, run.on_bytes)
    bytes_resumed = files_resumed = 0
    for f, keep in todo:
        run.current = f.rel
        if keep:
            bytes_resumed += keep
            files_resumed += 1
            run.bytes_done += keep
        copy_file(copier, os.path.join(root, f.rel), os.path.join(dst, f.rel), f, keep)
        run.files_done += 1
    run.current = None
    for rel, target in plan.links:
        place_link(os.path.join(dst, rel), target)
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


# --- subprocess protocol ----------------------------------------------------------------------


def command(src: Path, dst: Path, python: str = sys.executable, bwlimit: int | None = None,
            become_ids: str | None = None) -> list[str]:
    """The argv the supervisor runs to stage SRC into DST (as the user `become_ids` names, UID:GID:G1,G2)."""
    argv = [python, "-m", "spx.daemon.staging.copier", str(src), str(dst)]
    if become_ids:
        argv += ["--become", become_ids]
    return [*argv, "--bwlimit", str(bwlimit)] if bwlimit else argv


def _parse_ids(text: str) -> dict[str, object]:
    uid, gid, groups = text.split(":")
    return {"uid": int(uid), "gid": int(gid), "groups": [int(g) for g in groups.split(",") if g]}


def spawn(
    src: Path,
    dst: Path,
    *,
    uid: int,
    gid: int,
    groups: list[int] | None = None,
    python: str = sys.executable,
    bwlimit: int | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[str]:
    """Start the copier as the job's user (uid, gid and `groups`, the owner's supplementary groups:
    staging from a volume the user reads as a group member must work), the way the supervisor does
    before attempt 1.

    stdout carries the JSON lines (stderr is merged into it: a traceback shows up as lines that
    `parse_event` rejects, to be logged as text). Own session, so cancel can kill its group. As a
    non-root daemon (`--root`) the copier simply runs as the daemon's own user.
    """
    ids = None
    if os.geteuid() == 0 and uid != 0:
        ids = f"{uid}:{gid}:{','.join(str(g) for g in (groups if groups is not None else [gid]))}"
    return subprocess.Popen(
        command(src, dst, python, bwlimit, ids), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, text=True, cwd="/", start_new_session=True,
        env=env if env is not None else {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"},
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
    parser = argparse.ArgumentParser(prog="python -m spx.daemon.staging.copier", description=__doc__.splitlines()[0])
    parser.add_argument("src", type=Path)
    parser.add_argument("dst", type=Path)
    parser.add_argument("--bwlimit", type=parse_bytes, default=None, help="max copy rate, e.g. 200M (per second)")
    parser.add_argument("--become", type=_parse_ids, default=None, metavar="UID:GID:G1,G2",
                        help="run as this user (root only; done before any path is touched)")
    args = parser.parse_args(argv)
    try:
        become(args.become)
    except OSError as e:
        _emit("error", {"error": f"cannot become uid {args.become['uid']}: {e.strerror}"})
        return 1

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
