"""Just-in-time checkpoint of a replicated (DDP) job: when a peer fails, a survivor saves the last
completed step before it exits (after "Just-In-Time Checkpointing", EuroSys'24).

Every DDP rank holds the full model, optimizer and scheduler, so a survivor needs no collective to
save them. What it does not hold is the other ranks' own state: their RNG streams (dropout draws
differ per rank) and data positions. So at every step boundary each rank writes that small state
(~10 KB) to `rank-RRRRR.step-N.pt` in a boundary directory all ranks of the host can read (host RAM
when the daemon gave a local checkpoint dir); the survivor assembles the checkpoint of step k from
its own model/optimizer and every rank's boundary file of step k.

Exactness: a survivor's own state is that of the end of step k from the end of step k's optimizer
step until step k+1's, the only place params, optimizer and scheduler change; DDP's collectives —
the gradient all-reduce in backward, the loop's divergence check and stop/save agreement — all lie
outside it, so a survivor that sees a peer fail holds a completed step. Each rank's boundary file of
step k is written once the forward of step k's last micro-batch is done, before its backward: the
backward and the update draw no random number and move no data, so the rank's RNG and data position
are already those of the end of step k. A rank that took part in step k's gradient all-reduce has
therefore always left its file of step k, wherever it is killed after, and a survivor that finished
step k finds every rank's file. (Written once the backward returned instead, a rank killed between
its peer's end of the all-reduce and its own write left none: 1 kill in 25 of rank 0 at a random
moment; written after the update, every kill inside the update too.) A
backward or an optimizer that does draw (stochastic rounding, noise) is caught after the update by
comparing the RNG states, and the file is written again from the state the update left. An
`on_step` hook runs after the update: it must not draw from the global RNGs (the examples' fault hook
does not) or the JIT checkpoint's RNG would be the one before it.

Several survivors may try: each writes its own staging directory and publishes with an exclusive
rename, so the first complete copy wins and the others discard theirs. ZeRO-3 (DeepSpeed) shards the
state across ranks, so no survivor holds it all: no JIT there, the periodic checkpoint rules.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from spx.daemon.contract import checkpoint_layout as layout
from spx.trainer import layout_writer, rng
from spx.trainer.checkpoint import SHARED_FILE, rank_file

log = logging.getLogger("spx.trainer")

BOUNDARY_PREFIX = ".spx-boundary-"
"""Boundary directories are named BOUNDARY_PREFIX + the attempt's token (hidden: never a checkpoint)."""

KEEP_BOUNDARIES = 2
"""Boundary files each rank keeps: a survivor can be one step behind a peer that died."""


def boundary_name(rank: int, step: int) -> str:
    return f"rank-{rank:05d}.step-{step:09d}.pt"


class BoundaryLog:
    """This rank's rank state at each step boundary, in `directory` (shared by the host's ranks)."""

    def __init__(self, directory: Path, rank: int) -> None:
        self.dir = Path(directory)
        self.rank = rank
        self.step: int | None = None
        self._written: list[int] = []
        self.dir.mkdir(parents=True, exist_ok=True)

    def path(self, rank: int, step: int) -> Path:
        return self.dir / boundary_name(rank, step)

    def record(self, step: int, rank_state: dict) -> None:
        """Write this rank's state of the end of `step` (rename-atomic, not fsynced: it serves a
        survivor on the same host, not a host crash) and drop files older than KEEP_BOUNDARIES."""
        target = self.path(self.rank, step)
        part = target.with_name(target.name + ".part")
        torch.save(rank_state, part)
        os.replace(part, target)
        if not self._written or self._written[-1] != step:
            self._written.append(step)
        while len(self._written) > KEEP_BOUNDARIES:
            self.path(self.rank, self._written.pop(0)).unlink(missing_ok=True)

    def last_steps(self, ranks: list[int]) -> dict[int, int | None]:
        """The newest step each of `ranks` left a file of (None: none): how far behind a dead rank was."""
        found: dict[int, int | None] = dict.fromkeys(ranks)
        for f in self.dir.glob("rank-*.step-*.pt"):
            rank, _, step = f.stem.partition(".step-")
            r = int(rank.removeprefix("rank-"))
            if r in found:
                found[r] = max(found[r] or 0, int(step))
        return found

    def invalidate(self) -> None:
        """The model is being updated: until `updated`, no step's state is in memory."""
        self.step = None

    def updated(self, step: int) -> None:
        """The update of `step` is done: the model in memory is that step's."""
        self.step = step

    def close(self) -> None:
        """Remove this rank's files (at the end of a run; a survivor of a failure keeps them)."""
        for step in self._written:
            self.path(self.rank, step).unlink(missing_ok=True)
        self._written.clear()
        try:
            self.dir.rmdir()
        except OSError:
            pass  # other ranks' files are still there, or someone else removed it


