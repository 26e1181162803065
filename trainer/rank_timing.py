"""Per-rank step times, gathered every N steps, for the daemon to find a slow rank (and say why).

A DDP step's wall time is the same on every rank: the gradient all-reduce in backward makes the
fast ranks wait for the slow one. What differs is each rank's own work, so that is what is timed:
the forward pass (data to loss) of each micro-batch, where DDP runs no collective. A throttled GPU
or a starved CPU makes a rank's forward slower in proportion; its wall time would not show it.

On CUDA the forward is timed with CUDA events (recording one does not wait for the GPU; their
elapsed times are read at the gather, N steps later, when they are long done). On CPU it is the
process's CPU time: ranks that share cores (4 ranks on a 2-core test host) would otherwise measure
each other's preemption, not their own work (wall time varied ±30 % per window there, measured). Every `every`
optimizer steps each rank all-gathers one float (its mean forward seconds per step over those
steps) over the control group, so every node's heartbeat writer holds the whole list. What the
heartbeat reports is each rank's best of its last `windows` windows: a rank slow in all of them is
slow, a passing hiccup (a GC pause, a neighbour's burst) is not a straggler.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist


class RankTimer:
    """This rank's forward seconds, summed per window of `every` optimizer steps (0: off)."""

    def __init__(self, every: int, device: torch.device, distributed: bool, group: Any = None,
                 windows: int = 3) -> None:
        self.every = every
        self.cuda = device.type == "cuda"
        self.distributed = distributed
        self.group = group
        self.latest: list[float] | None = [] if every else None
        """Each rank's mean forward seconds per step in its best of the last `windows` windows: empty
        before the first (the daemon then waits for them rather than judge the job's GPUs alone),
        None when timing is off."""
        self._windows: deque[list[float]] = deque(maxlen=windows)
        self._seconds = 0.0
        self._events: list[tuple[Any, Any]] = []
        self._steps = 0

    @contextmanager
    def forward(self) -> Iterator[None]:
        """Time the block as this rank's own work (nothing when off)."""
        if not self.every:
            yield
            return
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self._events.append((start, end))
            return
        began = time.process_time()
        yield
        self._seconds += time.process_time() - began

    def step_done(self) -> None:
        """One optimizer step ended on every rank; every `every` of them, gather (a collective:
        all ranks call this at the same steps)."""
        if not self.every:
            return
        self._steps += 1
        if self._steps < self.every:
            return
        if self._events:  # the last step's kernels may still run: wait for them once per window
            self._events[-1][1].synchronize()
        mine = self._seconds + sum(s.elapsed_time(e) for s, e in self._events) / 1000.0
        mean = mine / self._steps
        self._seconds, self._events, self._steps = 0.0, [], 0
        if self.distributed:
            gathered = [torch.zeros(1, dtype=torch.float64) for _ in range(dist.get_world_size())]
            dist.all_gather(gathered, torch.tensor([mean], dtype=torch.float64), group=self.group)
            self._windows.append([float(t.item()) for t in gathered])
        else:
            self._windows.append([mean])
        self.latest = [min(per_rank) for per_rank in zip(*self._windows, strict=True)]
