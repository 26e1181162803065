"""Checkpoints of a data-parallel job in the shared layout (`spx.daemon.contract.checkpoint_layout`,
docs/trainer.md), written atomically.

A save of global step S by a world of W ranks:

1. every rank snapshots its state to host memory (rank 0: model, optimizer, scheduler; every rank:
   its RNG states and data position) — the only part the training loop waits for;
2. every rank writes its files into the shared staging dir `tmp_dirname(S, token)` (the token is
   rank 0's, broadcast at start-up), each as `NAME.part` → fsync → rename to `NAME`. The rename is
   that rank's "done" marker; a rank that fails writes `rank-NNNNN.failed` instead;
3. rank 0 waits (in its background thread, polling the directory — no collectives off the main
   thread) until all W rank files exist, then builds the manifest and `publish`es, then applies
   retention.

A crash anywhere before the rename of step 3 leaves a staging directory, which no reader counts
and the next attempt sweeps; the previous complete checkpoint stays "latest".
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from spx.daemon.contract import checkpoint_layout as layout
from spx.daemon.contract import checkpoint_tiers
from spx.trainer import layout_writer
from spx.trainer.async_save import BackgroundSaver
from spx.trainer.replay_chain import RECORD
from spx.trainer.snapshot import HostSnapshotter
from spx.trainer.tiers import Replicator

log = logging.getLogger("spx.trainer")

FORMAT = "spx-ddp"
SHARED_FILE = "model.pt"


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; the message says which file and why."""


def rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


def failed_marker(rank: int) -> str:
    return f"rank-{rank:05d}.failed"


def atomic_torch_save(obj: Any, path: Path, delay_seconds: float = 0.0) -> None:
    """`torch.save` to `path.part`, fsync, rename: `path` exists only once it is complete.

    `delay_seconds` (tests only) holds the file half-done so a test can kill the writer mid-write.
    """
    part = path.with_name(path.name + ".part")
    with part.open("wb") as f:
        torch.save(obj, f)
        f.flush()
        if delay_seconds:
            time.sleep(delay_seconds)
        os.fsync(f.fileno())
    os.replace(part, path)


