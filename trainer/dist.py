"""Process-group setup and the few collectives the trainer itself needs.

One `DistContext` per process. Under torchrun/deepspeed (RANK and WORLD_SIZE set) it joins the
process group: nccl when CUDA is available, gloo otherwise, device `cuda:LOCAL_RANK` or `cpu`.
Run as a plain `python script.py` it is a world of one and no group is created.

Control decisions (stop on SIGTERM, time-based checkpoint due) must be taken by all ranks at the
same step, so they are all-reduced. With nccl that goes through a separate gloo group on CPU
tensors: a CUDA all-reduce plus `.item()` would synchronise the GPU stream every step.
"""

from __future__ import annotations

import datetime
import os
from typing import Any

import torch
import torch.distributed as dist


class DistContext:
    """Rank, world, device and the control group of this process."""

    def __init__(self, backend: str | None = None, timeout_seconds: float = 1800.0) -> None:
        self.launched = "RANK" in os.environ and "WORLD_SIZE" in os.environ
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if torch.cuda.is_available():
            self.device = torch.device("cuda", self.local_rank % torch.cuda.device_count())
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")
        self.backend = backend or ("nccl" if self.device.type == "cuda" else "gloo")
        self._owns_group = False
        self.control_group: Any = None
        if self.launched and not dist.is_initialized():
            dist.init_process_group(self.backend, timeout=datetime.timedelta(seconds=timeout_seconds))
            self._owns_group = True
        if dist.is_initialized():
            self.backend = dist.get_backend()
            # gloo already runs on CPU tensors; anything else gets a CPU side channel.
            self.control_group = None if self.backend == "gloo" else dist.new_group(backend="gloo")
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world_size = dist.get_world_size() if dist.is_initialized() else 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return dist.is_initialized() and self.world_size > 1

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank (one small pickle over the control group)."""
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.control_group)
        return box[0]

    def any_true(self, *flags: bool) -> tuple[bool, ...]:
        """Element-wise OR of `flags` over all ranks, so every rank takes the same decision."""
        if not self.distributed:
            return tuple(bool(f) for f in flags)
        t = torch.tensor([1 if f else 0 for f in flags], dtype=torch.int32)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.control_group)
        return tuple(bool(v) for v in t.tolist())

    def sum_over_ranks(self, values: torch.Tensor) -> list[float]:
        """Element-wise sum of `values` (on this rank's device) over all ranks, as floats on every
        rank. NaN on one rank is NaN in the sum everywhere, so every rank judges the same numbers."""
        if self.distributed:
            dist.all_reduce(values, op=dist.ReduceOp.SUM)
        return [float(v) for v in values.tolist()]

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier(group=self.control_group)

    def close(self) -> None:
        """Destroy the process group if this context created it (idempotent)."""
        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()
        self._owns_group = False
