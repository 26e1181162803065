"""Each step's loss and gradient norms, kept on the device until a checkpoint writes them down.

What a replay record (replay_chain.py) holds per step: the loss (mean over ranks), the global
gradient norm (of the averaged gradients, after the all-reduce) and each rank's norm of its *own*
gradient before the all-reduce. The last is what names a faulty GPU: its wrong arithmetic shows in
its own gradient first, before the all-reduce spreads it to every rank. DDP hands each bucket of
local gradients to a communication hook before reducing it (`local_norm_hook`), so the norms are
taken there, per parameter, and summed in parameter order at the step's end: the bucket layout
(which DDP rebuilds after the first backward of a process, so a resumed run's first step has another
one) then changes nothing in the sum.

Nothing here syncs the host per step: the values stay in a device buffer (one row per step) and are
read, with one all-gather of every rank's rows, only when a checkpoint is written (`take`).
"""

from __future__ import annotations

from collections import deque
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

from spx.daemon.contract.worker_env import metric_json
from spx.trainer.replay_chain import MAX_RECORD_STEPS, StepValues


def total_norm(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The 2-norm of `tensors` together: each one's norm, then the norm of those, in list order."""
    return torch.linalg.vector_norm(torch.stack([n.float() for n in torch._foreach_norm(tensors)]))


class StepRecorder:
    """The per-step values of the current interval: from `from_step` (None: step 0) to the last step."""

    def __init__(self, device: torch.device, world_size: int, from_step: int | None = None,
                 capacity: int = MAX_RECORD_STEPS) -> None:
        self.device, self.world_size, self.capacity = device, world_size, capacity
        self.from_step = from_step
        self._rows: torch.Tensor | None = None  # capacity × (loss, grad norm, own grad norm)
        self._steps: deque[int] = deque(maxlen=capacity)
        self._next = 0  # the row the next step goes to (a ring)
        self._truncated = False  # more steps than `capacity` since the last take: the first are gone
        self.has_grad_norm = True
        self.has_rank_norms = True
        self._param_index: dict[int, int] = {}
        self._bucket_norms: dict[int, tuple[list[int], torch.Tensor]] = {}
        self._orders: dict[tuple[int, ...], torch.Tensor] = {}

    # ---- DDP: each rank's own gradient norm, before the all-reduce -----------------------------

    def local_norm_hook(self, params: list[torch.nn.Parameter]) -> Any:
        """A DDP communication hook (register with `ddp.register_comm_hook(None, hook)`): the norm of
        each parameter's local gradient in the bucket, then DDP's default all-reduce."""
        self._param_index = {id(p): i for i, p in enumerate(params)}

        def hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP rejects string annotations
            """(process group, dist.GradBucket) → the future of the averaged bucket."""
            indices = [self._param_index[id(p)] for p in bucket.parameters()]
            self._bucket_norms[bucket.index()] = (indices, torch.stack(torch._foreach_norm(bucket.gradients())))
            return allreduce_hook(state, bucket)

        return hook

    def own_grad_norm(self) -> torch.Tensor | None:
        """This step's norm of this rank's own gradient (from the hook), in parameter order; None
        when no hook ran (one rank, no DDP: the caller uses the global norm)."""
        if not self._bucket_norms:
            return None
        parts = [self._bucket_norms[i] for i in sorted(self._bucket_norms)]
        self._bucket_norms = {}
        indices = tuple(i for idx, _ in parts for i in idx)
        order = self._orders.get(indices)
        if order is None:
            order = self._orders[indices] = torch.tensor(sorted(range(len(indices)), key=indices.__getitem__),
                                                        device=self.device)
        return torch.linalg.vector_norm(torch.cat([n.float() for _, n in parts])[order])

    def discard_pending(self) -> None:
        """Forget norms of a backward that updated nothing (the exact-resume shadow backward)."""
        self._bucket_norms = {}

    # ---- per step, and at a checkpoint --------------------------------------------------------

    def step_done(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor | None,
                  own_norm: torch.Tensor | None) -> None:
        """Keep step `step`'s values (device tensors; nothing is read to the host here)."""
        if self._rows is None:
            self._rows = torch.zeros(self.capacity, 3, dtype=torch.float32, device=self.device)
        self.has_grad_norm = grad_norm is not None
        self.has_rank_norms = own_norm is not None
        zero = torch.zeros((), device=loss.device)
        row = torch.stack([loss.detach().float().reshape(()), (grad_norm if grad_norm is not None else zero).float(),
                           (own_norm if own_norm is not None else zero).float()])
        self._rows[self._next].copy_(row)
        self._truncated = self._truncated or len(self._steps) == self.capacity
        self._next = (self._next + 1) % self.capacity
        self._steps.append(step)

    def take(self, distributed: bool) -> tuple[int | None, list[StepValues]]:
        """(the interval's start, its steps as [step, loss, grad_norm, own norms of every rank or None])
        since the last take, read with one all-gather (a collective: every rank calls it at the same
        step). Beyond `capacity` steps the first ones are gone and the start moves up to match."""
        steps = list(self._steps)
        start = steps[0] - 1 if self._truncated else self.from_step
        self._truncated = False
        if not steps:
            return start, []
        assert self._rows is not None
        first = (self._next - len(steps)) % self.capacity
        rows = self._rows[[(first + i) % self.capacity for i in range(len(steps))]]
        if distributed:
            gathered = [torch.empty_like(rows) for _ in range(self.world_size)]
            dist.all_gather(gathered, rows)
            per_rank = [g.tolist() for g in gathered]
        else:
            per_rank = [rows.tolist()]
        self._steps.clear()
        out: list[StepValues] = []
        for i, step in enumerate(steps):
            loss = sum(rank[i][0] for rank in per_rank) / self.world_size
            grad = per_rank[0][i][1] if self.has_grad_norm else None
            own = [rank[i][2] for rank in per_rank] if self.has_rank_norms else None
            out.append([step, loss, grad, own])
        return start, out


def json_steps(steps: list[StepValues]) -> list[StepValues]:
    """`steps` as a record holds them: NaN/±Inf as the strings metric_json writes."""
    return [[s, metric_json(loss), metric_json(grad), None if own is None else [metric_json(v) for v in own]]
            for s, loss, grad, own in steps]

