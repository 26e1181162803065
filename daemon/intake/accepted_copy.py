"""The root-only copy of an accepted job file: what the store's row points to for the job's life.

Every way a job enters the store keeps one — a spool file accepted, a job adopted from a lost host's
checkpoint dir, a periodic replay queued by the daemon — so that the row always names a file that
holds what was accepted (the user's spool file can change or go as soon as it is claimed). Written
once under a fresh name (O_EXCL: never over another copy), fsynced with its directory before the row
is written, so a daemon killed in between finds the copy at its next start (`accept.recover_unrecorded`
takes `.yaml` copies the store lacks; an adoption's `.adopted` one is not retaken: its record on the
volume is).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from spx.daemon.contract.checkpoint_layout import fsync_dir


def keep(jobs_dir: Path, name: str, owner_uid: int, text: str, suffix: str = "yaml") -> Path:
    """Write `text` as NAME.UID.NS.SUFFIX in `jobs_dir` (root's, 0600), durably; its path."""
    copy = jobs_dir / f"{name}.{owner_uid}.{time.time_ns()}.{suffix}"
    fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(jobs_dir)
    return copy
