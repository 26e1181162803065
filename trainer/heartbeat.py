"""Each node's heartbeat file (docs/job-spec.md, "What the workers get (the contract)"): its daemon's view
of progress.

The daemon detects hangs by watching `step` move and exports samples/s and the last checkpoint as
job metrics. Every host's daemon supervises its own share of a job (docs/multinode.md), so local
rank 0 of each node writes the file its daemon gave (`node_heartbeat_file`): with only global rank 0
writing, the daemons of the other hosts would see no progress and declare a hang. The last
checkpoint is known where it is published, on global rank 0; other nodes report none. Each beat
also says where its node is in torch's numbering (`node_placement`), for `spx status` on each host.

Writes are atomic (`contract.write_heartbeat`) and rate-limited to one per `min_interval` seconds;
a status change ("preempted", "diverged", "finished", "replayed") is written at once because it is the last word of the
attempt.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from spx.daemon.contract.worker_env import (
    HEARTBEAT_MIN_INTERVAL_SECONDS,
    MAX_RANKS_REPORTED,
    Divergence,
    Heartbeat,
    ReplayVerdict,
    write_heartbeat,
)
from spx.trainer import phases

log = logging.getLogger("spx.trainer")


def node_heartbeat_file(configured: str | None, local_rank: int) -> str | None:
    """The heartbeat file this process writes: the `configured` one (SPX_HEARTBEAT_FILE, each
    host's daemon its own) for local rank 0 of its node, none for the node's other ranks. On one host
    local rank 0 is global rank 0."""
    return configured if local_rank == 0 else None


@dataclass(frozen=True)
class NodePlacement:
    """The writer's node in torch's numbering: `node_rank` of `nnodes`, global ranks `first`..`last`."""

    node_rank: int
    nnodes: int
    first: int
    last: int


def node_placement(env: Mapping[str, str]) -> NodePlacement | None:
    """Where this process's node is, from the variables torch's elastic agent sets for each worker
    (GROUP_RANK, GROUP_WORLD_SIZE, RANK, LOCAL_RANK, LOCAL_WORLD_SIZE); None unless all are there
    and consistent (run by hand, or by a launcher that does not set them: the beat omits them).
    The node's ranks are contiguous, RANK - LOCAL_RANK up to that + LOCAL_WORLD_SIZE - 1."""
    try:
        group, groups, rank, local, local_size = (int(env[k]) for k in (
            "GROUP_RANK", "GROUP_WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"))
    except (KeyError, ValueError):
        return None
    first = rank - local
    if not (0 <= group < groups and 0 <= local < local_size and first >= 0):
        return None
    return NodePlacement(node_rank=group, nnodes=groups, first=first, last=first + local_size - 1)


class HeartbeatWriter:
    """Throttled heartbeat; without a `path` (not local rank 0, or no file configured) it only measures
    samples/s. `placement` (default: from this process's environment) goes into every beat."""

    def __init__(self, path: str | Path | None, min_interval: float = HEARTBEAT_MIN_INTERVAL_SECONDS,
                 placement: NodePlacement | None = None) -> None:
        self.path = Path(path) if path else None
        self.placement = placement if placement is not None else node_placement(os.environ)
        self.min_interval = max(min_interval, HEARTBEAT_MIN_INTERVAL_SECONDS)
        self._last_write = float("-inf")
        self._window_start = time.monotonic()
        self._window_samples = 0
        self.samples_per_second = 0.0
        self._rank_step_seconds: list[float] | None = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def tick(
        self,
        *,
        step: int,
        epoch: int,
        samples: int,
        last_checkpoint: tuple[int, float] | None,
        status: str = "running",
        force: bool = False,
        rank_step_seconds: list[float] | None = None,
        checkpoint_stall: float | None = None,
        loss: float | None = None,
        grad_norm: float | None = None,
        diverged: Divergence | None = None,
        replay: ReplayVerdict | None = None,
    ) -> None:
        """Account `samples` processed since the last tick; write if the interval passed.
        `rank_step_seconds`: every rank's forward seconds per step (rank_timing.py), if gathered;
        `checkpoint_stall`: seconds the loop has waited on checkpoint saves so far."""
        if rank_step_seconds is not None:
            self._rank_step_seconds = rank_step_seconds
        self._window_samples += samples
        now = time.monotonic()
        if not force and now - self._last_write < self.min_interval:
            return
        elapsed = now - self._window_start
        if elapsed > 0 and self._window_samples:
            self.samples_per_second = self._window_samples / elapsed
        self._window_start, self._window_samples = now, 0
        self._last_write = now
        if self.path is None:
            return
        beat = Heartbeat(
            step=step,
            epoch=epoch,
            samples_per_second=round(self.samples_per_second, 3),
            last_checkpoint_step=last_checkpoint[0] if last_checkpoint else None,
            last_checkpoint_time=last_checkpoint[1] if last_checkpoint else None,
            status=status,
            phases=phases.recorded() or None,
            rank_step_seconds=[round(s, 6) for s in self._rank_step_seconds[:MAX_RANKS_REPORTED]]
            if self._rank_step_seconds is not None else None,
            checkpoint_stall_seconds=None if checkpoint_stall is None else round(checkpoint_stall, 3),
            loss=loss,
            grad_norm=grad_norm,
            diverged=diverged,
            replay=replay,
        )
        if self.placement is not None:
            where = self.placement
            beat.node_rank, beat.nnodes, beat.ranks = where.node_rank, where.nnodes, [where.first, where.last]
        try:
            write_heartbeat(self.path, beat)
        except OSError as exc:  # a full disk must not kill training; the daemon will notice
            log.warning("cannot write heartbeat %s: %r", self.path, exc)
