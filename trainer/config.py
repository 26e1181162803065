"""What a training run is configured with; every field has a default that is safe on 1 CPU."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from spx.daemon.contract.worker_env import (
    ENV_CHECKPOINT_DIR,
    ENV_HEARTBEAT_FILE,
    ENV_LOCAL_CHECKPOINT_DIR,
    StepRanges,
    checkpoint_keep,
)
from spx.trainer.divergence import SpikeRule


@dataclass
class TrainerConfig:
    """Knobs of `Trainer`. Steps are global optimizer steps (they never restart at an epoch)."""

    max_steps: int | None = None
    """Stop after this many optimizer steps (None: run `max_epochs`)."""
    max_epochs: int | None = None
    """Stop after this many passes over the data (None: run `max_steps`)."""
    grad_accum_steps: int = 1
    """Micro-batches per optimizer step; DDP syncs gradients only on the last one."""
    max_grad_norm: float | None = None
    """Clip the global gradient norm to this before each optimizer step."""
    seed: int = 0
    """Base seed; rank r seeds python/numpy/torch with seed + r, the sampler shuffles with seed."""
    bf16: bool | str = "auto"
    """bf16 autocast: True, False, or "auto" = on CUDA with bf16 support, and on CPUs with native
    bf16 (AVX512-BF16/AMX) — emulated bf16 on older CPUs is slower than fp32."""
    gradient_checkpointing: bool = False
    """Recompute activations in backward (HF `gradient_checkpointing_enable()` or block-wise)."""
    deterministic: bool = True
    """torch.use_deterministic_algorithms, needed for bitwise-exact resume."""
    checkpoint_dir: str | None = None
    """Where checkpoints go; SPX_CHECKPOINT_DIR (set by the daemon) wins, default ./checkpoints."""
    checkpoint_every_steps: int | None = None
    """Checkpoint at global steps that are multiples of this (never at step 0)."""
    checkpoint_every_seconds: float | None = None
    """Also checkpoint when this much time has passed since the last one (agreed across ranks)."""
    keep: int = 3
    """Complete checkpoints to keep; older ones are deleted after a newer one is published. A job
    file's `checkpoints.keep` (SPX_CHECKPOINT_KEEP, set by the daemon only when the file sets it) wins."""
    async_checkpoint: bool = True
    """Write periodic checkpoints in the background (the loop pays only the host copy)."""
    save_final: bool = True
    """Write a checkpoint of the last step when training ends."""
    resume: bool = True
    """Resume from SPX_RESUME_FROM or the latest complete checkpoint in checkpoint_dir."""
    heartbeat_file: str | None = None
    """Progress file for the daemon; SPX_HEARTBEAT_FILE wins."""
    checksums: bool = True
    """Record sha256 of every checkpoint file in the manifest."""
    publish_timeout_seconds: float = 600.0
    """How long rank 0 waits for the other ranks' files before declaring a save failed."""
    log_every_steps: int = 10
    """Rank 0 logs step, loss and samples/s this often (0: never; reading the loss syncs the GPU)."""
    local_checkpoint: bool = True
    """Checkpoint to SPX_LOCAL_CHECKPOINT_DIR (host RAM) first and replicate to checkpoint_dir in the
    background, when the daemon gives a local dir, every rank is on this host and it has room."""
    jit_checkpoint: bool = True
    """DDP: when a peer fails, a surviving rank saves the last completed step before it exits."""
    rank_timing_every_steps: int = 20
    """Every this many steps, all ranks all-gather their forward time (one float each) and the
    heartbeat carries the list, so the daemon can name a slow rank and its GPU's evidence (0: off).
    Measured cost on the trainer bench: see bench/bench_trainer_loop.py."""
    rank_timing_windows: int = 3
    """The heartbeat carries each rank's best of its last this many windows: the daemon calls a rank
    slow only once it was slow over all of them (rank_timing_every_steps × this steps)."""
    handle_sigterm: bool = True
    """Turn SIGTERM into checkpoint + exit 75 (EXIT_PREEMPTED)."""
    check_non_finite: bool = True
    """End the attempt (exit 65, EXIT_DIVERGED) at the first step whose loss or gradient norm is
    NaN/Inf on any rank; the daemon rolls the job back to a checkpoint before it. Costs one all-reduce
    of two numbers per step, and reading them syncs the GPU once per step."""
    spike_rule: SpikeRule | None = None
    """Also end it at a loss or gradient norm above median + k · MAD of the recent steps (off: None)."""
    skip_steps: StepRanges = ()
    """(first, last) ranges of steps whose data is consumed untrained, as after a rollback; merged with
    SPX_SKIP_STEPS (the daemon's rollback) and the ranges recorded in the checkpoint resumed from."""
    replay_record: bool = True
    """Write `replay.json` into every checkpoint: each step's loss and gradient norms since the last
    checkpoint (kept on the device, read once per save) and the saved state's hash, so that a
    verification replay (SPX_REPLAY) can find a GPU that computed wrong numbers. DDP takes each rank's
    own gradient norm in a communication hook before the all-reduce."""
    debug_write_delay_seconds: float = 0.0
    """Tests only: hold rank 0's model file half-written this long, to kill a process mid-save."""

    def resolved_checkpoint_dir(self) -> Path:
        return Path(os.environ.get(ENV_CHECKPOINT_DIR) or self.checkpoint_dir or "./checkpoints")

    def resolved_local_checkpoint_dir(self) -> Path | None:
        local = os.environ.get(ENV_LOCAL_CHECKPOINT_DIR)
        return Path(local) if local else None

    def resolved_boundary_parent(self) -> Path:
        """Where each rank's per-step state for a JIT checkpoint goes: the daemon's host-local
        checkpoint dir (RAM) if it gave one, else the checkpoint dir itself."""
        return Path(os.environ.get(ENV_LOCAL_CHECKPOINT_DIR) or self.resolved_checkpoint_dir())

    def resolved_keep(self) -> int:
        return checkpoint_keep(os.environ) or self.keep

    def resolved_heartbeat_file(self) -> str | None:
        return os.environ.get(ENV_HEARTBEAT_FILE) or self.heartbeat_file

    def validate(self) -> None:
        if self.max_steps is None and self.max_epochs is None:
            raise ValueError("set max_steps or max_epochs in TrainerConfig, or the loop never ends")
        if self.grad_accum_steps < 1:
            raise ValueError(f"grad_accum_steps must be >= 1, got {self.grad_accum_steps}")
        if self.checkpoint_every_steps is not None and self.checkpoint_every_steps < 1:
            raise ValueError("checkpoint_every_steps must be >= 1 (or None to save by time only)")
        if self.rank_timing_windows < 1:
            raise ValueError(f"rank_timing_windows must be >= 1, got {self.rank_timing_windows}")
        if self.rank_timing_every_steps < 0:
            raise ValueError(f"rank_timing_every_steps must be >= 0 (0: off), got {self.rank_timing_every_steps}")
        if self.keep < 1:
            raise ValueError(f"keep must be >= 1 (the latest complete checkpoint is never deleted), got {self.keep}")
