"""The local checkpoint tier: write each checkpoint to fast host-local storage, replicate it to the
persistent checkpoint dir in the background.

The daemon gives each job `SPX_LOCAL_CHECKPOINT_DIR` (RAM under /dev/shm by default, or a local NVMe
dir), removed when the job ends. A save then stalls training only for the write to RAM; the copy to
the (slow, shared) persistent volume runs on its own thread, one at a time, in step order. Both
tiers use the same layout and the same completeness rule: the replica is copied into a staging dir,
fsynced, its manifest copied last and the dir renamed, so "complete" holds in each tier on its own.
Retention (`keep`) applies to each tier after each publish.

The local tier is used only when every rank runs on this host (a rank file written to another
host's RAM is not readable by rank 0 here) and when the local dir has room for `keep + 1`
checkpoints of the size of the last one (else the save goes straight to the persistent dir).
Resume takes the fastest complete copy: the local one if its step is at least the persistent one's
(`spx.daemon.contract.checkpoint_tiers`, shared with the daemon).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path

from spx.daemon.contract import checkpoint_layout as layout
from spx.trainer import layout_writer
from spx.trainer.async_save import BackgroundSaver

log = logging.getLogger("spx.trainer")


def checkpoint_bytes(ckpt: Path) -> int:
    """Size of a complete checkpoint by its manifest (0 if unreadable)."""
    manifest = layout.read_manifest(ckpt)
    return sum(int(f["size"]) for f in manifest["files"]) if manifest else 0


def has_room(local_dir: Path, need_bytes: int, keep: int) -> bool:
    """Room for `keep + 1` checkpoints of `need_bytes` (retention runs after the next publish)."""
    try:
        st = os.statvfs(local_dir)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize >= need_bytes * (keep + 1)


def replicate(src: Path, persistent_dir: Path, token: str) -> Path | None:
    """Copy the complete checkpoint `src` into `persistent_dir` under the same name, manifest last;
    None if it is already complete there (a newer writer or an earlier replica)."""
    manifest = layout.read_manifest(src)
    if manifest is None:
        raise RuntimeError(f"{src} is not complete: nothing to replicate")
    final = persistent_dir / src.name
    if layout.read_manifest(final) is not None:
        return None
    staging = persistent_dir / layout.tmp_dirname(int(manifest["step"]), f"{token}-replica")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        for entry in manifest["files"]:
            target = staging / entry["path"]
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / entry["path"], target)
        return layout_writer.publish(staging, manifest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


class Replicator:
    """Rank 0's background copier from the local tier to the persistent dir (one copy in flight)."""

    def __init__(self, local_dir: Path, persistent_dir: Path, token: str, keep: int) -> None:
        self.local_dir, self.persistent_dir, self.token, self.keep = local_dir, persistent_dir, token, keep
        self._saver = BackgroundSaver(name="spx-replicate")
        self.last_replicated: tuple[int, float] | None = None

    def submit(self, ckpt: Path) -> None:
        """Replicate `ckpt` after the copy in flight finished (keeps replicas in step order)."""
        self._saver.submit(lambda: self.copy_now(ckpt), label=f"replica of {ckpt.name}")

    def copy_now(self, ckpt: Path) -> None:
        started = time.monotonic()
        final = replicate(ckpt, self.persistent_dir, self.token)
        if final is not None:
            self.last_replicated = (int(ckpt.name.split("-")[1]), time.time())
            log.info("checkpoint %s replicated to %s in %.2f s", ckpt.name, self.persistent_dir,
                     time.monotonic() - started)
        for old in layout_writer.apply_retention(self.persistent_dir, self.keep):
            log.info("retention removed %s", old)

    def wait(self) -> BaseException | None:
        return self._saver.wait()
