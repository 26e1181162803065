"""`DeepSpeedTrainer`: the same loop on a DeepSpeed ZeRO-3 engine.

    trainer = DeepSpeedTrainer(TrainerConfig(max_steps=1000, checkpoint_every_steps=100), "ds_config.json")
    engine = trainer.wrap(MyModel(), lr=3e-4)           # ZeRO-3 engine from the ds_config
    loader = trainer.dataloader(dataset)                # micro-batch size from the ds_config
    trainer.fit(engine, loader)

Parameters, gradients and optimizer state are sharded, so every rank writes its own shards:
`engine.save_checkpoint` is a collective and runs on the main thread (synchronous), into the same
staging directory as the rank files; rank 0 writes the manifest only after every rank finished,
so a half-written DeepSpeed checkpoint is never "latest". Gradient accumulation is the engine's
(`gradient_accumulation_steps` in the ds_config); the engine also owns bf16.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from spx.trainer.checkpoint import atomic_json_save
from spx.trainer.grad_ckpt import enable_gradient_checkpointing
from spx.trainer.hashing import state_sha256
from spx.trainer.loop import FitResult, StepHook, TrainingLoop, default_loss
from spx.trainer.replay_chain import RECORD

log = logging.getLogger("spx.trainer")

ENGINE_TAG = "engine"
"""The DeepSpeed tag inside each `step-N/` directory (the step is the directory's name)."""


def load_ds_config(source: str | Path | dict, micro_batch_size: int | None = None) -> dict:
    """The ds_config as a dict, with `train_micro_batch_size_per_gpu` overridden if given (the
    seed's `--batch_size` flag)."""
    config = dict(source) if isinstance(source, dict) else json.loads(Path(source).read_text())
    if micro_batch_size is not None:
        config["train_micro_batch_size_per_gpu"] = micro_batch_size
        config.pop("train_batch_size", None)  # derived again by DeepSpeed from micro × accum × world
    return config


class DeepSpeedTrainer(TrainingLoop):
    FORMAT = "spx-deepspeed"

    def __init__(self, config: Any, ds_config: str | Path | dict, *, micro_batch_size: int | None = None,
                 **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        self.ds_config = load_ds_config(ds_config, micro_batch_size)
        self._accum_steps = int(self.ds_config.get("gradient_accumulation_steps", 1))
        if config.grad_accum_steps not in (1, self._accum_steps):
            log.warning("grad_accum_steps=%d ignored: the ds_config's gradient_accumulation_steps=%d rules",
                        config.grad_accum_steps, self._accum_steps)
        self.engine: Any = None
        self.loss_fn: Any = default_loss
        zero = self.ds_config.get("zero_optimization", {})
        log.info("DeepSpeed ZeRO-%s on %d rank(s): %s on %s, %s", zero.get("stage", 0), self.dist.world_size,
                 self.dist.backend, self.device, "bf16" if self.ds_config.get("bf16", {}).get("enabled") else "fp32")

    def _offloads_optimizer(self) -> bool:
        zero = self.ds_config.get("zero_optimization", {})
        return zero.get("offload_optimizer", {}).get("device") == "cpu"

    def wrap(self, model: nn.Module, *, lr: float = 1e-4, weight_decay: float = 0.0, scheduler_fn: Any = None,
             optimizer: Any = None) -> Any:
        """Build the engine. Without `optimizer`, AdamW: DeepSpeed's CPU Adam when the ds_config
        offloads the optimizer to CPU (the only optimizer ZeRO-Offload runs well with), torch's
        otherwise. `scheduler_fn(optimizer)` builds an LR scheduler the engine steps and saves."""
        import deepspeed

        if self.config.gradient_checkpointing:
            enable_gradient_checkpointing(model)
        if optimizer is None:
            params = [p for p in model.parameters() if p.requires_grad]
            if self._offloads_optimizer():
                from deepspeed.ops.adam import DeepSpeedCPUAdam

                optimizer = DeepSpeedCPUAdam(params, lr=lr, weight_decay=weight_decay)
            else:
                optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
        scheduler = scheduler_fn(optimizer) if scheduler_fn is not None else None
        engine, _, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=scheduler, config=self.ds_config,
            dist_init_required=False,
        )
        self.engine = engine
        return engine

    def dataloader(self, dataset: Any, *, batch_size: int | None = None, **loader_kwargs: Any) -> Any:
        size = batch_size or int(self.ds_config.get("train_micro_batch_size_per_gpu", 1))
        return super().dataloader(dataset, batch_size=size, **loader_kwargs)

    def fit(self, engine: Any, loader: Any, *, loss_fn: Any = None, on_step: StepHook | None = None) -> FitResult:
        """Train until `max_steps`/`max_epochs`, resuming first; raises `Preempted` after a SIGTERM
        checkpoint."""
        self.engine = engine
        self.loss_fn = loss_fn or default_loss
        return self._run(loader, on_step)

    # ---- hooks of the shared loop -------------------------------------------------------------

    def _train_micro_batch(self, batch: Any, boundary: bool,
                           before_backward: Callable[[], None] | None = None) -> torch.Tensor:
        loss = self.loss_fn(self.engine, batch)
        if before_backward is not None:
            before_backward()
        self.engine.backward(loss)
        self.engine.step()  # the engine steps the optimizer itself at its accumulation boundary
        if boundary and not self.engine.was_step_applied():
            raise RuntimeError(
                "DeepSpeed skipped an optimizer step the loop expected (gradient overflow or mismatched "
                "gradient_accumulation_steps); the step counter would drift from the engine's"
            )
        return loss.detach()

    def _optimizer_step(self) -> None:
        """Nothing: `engine.step()` already applied it at the boundary micro-batch."""

    def _record_norms(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The engine's global gradient norm; no rank's own norm (ZeRO-3 reduce-scatters gradients
        inside the engine, where no hook of ours sees them before the reduction)."""
        norm = self.engine.get_global_grad_norm()
        return (None if norm is None else torch.as_tensor(norm, device=self.device).float()), None

    def _save(self, *, blocking: bool) -> None:
        p = self.progress
        record = self._take_record(p.step)
        digest = self.state_sha256() if self.recorder is not None else None  # a collective: every rank

        def write_engine(staging: Path) -> None:
            self.engine.save_checkpoint(str(staging), tag=ENGINE_TAG, save_latest=False)
            if record is not None:
                atomic_json_save({**record, "state_sha256": digest}, staging / RECORD)

        self.checkpointer.save_collective(p.step, p.epoch, self._rank_state(), write_engine)

    def _load(self, path: Path) -> tuple[dict, dict]:
        _, mine, manifest = self.checkpointer.load(path, shared=False)
        loaded, _ = self.engine.load_checkpoint(
            str(path), tag=ENGINE_TAG, load_optimizer_states=True, load_lr_scheduler_states=True
        )
        if loaded is None:
            raise RuntimeError(f"DeepSpeed could not load {path}/{ENGINE_TAG}")
        return mine, manifest

    def state_sha256(self) -> str | None:
        """Gathers the ZeRO-3 shards (a collective: every rank calls it)."""
        import deepspeed

        module = self.engine.module
        with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
            return state_sha256(module.state_dict()) if self.is_main else None
