"""`Trainer`: the seed's DDP loop, done right (see `loop.py` for the loop itself).

    trainer = Trainer(TrainerConfig(max_steps=1000, checkpoint_every_steps=100))
    model = trainer.wrap(MyModel())                      # device, grad checkpointing, DDP
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    loader = trainer.dataloader(dataset, batch_size=32)  # sharded, resumable
    trainer.fit(model, optimizer, loader, scheduler=scheduler)

Rank 0 saves the model, optimizer and scheduler (identical on every DDP rank); every rank saves its
own RNG streams and data position. Periodic saves are asynchronous: the step pays for a copy of
the state into reused host buffers, a background thread serialises, fsyncs and publishes.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from spx.trainer import rng
from spx.trainer.grad_ckpt import enable_gradient_checkpointing
from spx.trainer.hashing import state_sha256
from spx.trainer.loop import FitResult, StepHook, TrainingLoop, default_loss
from spx.trainer.precision import autocast_context, resolve_bf16
from spx.trainer.replay_record import total_norm

log = logging.getLogger("spx.trainer")

LossFn = Any  # Callable[[model, batch], torch.Tensor]


class Trainer(TrainingLoop):
    FORMAT = "spx-ddp"
    TIMES_FORWARD = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.bf16 = resolve_bf16(self.config.bf16, self.device)
        log.info("DDP on %d rank(s): %s on %s, %s", self.dist.world_size, self.dist.backend, self.device,
                 "bf16 autocast" if self.bf16 else "fp32")
        self.model: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: Any = None
        self.loss_fn: LossFn = default_loss
        self._last_grad_norm: torch.Tensor | None = None  # clip_grad_norm_'s answer, when clipping
        self._step_grad_norm: torch.Tensor | None = None  # the global one the replay record keeps
        self._settle_buckets = False  # a resumed run's first step waits for DDP's bucket rebuild (_shadow_backward)

    def wrap(self, model: nn.Module) -> nn.Module:
        """Move `model` to this rank's device, enable gradient checkpointing if configured, and
        wrap it in DDP when there is more than one rank. Build the optimizer on the result."""
        if self.config.gradient_checkpointing:
            enable_gradient_checkpointing(model)
        model = model.to(self.device)
        if self.dist.distributed:
            model = DDP(model, device_ids=[self.device] if self.device.type == "cuda" else None)
            if self.recorder is not None:  # each rank's own gradient norm, before the all-reduce
                model.register_comm_hook(None, self.recorder.local_norm_hook(list(model.module.parameters())))
        self.model = model
        return model

    @property
    def module(self) -> nn.Module:
        """The user's model, without the DDP wrapper."""
        assert self.model is not None, "call wrap(model) first"
        return self.model.module if isinstance(self.model, DDP) else self.model

    def fit(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        loader: Any,
        *,
        scheduler: Any = None,
        loss_fn: LossFn | None = None,
        on_step: StepHook | None = None,
    ) -> FitResult:
        """Train until `max_steps`/`max_epochs`, resuming first if a checkpoint exists.

        Raises `Preempted` (exit status 75) after the SIGTERM checkpoint.
        """
        self.model = model
        self.optimizer, self.scheduler = optimizer, scheduler
        self.loss_fn = loss_fn or default_loss
        return self._run(loader, on_step)

    # ---- hooks of the shared loop -------------------------------------------------------------

    def _train_micro_batch(self, batch: Any, boundary: bool,
                           before_backward: Callable[[], None] | None = None) -> torch.Tensor:
        assert self.model is not None
        if self._settle_buckets:
            self._settle_buckets = False
            if isinstance(self.model, DDP) and self.dist.world_size > 2:
                self._shadow_backward(batch)
        # DDP all-reduces gradients in backward; skip that on all but the last micro-batch.
        sync = self.model.no_sync() if isinstance(self.model, DDP) and not boundary else contextlib.nullcontext()
        with sync:
            with autocast_context(self.device, self.bf16), self.rank_timer.forward():
                loss = self.loss_fn(self.model, batch)
            if before_backward is not None:
                before_backward()
            (loss / self._accum_steps).backward()
        return loss.detach()

    def _shadow_backward(self, batch: Any) -> None:
        """Exact resume with more than two ranks. DDP all-reduces the first backward of a process in
        its initial bucket layout and rebuilds the buckets (in the order gradients became ready) at
        the next forward; a ring all-reduce sums each element in an order set by its place in the
        bucket, and with three or more ranks float addition depends on that order. The uninterrupted
        run trained step k+1 in the rebuilt layout, so a run resumed at step k must too: one
        forward and backward on the batch about to be trained, whose gradients are dropped and whose
        every side effect (RNG streams, buffers such as BatchNorm statistics) is undone, makes DDP
        rebuild its buckets before the real step. With two ranks a + b == b + a: not needed."""
        assert self.model is not None
        started = time.monotonic()
        streams = rng.capture()
        buffers = [b.detach().clone() for b in self.module.buffers()]
        with autocast_context(self.device, self.bf16):
            loss = self.loss_fn(self.model, batch)
        loss.backward()
        self.model.zero_grad(set_to_none=True)
        if self.recorder is not None:
            self.recorder.discard_pending()
        with torch.no_grad():
            for live, kept in zip(self.module.buffers(), buffers, strict=True):
                live.copy_(kept)
        rng.restore(streams)
        log.info("resumed on %d ranks: one backward without an update (%.2f s) so that DDP's gradient buckets are "
                 "laid out as in the uninterrupted run (exact resume)", self.dist.world_size, time.monotonic() - started)

    def _optimizer_step(self) -> None:
        assert self.optimizer is not None
        self._last_grad_norm = None
        if self.recorder is not None:
            self._step_grad_norm = total_norm([p.grad for p in self.module.parameters() if p.grad is not None])
        if self.config.max_grad_norm is not None:
            self._last_grad_norm = torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.config.max_grad_norm)
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _grad_norm(self) -> torch.Tensor | None:
        return self._last_grad_norm

    def _record_norms(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """One rank (no DDP, no hook): its own gradient is the global one."""
        assert self.recorder is not None
        own = self.recorder.own_grad_norm()
        if own is None and not self.dist.distributed:
            own = self._step_grad_norm
        return self._step_grad_norm, own

    def _shared_state(self) -> dict:
        assert self.optimizer is not None
        state = {"model": self.module.state_dict(), "optimizer": self.optimizer.state_dict()}
        if self.scheduler is not None:
            state["scheduler"] = self.scheduler.state_dict()
        return state

    def _checkpoint_bytes_estimate(self) -> int:
        """Parameters plus two optimizer moments (AdamW): the optimizer's state is lazy before step 1."""
        return 3 * sum(p.numel() * p.element_size() for p in self.module.parameters())

    def _replicated_state(self) -> dict | None:
        return self._shared_state()

    def _save(self, *, blocking: bool) -> None:
        p = self.progress
        record = self._take_record(p.step)
        self.checkpointer.save(
            p.step,
            p.epoch,
            self._rank_state(),
            self._shared_state if self.is_main else None,
            blocking=blocking,
            replay_record=None if record is None else lambda snapshot: {
                **record, "state_sha256": state_sha256(snapshot["model"])},
        )

    def _load(self, path: Path) -> tuple[dict, dict]:
        assert self.optimizer is not None
        shared, mine, manifest = self.checkpointer.load(path, map_location=self.device)
        assert shared is not None
        self.module.load_state_dict(shared["model"])
        self._settle_buckets = True
        self.optimizer.load_state_dict(shared["optimizer"])
        if self.scheduler is not None and "scheduler" in shared:
            self.scheduler.load_state_dict(shared["scheduler"])
        return mine, manifest

    def state_sha256(self) -> str | None:
        return state_sha256(self.module.state_dict()) if self.is_main else None
