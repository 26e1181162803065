"""Each job's host-local checkpoint dir (SPX_LOCAL_CHECKPOINT_DIR): created before an attempt,
removed when the job ends.

`local_checkpoint_root` (default /dev/shm/spx: host RAM) is the daemon's own directory: root-owned,
0755, writable by no one else (fsafe.open_root_dir verifies or replaces it), so a user can neither
plant nor rename entries in it. Each job gets `NAME.ID.TAG` in it (TAG: this daemon's state dir, so
two daemons sharing the root never share a dir), made by root and handed to the job's owner, 0700.
spx.trainer writes checkpoints there first and replicates them to the persistent dir; the daemon
removes the dir (by fd, never following a link) when the job reaches a terminal state: it is RAM,
and the persistent copy is the one that outlives the job. Between attempts it stays: the next
attempt on this host resumes from it.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from spx.daemon.core.config import DaemonConfig
from spx.daemon.core.log import get_logger
from spx.daemon.state.jobs_table import JobRow
from spx.daemon.userfs import fsafe

log = get_logger()


def dir_name(cfg: DaemonConfig, job: JobRow) -> str:
    tag = hashlib.sha256(str(cfg.state_dir.absolute()).encode()).hexdigest()[:8]
    return f"{job.name}.{job.id}.{tag}"


def path(cfg: DaemonConfig, job: JobRow) -> Path | None:
    """Where the job's local dir is (None: the local tier is off)."""
    root = cfg.local_checkpoint_root
    return None if root is None else root / dir_name(cfg, job)


def prepare(cfg: DaemonConfig, job: JobRow, uid: int, gid: int) -> Path | None:
    """Create (or keep) the job's local dir, owned by `uid`, 0700. None when the tier is off or the
    root cannot be made (logged: the job then checkpoints to the persistent dir only)."""
    target = path(cfg, job)
    if target is None:
        return None
    try:
        base_fd = fsafe.open_root_dir(target.parent, 0o755)
        try:
            os.close(fsafe.ensure_owned_dir_at(base_fd, target.name, 0o700, uid, gid))
        finally:
            os.close(base_fd)
    except OSError as e:
        log.warning("local_checkpoint_dir_unavailable", job=job.name, attempt=None, dir=str(target), error=str(e))
        return None
    return target


def remove(cfg: DaemonConfig, job: JobRow) -> None:
    """Delete the job's local dir and everything in it (the job ended). Never raises."""
    target = path(cfg, job)
    if target is None:
        return
    try:
        base_fd = fsafe.open_trusted_dir(target.parent)
    except OSError:
        return  # no root dir: nothing was ever created
    try:
        if fsafe.remove_tree_at(base_fd, target.name):
            log.info("local_checkpoint_dir_removed", job=job.name, attempt=None, dir=str(target))
    except OSError as e:
        log.warning("local_checkpoint_dir_not_removed", job=job.name, attempt=None, dir=str(target), error=str(e))
    finally:
        os.close(base_fd)