def save_jit(
    ckpt_dir: Path,
    *,
    step: int,
    epoch: int,
    rank: int,
    world_size: int,
    token: str,
    fmt: str,
    shared_state: dict,
    boundaries: BoundaryLog,
    checksums: bool = True,
) -> Path | None:
    """Publish the checkpoint of `step` from this rank's `shared_state` and every rank's boundary
    file; None when it cannot be exact (a rank's boundary file is missing) or another survivor (or
    the periodic save) already published `step`."""
    final = ckpt_dir / layout.step_dirname(step)
    if layout.read_manifest(final) is not None:
        log.info("JIT checkpoint: step %d is already complete in %s", step, ckpt_dir)
        return None
    missing = [r for r in range(world_size) if not boundaries.path(r, step).exists()]
    if missing:
        log.warning("JIT checkpoint of step %d impossible: ranks %s left no state of that step (their last: %s); "
                    "the periodic checkpoint is the resume point", step, missing, boundaries.last_steps(missing))
        return None
    staging = ckpt_dir / layout.tmp_dirname(step, f"{token}-jit{rank}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        part = staging / (SHARED_FILE + ".part")
        torch.save(shared_state, part)
        os.replace(part, staging / SHARED_FILE)
        for r in range(world_size):
            shutil.copyfile(boundaries.path(r, step), staging / rank_file(r))
        manifest = layout_writer.build_manifest(
            staging, step=step, epoch=epoch, world_size=world_size, fmt=fmt, checksums=checksums,
            extra={"token": token, "jit": True, "saved_by_rank": rank},
        )
        published = layout_writer.publish(staging, manifest, replace=False)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if published is None:
        shutil.rmtree(staging, ignore_errors=True)
        log.info("JIT checkpoint: another survivor published step %d first", step)
        return None
    return published


def sweep_boundaries(parent: Path, live_token: str) -> None:
    """Remove boundary directories of earlier attempts under `parent` (each node's local rank 0, at start-up)."""
    try:
        entries = list(parent.iterdir())
    except OSError:
        return
    for p in entries:
        if p.name.startswith(BOUNDARY_PREFIX) and p.name != BOUNDARY_PREFIX + live_token:
            shutil.rmtree(p, ignore_errors=True)


class JitCheckpoint:
    """The loop's side of JIT checkpointing: brackets each optimizer update, and turns a collective
    that raised (a peer died or was stopped) into the checkpoint of the last completed step.

    Disabled (every call a no-op) for one rank, for a trainer whose state is sharded, or by config.
    """

    def __init__(self, *, enabled: bool, boundary_parent: Path, ckpt_dir: Path, rank: int, world_size: int,
                 token: str, fmt: str, checksums: bool, local_rank: int = 0) -> None:
        self.ckpt_dir, self.rank, self.world_size = ckpt_dir, rank, world_size
        self.token, self.fmt, self.checksums = token, fmt, checksums
        self.peer_failed = False
        self.saved: Path | None = None
        # Set when checkpoints go to the local tier: retention and the (synchronous) replica.
        self.on_published: Callable[[Path], None] | None = None
        self.boundaries: BoundaryLog | None = None
        self._recorded: tuple[int, dict] = (0, {})  # the step whose file was written last, and its rank state
        if enabled and world_size > 1:
            if local_rank == 0:  # the boundary parent is host-local: each node sweeps its own
                sweep_boundaries(boundary_parent, token)
            self.boundaries = BoundaryLog(boundary_parent / (BOUNDARY_PREFIX + token), rank)

    def record(self, step: int, rank_state: Callable[[], dict]) -> None:
        """The forward of `step`'s last micro-batch is done: write this rank's state of the end of
        `step` now, before the backward's all-reduce (module docstring)."""
        if self.boundaries is not None:
            self._recorded = (step, rank_state())
            self.boundaries.record(*self._recorded)

    def before_update(self) -> None:
        if self.boundaries is not None:
            self.boundaries.invalidate()

    def after_update(self, step: int, rank_state: Callable[[], dict]) -> None:
        """`step`'s update is done. Its file is written again from the state now when it was not
        written before the backward (a trainer whose micro-batch ignores `before_backward`) or when
        the backward or the update drew from an RNG since: the file must hold the end of the step."""
        if self.boundaries is None:
            return
        recorded_step, recorded = self._recorded
        if recorded_step != step or not rng.same(recorded["rng"], rng.capture()):
            self.boundaries.record(step, rank_state())
        self.boundaries.updated(step)

    @contextlib.contextmanager
    def watch(self, full_state: Callable[[], dict | None]) -> Iterator[None]:
        """Around code whose collectives fail when a peer fails: on an exception, save the JIT
        checkpoint (if the state is that of a completed step), then let the exception go on."""
        try:
            yield
        except Exception as exc:
            self.peer_failed = True
            self._save(full_state, exc)
            raise

    def _save(self, full_state: Callable[[], dict | None], exc: Exception) -> None:
        b = self.boundaries
        if b is None or b.step is None:
            return
        state = full_state()
        if state is None:
            return
        step = b.step
        rank_state = torch.load(b.path(self.rank, step), weights_only=True)
        log.warning("a collective failed at step %d (%s): writing the JIT checkpoint of step %d", step + 1,
                    str(exc).splitlines()[0][:200], step)
        started = time.monotonic()
        try:
            self.saved = save_jit(self.ckpt_dir, step=step, epoch=int(rank_state["progress"]["epoch"]),
                                  rank=self.rank, world_size=self.world_size, token=self.token, fmt=self.fmt,
                                  shared_state=state, boundaries=b, checksums=self.checksums)
        except Exception as err:  # the original failure is what the caller must see
            log.error("JIT checkpoint of step %d failed: %r", step, err)
            return
        if self.saved is not None:
            log.warning("JIT checkpoint %s published in %.2f s", self.saved, time.monotonic() - started)
            if self.on_published is not None:
                try:
                    self.on_published(self.saved)
                except Exception as err:
                    log.error("JIT checkpoint %s not replicated: %r", self.saved, err)

    def close(self) -> None:
        """Drop this rank's boundary files, unless a peer failed (a survivor may still need them;
        the next attempt's rank 0 sweeps them)."""
        if self.boundaries is not None and not self.peer_failed:
            self.boundaries.close()