def atomic_json_save(doc: dict, path: Path) -> None:
    """`doc` as JSON to `path.part`, fsync, rename (as `atomic_torch_save`)."""
    part = path.with_name(path.name + ".part")
    with part.open("w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.flush()
        os.fsync(f.fileno())
    os.replace(part, path)


@dataclass
class SaveRequest:
    """What one rank contributes to the checkpoint of `step`.

    `write_shared(staging)` writes the part that is not per-rank bookkeeping: rank 0's model /
    optimizer file for DDP (from a host snapshot), or DeepSpeed's collective `save_checkpoint`.
    """

    step: int
    epoch: int
    rank_state: dict
    write_shared: Callable[[Path], None] | None
    extra: dict


class Checkpointer:
    """Writes and reads this job's checkpoints; one instance per rank, all with the same token."""

    def __init__(
        self,
        ckpt_dir: Path,
        *,
        rank: int,
        world_size: int,
        token: str,
        fmt: str = FORMAT,
        keep: int = 3,
        checksums: bool = True,
        publish_timeout_seconds: float = 600.0,
        debug_write_delay_seconds: float = 0.0,
        read_only: bool = False,
    ) -> None:
        self.dir = Path(ckpt_dir)
        self.rank, self.world_size, self.token, self.fmt = rank, world_size, token, fmt
        self.keep, self.checksums = keep, checksums
        self.publish_timeout_seconds = publish_timeout_seconds
        self.debug_write_delay_seconds = debug_write_delay_seconds
        self._saver = BackgroundSaver()
        self._abandoned = threading.Event()
        self._snapshotter = HostSnapshotter()
        # Written by the publishing thread, read by the heartbeat: (step, unix time).
        self.last_published: tuple[int, float] | None = None
        if not read_only:  # a verification replay only reads the job's checkpoints
            self.dir.mkdir(parents=True, exist_ok=True)
        # The local tier (tiers.py): `dir` is then the host-local dir, replicated to `persistent_dir`.
        self.persistent_dir = self.dir
        self._replicator: Replicator | None = None

    def use_local_tier(self, local_dir: Path) -> None:
        """Write checkpoints to `local_dir` from now on; rank 0 replicates each one to the
        persistent dir in the background (every rank must switch at the same step)."""
        local_dir.mkdir(parents=True, exist_ok=True)
        self.dir = local_dir
        if self.rank == 0:
            self._replicator = Replicator(local_dir, self.persistent_dir, self.token, self.keep)

    def adopt(self, final: Path, *, replicate_now: bool) -> None:
        """A checkpoint was published in `dir`: retention there, then its replica (now, or queued)."""
        for old in layout_writer.apply_retention(self.dir, self.keep):
            log.info("retention removed %s", old)
        if self._replicator is not None:
            if replicate_now:
                self._replicator.copy_now(final)
            else:
                self._replicator.submit(final)

    def replicate_resumed(self, chosen: Path) -> None:
        """The attempt resumes from `chosen`; if that is a local-tier checkpoint, queue its replica
        (a no-op when the persistent dir has it). The attempt that wrote it can have been killed
        while copying it (torchrun stops the other ranks when one fails): without this, the
        persistent dir would lack it until the next checkpoint's replica."""
        if self._replicator is not None and chosen.parent == self.dir:
            self._replicator.submit(chosen)

    def wait_replicas(self) -> BaseException | None:
        """Block until the persistent dir holds every published checkpoint (no replica in flight)."""
        return self._replicator.wait() if self._replicator is not None else None

    # ---- saving -------------------------------------------------------------------------------

    def save(
        self,
        step: int,
        epoch: int,
        rank_state: dict,
        shared_state_fn: Callable[[], dict] | None,
        *,
        blocking: bool,
        extra: dict | None = None,
        replay_record: Callable[[dict], dict] | None = None,
    ) -> None:
        """Checkpoint `step` (DDP: rank 0 passes `shared_state_fn`, the others None). Rank 0's
        `replay_record(snapshot)` is the checkpoint's replay record, built on the writer (its state
        hash is taken from the host snapshot, off the training thread when the save is async).

        Non-blocking: returns after the host snapshot; the write continues in the background.
        Blocking: returns once published (rank 0) / written (others) and raises
        `CheckpointError` if that failed.
        """
        error = self._saver.wait()
        if error is not None:
            log.error("previous checkpoint failed (%d failures so far): %r", self._saver.failures, error)
        write_shared = None
        if shared_state_fn is not None:
            snapshot = self._snapshotter.copy(shared_state_fn())
            delay = self.debug_write_delay_seconds

            def write_shared(staging: Path) -> None:
                atomic_torch_save(snapshot, staging / SHARED_FILE, delay)
                if replay_record is not None:
                    atomic_json_save(replay_record(snapshot), staging / RECORD)

        req = SaveRequest(step, epoch, rank_state, write_shared, extra or {})
        if blocking:
            self._write_reporting(req)
        else:
            self._saver.submit(lambda: self._write(req), label=f"step {step}")

    def save_collective(
        self, step: int, epoch: int, rank_state: dict, write_shared: Callable[[Path], None], *, extra: dict | None = None
    ) -> None:
        """Checkpoint `step` where every rank takes part in writing the shared part (DeepSpeed's
        `save_checkpoint` is a collective), synchronously, on the calling (main) thread."""
        error = self._saver.wait()
        if error is not None:
            log.error("previous checkpoint failed: %r", error)
        self._write_reporting(SaveRequest(step, epoch, rank_state, write_shared, extra or {}))

    def abandon(self) -> None:
        """A peer died: a publish in flight stops waiting for rank files that will never come."""
        self._abandoned.set()

    def wait(self) -> BaseException | None:
        """Block until no save is in flight; returns the error of the last one, if it failed."""
        return self._saver.wait()

    @property
    def failures(self) -> int:
        return self._saver.failures

    def _write_reporting(self, req: SaveRequest) -> None:
        try:
            self._write(req)
        except Exception as exc:
            raise CheckpointError(f"checkpoint of step {req.step} failed: {exc!r}") from exc

    def _write(self, req: SaveRequest) -> None:
        staging = self.dir / layout.tmp_dirname(req.step, self.token)
        staging.mkdir(parents=True, exist_ok=True)
        try:
            if req.write_shared is not None:
                req.write_shared(staging)
            atomic_torch_save(req.rank_state, staging / rank_file(self.rank))
        except BaseException as exc:
            (staging / failed_marker(self.rank)).write_text(repr(exc))
            raise
        if self.rank == 0:
            self._publish(staging, req)

    def _publish(self, staging: Path, req: SaveRequest) -> None:
        """Rank 0: wait for every rank's file, then manifest + rename; on failure, discard."""
        try:
            self._wait_for_ranks(staging)
            manifest = layout_writer.build_manifest(
                staging,
                step=req.step,
                epoch=req.epoch,
                world_size=self.world_size,
                fmt=self.fmt,
                checksums=self.checksums,
                extra={"token": self.token, **req.extra},
            )
            final = layout_writer.publish(staging, manifest)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        self.last_published = (req.step, time.time())
        log.info("checkpoint %s published", final)
        assert final is not None
        self.adopt(final, replicate_now=False)

    def _wait_for_ranks(self, staging: Path) -> None:
        deadline = time.monotonic() + self.publish_timeout_seconds
        while True:
            failed = [r for r in range(self.world_size) if (staging / failed_marker(r)).exists()]
            if failed:
                raise CheckpointError(f"ranks {failed} failed to write their part of {staging.name}")
            missing = [r for r in range(self.world_size) if not (staging / rank_file(r)).exists()]
            if not missing:
                return
            if self._abandoned.is_set():
                raise CheckpointError(f"ranks {missing} died before finishing {staging.name}")
            if time.monotonic() > deadline:
                raise CheckpointError(
                    f"ranks {missing} did not finish {staging.name} within {self.publish_timeout_seconds}s"
                )
            time.sleep(0.02)

    # ---- reading ------------------------------------------------------------------------------

    def sweep_stale(self) -> None:
        """Remove staging dirs of earlier, crashed attempts (rank 0, at start-up)."""
        for d in {self.dir, self.persistent_dir}:
            for p in layout_writer.remove_stale_tmp(d, live_tokens=[self.token]):
                log.info("removed unfinished checkpoint %s", p.name)

    def load(self, path: Path, map_location: Any = "cpu", *, shared: bool = True) -> tuple[dict | None, dict, dict]:
        """(shared state or None, this rank's state, manifest) of a complete checkpoint.

        A checkpoint written by a different world size still loads; this rank then gets the rank
        file of `rank % old_world` and the caller rescales the data position.
        """
        manifest = layout.read_manifest(path)
        if manifest is None:
            raise CheckpointError(f"{path} is not a complete checkpoint (no valid {layout.MANIFEST})")
        if manifest.get("format") != self.fmt:
            raise CheckpointError(
                f"{path} has format {manifest.get('format')!r}, expected {self.fmt!r}: it was written by "
                "the other trainer (DDP vs DeepSpeed); point SPX_CHECKPOINT_DIR at this job's own directory"
            )
        old_world = int(manifest["world_size"])
        shared_state = torch.load(path / SHARED_FILE, map_location=map_location, weights_only=True) if shared else None
        mine = torch.load(path / rank_file(self.rank % old_world), map_location="cpu", weights_only=True)
        return shared_state, mine, manifest


def resolve_resume_path(ckpt_dir: Path, local_dir: Path | None = None) -> Path | None:
    """SPX_RESUME_FROM if it names a complete checkpoint, else the latest complete one in
    `ckpt_dir` or the host-local tier `local_dir` (checkpoint_tiers: the local copy when it is not
    older), else None. An unusable SPX_RESUME_FROM is logged, never fatal: the layout's own
    answer is what the daemon would have chosen anyway."""
    from spx.daemon.contract.worker_env import ENV_RESUME_FROM

    wanted = os.environ.get(ENV_RESUME_FROM, "").strip()
    if wanted:
        path = Path(wanted)
        if layout.read_manifest(path) is not None:
            return path
        log.warning("%s=%s is not a complete checkpoint; using the latest complete one", ENV_RESUME_FROM, wanted)
    choice = checkpoint_tiers.latest_complete(ckpt_dir, local_dir)
    if choice.ref is not None:
        log.info("latest complete checkpoint: %s (%s tier)", choice.ref.path, choice.tier)
    return choice.ref.path if choice.ref else None
