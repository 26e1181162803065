"""Scheduled online backups of the state store, so a damaged store has a restore (integrity.py names it).

SQLite's online backup API copies a consistent snapshot while the daemon keeps writing (WAL readers do
not block the writer). Each backup is written to a temporary name, fsynced, renamed into place and the
directory fsynced, so `state_dir/backup/` only ever holds whole backups: `spx-YYYYmmddTHHMMSSZ.sqlite`,
the newest `keep` of them.

The main loop calls `tick(now)` every turn; it backs up when `every_seconds` (monotonic) have passed
since the last one, and once at start. A failed backup (full disk) is logged and retried at the next
period; it never stops the daemon.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from spx.daemon.core.log import get_logger
from spx.daemon.state.integrity import backups

log = get_logger()


class Backups:
    def __init__(self, store_path: Path, backup_dir: Path, every_seconds: float, keep: int,
                 wall=time.time):
        self.store_path = store_path
        self.dir = backup_dir
        self.every = every_seconds
        self.keep = keep
        self.wall = wall
        self.next_due: float | None = None  # monotonic; None: at the first tick

    def due(self, now_mono: float) -> bool:
        return self.next_due is None or now_mono >= self.next_due

    def tick(self, now_mono: float) -> None:
        """Back up if due. Never raises: a backup that fails is logged and tried again next period."""
        if not self.due(now_mono):
            return
        self.next_due = now_mono + self.every
        try:
            path = self.backup_now()
        except (OSError, sqlite3.Error) as e:
            log.warning("state_backup_failed", store=str(self.store_path), backup_dir=str(self.dir), error=str(e))
            return
        log.info("state_backed_up", backup=str(path))

    def backup_now(self) -> Path:
        """Write one backup and prune the oldest beyond `keep`. Returns the new backup's path."""
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self.wall()))
        final = self.dir / f"spx-{stamp}.sqlite"
        tmp = self.dir / f".spx-{stamp}.sqlite.tmp-{os.getpid()}"
        tmp.unlink(missing_ok=True)
        try:
            src = sqlite3.connect(self.store_path, timeout=10)
            dst = sqlite3.connect(tmp)
            try:
                src.backup(dst)
                # A single-file copy: no -wal beside it, so restoring is one cp.
                dst.execute("PRAGMA journal_mode=DELETE")
            finally:
                dst.close()
                src.close()
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        dir_fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        for old in backups(self.dir)[: -self.keep]:
            old.unlink(missing_ok=True)
        return final
