"""The files retention removes, removed off the main loop (run/retention.py submits these to the lanes).

Every path here is in a directory only root writes, reached by that directory's fd:

- `log/NAME` and `log/NAME.job-ID[.N]` (attempt_files.py: the second is where a reused name set
  the earlier job's logs aside) — root's; a directory is taken only if its `.job-id` marker names
  the job being removed, so a live job's logs (its own marker) are never touched. It is first
  renamed to `.removing-ID-NS` under `attempt_files.LOG_DIRS` (nobody sets a dir aside or makes one
  meanwhile), then deleted by `fsafe.remove_tree_at` (fd-relative, no link followed: the per-rank
  log dir inside is the owner's and may hold anything). What a crash leaves as `.removing-*` is
  deleted by the next sweep.
- `state_dir/jobs/*.yaml` — the accepted copy (root-only); removed *before* the job's rows, since
  intake re-records a copy the store does not know (intake/accept.py `recover_unrecorded`).
- `run_dir/jobs/ID-NAME/` — the heartbeat's dir (root's parent, the owner's dir).
- `spool/rejected/` — root's (0711); entries whose change time (the move into it, which a user
  cannot set back) is older than the cutoff.

Sizes for the log cap are measured with `os.fwalk` on the dir's fd without following links, at
most MAX_ENTRIES_MEASURED entries per directory tree: a user's million files cost a bounded walk.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from spx.daemon.core.config import DaemonConfig
from spx.daemon.core.log import get_logger
from spx.daemon.intake.spool import REJECTED
from spx.daemon.run import attempt_files
from spx.daemon.userfs import fsafe

log = get_logger()

TRASH_PREFIX = ".removing-"
TRASH_MIN_AGE_SECONDS = 3600.0  # a younger one may still be deleted by the task that made it
MAX_ENTRIES_MEASURED = 100_000
MAX_REJECTED_PER_SWEEP = 10_000
MAX_SET_ASIDE = 1000  # NAME.job-ID.1 … : how many same-id dirs a reused name can have made


@dataclass
class Sweep:
    """What one sweep found and did: disk used per finished job's logs (by job id, from the dirs'
    markers), the spool/rejected/ entries removed, the leftover trash removed."""

    log_bytes: dict[int, int] = field(default_factory=dict)
    rejected_removed: int = 0
    trash_removed: int = 0


def _log_dir_names(name: str, job_id: int) -> list[str]:
    """The names a job's log dirs can have: `NAME`, `NAME.job-ID`, `NAME.job-ID.N`."""
    aside = f"{name}.job-{job_id}"
    return [name, aside, *(f"{aside}.{n}" for n in range(1, MAX_SET_ASIDE))]


def _take_away(base: int, entry: str, job_id: int) -> str | None:
    """Rename `entry` of log_dir to a trash name if it is root's directory marked for `job_id`;
    the trash name, or None (not there, or not this job's). Under LOG_DIRS."""
    with attempt_files.LOG_DIRS:
        try:
            fd = fsafe.open_dir_at(base, entry)
        except OSError:
            return None
        try:
            if os.fstat(fd).st_uid != os.geteuid() or attempt_files.read_marker(fd) != job_id:
                return None
        finally:
            os.close(fd)
        trash = f"{TRASH_PREFIX}{job_id}-{time.time_ns()}"
        os.rename(entry, trash, src_dir_fd=base, dst_dir_fd=base)
        return trash


def remove_logs(cfg: DaemonConfig, job_id: int, name: str) -> list[str]:
    """Delete every log dir of job `job_id` (named `name`); the names it had."""
    base = fsafe.open_trusted_dir(cfg.log_dir)
    removed = []
    try:
        for i, entry in enumerate(_log_dir_names(name, job_id)):
            if i > 1 and not _exists(base, entry):
                break  # NAME.job-ID.N are made in order: the first missing one ends them
            trash = _take_away(base, entry, job_id)
            if trash is not None:
                fsafe.remove_tree_at(base, trash)
                removed.append(entry)
    finally:
        os.close(base)
    return removed


def remove_job_files(cfg: DaemonConfig, job_id: int, name: str, spec_file: str) -> list[str]:
    """Everything of a finished job outside the store (see the module doc), the accepted copy first;
    what was removed. Raises OSError if any of it could not be: the job's rows are then kept."""
    removed = []
    copy = Path(spec_file)
    if copy.parent == cfg.state_dir / "jobs":  # only ever the daemon's own copies
        fd = fsafe.open_trusted_dir(copy.parent)
        try:
            os.unlink(copy.name, dir_fd=fd)
            removed.append(str(copy))
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)
    removed += [str(cfg.log_dir / n) for n in remove_logs(cfg, job_id, name)]
    beats = cfg.run_dir / "jobs"
    with contextlib.suppress(FileNotFoundError):
        fd = fsafe.open_trusted_dir(beats)
        try:
            if fsafe.remove_tree_at(fd, f"{job_id}-{name}"):
                removed.append(str(beats / f"{job_id}-{name}"))
        finally:
            os.close(fd)
    return removed


def sweep(cfg: DaemonConfig, rejected_before: float | None, live_ids: frozenset[int], now: float) -> Sweep:
    """The daemon's own pass over log_dir (sizes of finished jobs' logs, leftover trash) and
    spool/rejected/ (entries older than `rejected_before`, None: kept)."""
    found = Sweep()
    base = fsafe.open_trusted_dir(cfg.log_dir)
    try:
        with os.scandir(base) as it:
            entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
        for entry, is_dir in entries:
            if not is_dir:
                continue
            if entry.startswith(TRASH_PREFIX):
                with contextlib.suppress(OSError):
                    if now - os.stat(entry, dir_fd=base, follow_symlinks=False).st_ctime > TRASH_MIN_AGE_SECONDS:
                        found.trash_removed += fsafe.remove_tree_at(base, entry)
                continue
            job_id, size = _measure(base, entry)
            if job_id is not None and job_id not in live_ids:
                found.log_bytes[job_id] = found.log_bytes.get(job_id, 0) + size
    finally:
        os.close(base)
    if rejected_before is not None:
        found.rejected_removed = _sweep_rejected(cfg, rejected_before)
    return found


def _measure(base: int, entry: str) -> tuple[int | None, int]:
    """(the job id of root's log dir `entry`, the disk it uses) — (None, 0) for anything else."""
    try:
        fd = fsafe.open_dir_at(base, entry)
    except OSError:
        return None, 0
    try:
        st = os.fstat(fd)
        job_id = attempt_files.read_marker(fd) if st.st_uid == os.geteuid() else None
        if job_id is None:
            return None, 0
        total, seen = st.st_blocks * 512, 0
        for _root, dirs, files, dir_fd in os.fwalk(".", dir_fd=fd, follow_symlinks=False):
            for name in (*dirs, *files):
                with contextlib.suppress(OSError):
                    total += os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_blocks * 512
                seen += 1
            if seen >= MAX_ENTRIES_MEASURED:
                break
        return job_id, total
    finally:
        os.close(fd)


def _sweep_rejected(cfg: DaemonConfig, before: float) -> int:
    """Remove spool/rejected/ entries whose change time is before `before`; how many."""
    try:
        spool = fsafe.open_trusted_dir(cfg.spool_dir)
    except OSError:
        return 0
    try:
        rfd = fsafe.open_dir_at(spool, REJECTED)
    except OSError:
        return 0
    finally:
        os.close(spool)
    removed = 0
    try:
        st = os.fstat(rfd)
        if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return 0  # not the daemon's own rejected/: the spool's claimer makes a fresh one
        with os.scandir(rfd) as it:
            names = [e.name for e in it]
        for name in names:
            if removed >= MAX_REJECTED_PER_SWEEP:
                break
            try:
                est = os.stat(name, dir_fd=rfd, follow_symlinks=False)
                if est.st_ctime >= before:
                    continue
                if stat.S_ISDIR(est.st_mode):
                    fsafe.remove_tree_at(rfd, name)
                else:
                    os.unlink(name, dir_fd=rfd)
                removed += 1
            except OSError as e:
                log.warning("retention_rejected_not_removed", job=None, attempt=None, file=name, error=str(e))
    finally:
        os.close(rfd)
    return removed


def _exists(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False
