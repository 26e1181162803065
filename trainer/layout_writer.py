"""The writer side of the checkpoint layout (spx.daemon.contract.checkpoint_layout): build the
manifest, publish a staging directory as a complete checkpoint, prune old and crashed ones.

It renames and deletes in the checkpoint directory, which is the job's user's tree, so it lives in
the trainer and runs only in workers, as that user; the daemon only names and reads checkpoints.

Fenced: a publish (and a retention pass) happens only while the job's lease is still the one this
attempt was launched under (`SPX_FENCE`, contract/fencing.py), checked under a shared flock of the
lease's lock that is held until the rename is done. A host whose lease another host took publishes
nothing, says why, and exits `EXIT_FENCED` at once (no thread of it writes anything more).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

from spx.daemon.contract.checkpoint_layout import (
    FORMAT_VERSION,
    MANIFEST,
    TMP_MARK,
    complete_checkpoints,
    file_digest,
    fsync_dir,
    step_dirname,
)
from spx.daemon.contract.fencing import Fence, Fenced
from spx.daemon.contract.worker_env import EXIT_FENCED

log = logging.getLogger("spx.trainer")


@contextmanager
def fenced(what: str, staging: Path | None = None) -> Iterator[None]:
    """Inside: this attempt may still write the job's checkpoints, and keeps that right until the
    block ends (no daemon can take the lease meanwhile). Without SPX_FENCE (a job across hosts, a run
    by hand) there is nothing to check. A fenced attempt never returns from here: `_stop_fenced`."""
    fence = Fence.from_env()
    if fence is None:
        yield
        return
    try:
        with fence.held():
            yield
    except Fenced as e:  # raised by the check only: the block itself raises no Fenced
        _stop_fenced(what, e, staging)


def _stop_fenced(what: str, why: Fenced, staging: Path | None) -> NoReturn:
    """Publish nothing, say why, and end this process now: every thread of it (the background saver,
    the replicator, the training loop) would otherwise go on writing into a job another host runs."""
    if staging is not None:
        shutil.rmtree(staging, ignore_errors=True)
    log.error("not publishing %s: %s. This attempt stops (exit %d); the job goes on on the host that holds "
              "its lease.", what, why, EXIT_FENCED)
    for handler in logging.getLogger().handlers + log.handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.write(f"spx.trainer: fenced: {why}\n")
    sys.stderr.flush()
    os._exit(EXIT_FENCED)


def fsync_tree(root: Path) -> None:
    """fsync every file and directory under `root`, deepest first."""
    for dirpath, _dirs, files in os.walk(root, topdown=False):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))


def build_manifest(
    staging: Path,
    *,
    step: int,
    epoch: int,
    world_size: int,
    fmt: str,
    checksums: bool = True,
    extra: dict | None = None,
) -> dict:
    """Describe every payload file under `staging` (relative path, size, sha256)."""
    files = []
    for p in sorted(q for q in staging.rglob("*") if q.is_file() and q.name != MANIFEST):
        entry: dict = {"path": p.relative_to(staging).as_posix(), "size": p.stat().st_size}
        if checksums:
            entry["sha256"] = file_digest(p)
        files.append(entry)
    return {
        "version": FORMAT_VERSION,
        "step": step,
        "epoch": epoch,
        "world_size": world_size,
        "format": fmt,
        "files": files,
        **({"extra": extra} if extra else {}),
    }


def publish(staging: Path, manifest: dict, *, replace: bool = True) -> Path | None:
    """Write the manifest last and rename the staging directory into place, durably.

    Order: payload fsync → manifest write + fsync → rename → parent fsync. A crash before the rename
    leaves only a staging directory; a crash after it leaves a complete checkpoint. Returns the
    final path. `replace=False` (several JIT survivors racing): the rename fails atomically if the
    step already exists, and None says another writer won.
    """
    fsync_tree(staging)
    manifest_path = staging / MANIFEST
    tmp = staging / (MANIFEST + ".part")
    with tmp.open("w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, manifest_path)
    fsync_dir(staging)
    final = staging.parent / step_dirname(int(manifest["step"]))
    replaced = None
    with fenced(f"checkpoint {final}", staging):
        if not replace:
            try:
                os.rename(staging, final)  # a non-empty `final` makes this fail: first writer wins
            except OSError:
                return None
        else:
            if final.exists():
                # Same step saved twice (e.g. a SIGTERM checkpoint right after a periodic one): the
                # newer copy replaces it only after it is itself complete. Moved aside under the
                # fence, deleted after it (a staging name: swept if this process dies first).
                replaced = final.with_name(f"{final.name}{TMP_MARK}replaced-{os.getpid()}")
                os.rename(final, replaced)
            os.rename(staging, final)
        fsync_dir(staging.parent)
    if replaced is not None:
        shutil.rmtree(replaced, ignore_errors=True)
    return final


def apply_retention(ckpt_dir: Path, keep: int) -> list[Path]:
    """Delete all but the `keep` newest complete checkpoints; never the latest one.

    Call only after a new checkpoint was published, so deleting never leaves fewer complete
    checkpoints than before the save began. Returns what was deleted.
    """
    keep = max(1, keep)
    found = complete_checkpoints(ckpt_dir)
    doomed = [r.path for r in found[:-keep]]
    if not doomed:
        return []
    aside = []
    with fenced(f"the retention of {len(doomed)} old checkpoints in {ckpt_dir}"):
        for path in doomed:  # renamed under the fence (milliseconds), deleted after it
            gone = path.with_name(f"{path.name}{TMP_MARK}retired-{os.getpid()}")
            try:
                os.rename(path, gone)
            except OSError:
                continue
            aside.append(gone)
    for gone in aside:
        shutil.rmtree(gone, ignore_errors=True)
    return doomed


def remove_stale_tmp(ckpt_dir: Path, live_tokens: Iterable[str] = ()) -> list[Path]:
    """Remove staging dirs left by crashed saves (except those of `live_tokens`)."""
    live = set(live_tokens)
    removed = []
    try:
        entries = list(ckpt_dir.iterdir())
    except OSError:
        return []
    for p in entries:
        if TMP_MARK in p.name and p.name.startswith("step-") and p.name.split(TMP_MARK, 1)[1] not in live:
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed
