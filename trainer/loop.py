"""The training loop both trainers share: epochs, accumulation, checkpoints, preemption, heartbeat.

Read `fit` top to bottom: resume → for each epoch, point the sampler at the data position →
micro-batches (accumulated) → one optimizer step → heartbeat → checkpoint or stop, agreed by all
ranks. `Trainer` (DDP) and `DeepSpeedTrainer` (ZeRO-3) fill in how a micro-batch is trained, how
state is saved and loaded, and how the model is fingerprinted.

What makes resume exact: the position (`Progress`) and every rank's RNG streams are part of the
checkpoint; the sampler skips consumed indices instead of replaying them; the DataLoader has its
own generator reseeded per epoch; and control decisions (stop, time-based save) are taken by all
ranks at the same step, so no rank trains a step the others did not.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from spx.daemon.contract.worker_env import (
    ENV_REPLAY,
    ENV_SKIP_STEPS,
    Divergence,
    ReplayVerdict,
    format_skip_steps,
    merge_step_ranges,
    parse_replay,
    parse_skip_steps,
)
from spx.trainer import phases, rng
from spx.trainer.checkpoint import Checkpointer, resolve_resume_path
from spx.trainer.config import TrainerConfig
from spx.trainer.data import batches_per_epoch, make_dataloader, start_epoch
from spx.trainer.dist import DistContext
from spx.trainer.divergence import Diverged, DivergenceCheck, skipped
from spx.trainer.heartbeat import HeartbeatWriter, node_heartbeat_file
from spx.trainer.jit import JitCheckpoint
from spx.trainer.preemption import Preempted, StopFlag
from spx.trainer.progress import CheckpointSchedule, Progress
from spx.trainer.rank_timing import RankTimer
from spx.trainer.replay import Replay
from spx.trainer.replay_chain import RECORD_VERSION
from spx.trainer.replay_record import StepRecorder, json_steps
from spx.trainer.tiers import checkpoint_bytes, has_room

log = logging.getLogger("spx.trainer")
phases.mark("torch_imported")  # spx.trainer imports torch first: its import ends about here

StepHook = Callable[["TrainingLoop", int, torch.Tensor], None]
"""`on_step(trainer, step, loss)`: called on every rank after each optimizer step (the step
number is the one just finished); fault injection in the examples uses it."""


@dataclass
class FitResult:
    step: int
    epoch: int
    resumed_from_step: int | None
    checkpoint_failures: int


def _configure_logging(rank: int) -> None:
    """Give `spx.trainer` a stderr handler unless the application configured logging itself."""
    if logging.getLogger().handlers or log.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"%(asctime)s [rank {rank}] %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO if rank == 0 else logging.WARNING)


def move_to(batch: Any, device: torch.device) -> Any:
    """`batch` (tensor, or dict/list/tuple of them) on `device`."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: move_to(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(move_to(v, device) for v in batch)
    return batch


def default_loss(model: Any, batch: Any) -> torch.Tensor:
    """The seed's `model(**batch).loss`; also a model that returns the loss tensor itself."""
    out = model(**batch) if isinstance(batch, dict) else model(batch)
    return out.loss if hasattr(out, "loss") else out


class TrainingLoop:
    """Shared machinery; subclasses implement the `_`-prefixed hooks at the bottom."""

    FORMAT = "spx"
    TIMES_FORWARD = False
    """Whether `_train_micro_batch` times its forward in `rank_timer.forward()` (rank_timing.py): a
    forward that runs no collective (DDP's). ZeRO-3 gathers parameters in forward: not timed."""

    def __init__(self, config: TrainerConfig, dist_ctx: DistContext | None = None) -> None:
        config.validate()
        self.config = config
        replay_env = os.environ.get(ENV_REPLAY)
        self.replay: Replay | None = None if replay_env is None else Replay(parse_replay(replay_env))
        """Set: this run is a verification replay (SPX_REPLAY, replay.py) and writes no checkpoint."""
        if config.deterministic:
            # cuBLAS needs this set before its first handle for deterministic GEMMs.
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.use_deterministic_algorithms(True, warn_only=True)
        self.dist = dist_ctx or DistContext()
        phases.mark("rendezvous")
        _configure_logging(self.dist.rank)
        rng.seed_all(config.seed + self.dist.rank)
        token = self.dist.broadcast_object(uuid.uuid4().hex[:12] if self.dist.is_main else None)
        self.checkpointer = Checkpointer(
            config.resolved_checkpoint_dir(),
            rank=self.dist.rank,
            world_size=self.dist.world_size,
            token=token,
            fmt=self.FORMAT,
            keep=config.resolved_keep(),
            checksums=config.checksums,
            publish_timeout_seconds=config.publish_timeout_seconds,
            debug_write_delay_seconds=config.debug_write_delay_seconds,
            read_only=self.replay is not None,
        )
        self.heartbeat = HeartbeatWriter(node_heartbeat_file(config.resolved_heartbeat_file(), self.dist.local_rank))
        self.rank_timer = RankTimer(config.rank_timing_every_steps if self.TIMES_FORWARD else 0, self.device,
                                    self.dist.distributed, self.dist.control_group, config.rank_timing_windows)
        self.stop_flag = StopFlag()
        if config.handle_sigterm:
            self.stop_flag.install()
        self.progress = Progress()
        self._checkpoint_stall = 0.0  # seconds the loop waited on saves (the heartbeat reports it)
        # A replay compares its values with the records instead: a difference is its verdict, not an exit.
        self.divergence = DivergenceCheck(config.check_non_finite and self.replay is None,
                                          config.spike_rule if self.replay is None else None)
        self.recorder = (StepRecorder(self.device, self.dist.world_size)
                         if config.replay_record or self.replay is not None else None)
        self._last_record: dict | None = None
        # Steps whose data is skipped (a rollback after a divergence): the config's, the daemon's, and those the
        # checkpoint resumed from recorded (`_resume`), so every later resume keeps skipping them.
        self.skip_steps = merge_step_ranges((*config.skip_steps, *parse_skip_steps(os.environ.get(ENV_SKIP_STEPS, ""))))
        self._accum_steps = config.grad_accum_steps
        self.jit = JitCheckpoint(
            enabled=config.jit_checkpoint and self.replay is None
            and type(self)._replicated_state is not TrainingLoop._replicated_state,
            boundary_parent=config.resolved_boundary_parent(), ckpt_dir=self.checkpointer.dir,
            rank=self.dist.rank, world_size=self.dist.world_size, token=token, fmt=self.FORMAT,
            checksums=config.checksums, local_rank=self.dist.local_rank)

    @property
    def is_main(self) -> bool:
        return self.dist.is_main

    @property
    def device(self) -> torch.device:
        return self.dist.device

    def dataloader(self, dataset: Any, *, batch_size: int, **loader_kwargs: Any) -> DataLoader:
        """This rank's shard of `dataset`, reshuffled per epoch, resumable mid-epoch."""
        loader_kwargs.setdefault("pin_memory", self.device.type == "cuda")
        return make_dataloader(
            dataset,
            batch_size=batch_size,
            rank=self.dist.rank,
            world_size=self.dist.world_size,
            seed=self.config.seed,
            **loader_kwargs,
        )

    # ---- the loop -----------------------------------------------------------------------------

    def _run(self, loader: DataLoader, on_step: StepHook | None) -> FitResult:
        cfg = self.config
        resumed_from = self._resume()
        if self.recorder is not None:
            self.recorder.from_step = resumed_from
        phases.mark("checkpoint_loaded")
        per_epoch = batches_per_epoch(loader)
        if per_epoch == 0:
            raise ValueError("the data loader yields no batches on this rank (dataset smaller than world size?)")
        samples_per_step = (loader.batch_size or 1) * self._accum_steps * self.dist.world_size
        schedule = CheckpointSchedule(cfg.checkpoint_every_steps, cfg.checkpoint_every_seconds, time.monotonic())
        saved_step = resumed_from
        p = self.progress
        micro = 0
        while not self._finished():
            if p.batches_in_epoch >= per_epoch:
                p.epoch, p.batches_in_epoch = p.epoch + 1, 0
                continue
            batches = iter(loader)
            for _ in range(start_epoch(loader, p.epoch, p.batches_in_epoch)):
                next(batches)
            for batch in batches:
                micro += 1
                boundary = micro == self._accum_steps
                if skipped(self.skip_steps, p.step + 1):
                    # The data of a step a rollback skips: consumed, never trained on; the step
                    # number still counts it, so step numbers keep naming the same data.
                    p.batches_in_epoch += 1
                    if boundary:
                        micro, p.step = 0, p.step + 1
                        if self._finished():
                            break
                    continue
                with self.jit.watch(self._replicated_state):
                    loss = self._train_micro_batch(move_to(batch, self.device), boundary,
                                                   self._record_boundary if boundary else None)
                p.batches_in_epoch += 1
                if not boundary:
                    continue
                micro = 0
                self.jit.before_update()
                self._optimizer_step()
                p.step += 1
                self.jit.after_update(p.step, self._rank_state)
                self._after_step(loss, samples_per_step, on_step)
                if self.replay is not None and self._replay_checkpoint_reached():
                    break
                now = time.monotonic()
                with self.jit.watch(self._replicated_state):
                    stop, time_due = self.dist.any_true(self.stop_flag.is_set(), self.is_main and schedule.due_by_time(now))
                if self._finished():
                    break
                if stop and self.replay is not None:
                    self.replay.stopped(p.step)
                    break
                if stop:
                    self._preempt()
                if self.replay is None and (schedule.due_by_steps(p.step) or time_due):
                    self._beat(status="checkpointing")  # the daemon's hang clock allows for the save
                    self._stalled_save(blocking=not cfg.async_checkpoint)
                    schedule.saved(now)
                    saved_step = p.step
        if self.replay is not None:
            return self._end_replay(resumed_from)
        error = self.checkpointer.wait()
        if error is not None:
            log.error("the last periodic checkpoint failed: %r", error)
        if cfg.save_final and saved_step != p.step:
            self._stalled_save(blocking=True)
        self._beat(status="finished")
        log.info("training finished at step %d (epoch %d)", p.step, p.epoch)
        return FitResult(p.step, p.epoch, resumed_from, self.checkpointer.failures)

    def _finished(self) -> bool:
        cfg, p = self.config, self.progress
        if self.replay is not None:
            return self.replay.done or p.step >= self.replay.end_step
        return (cfg.max_steps is not None and p.step >= cfg.max_steps) or (
            cfg.max_epochs is not None and p.epoch >= cfg.max_epochs
        )

    def _after_step(self, loss: torch.Tensor, samples: int, on_step: StepHook | None) -> None:
        p = self.progress
        phases.mark("first_step")
        self.rank_timer.step_done()
        if self.recorder is not None:
            self.recorder.step_done(p.step, loss, *self._record_norms())
        loss_value, grad_norm = self._check_divergence(loss)
        self.heartbeat.tick(step=p.step, epoch=p.epoch, samples=samples, last_checkpoint=self.checkpointer.last_published,
                            rank_step_seconds=self.rank_timer.latest, checkpoint_stall=self._checkpoint_stall,
                            loss=loss_value, grad_norm=grad_norm)
        if self.is_main and self.config.log_every_steps and p.step % self.config.log_every_steps == 0:
            log.info("step %d epoch %d loss %.4f %.1f samples/s", p.step, p.epoch, loss.item(),
                     self.heartbeat.samples_per_second)
        if on_step is not None:
            on_step(self, p.step, loss)

    def _check_divergence(self, loss: torch.Tensor) -> tuple[float | None, float | None]:
        """The step's loss (mean over ranks) and gradient norm (None: not measured), after raising
        `Diverged` on every rank if either diverged (the same numbers on every rank: same verdict)."""
        if not self.divergence.enabled:
            return None, None
        norm = self._grad_norm()
        both = torch.stack([loss.detach().float().reshape(()),
                            (norm if norm is not None else torch.zeros((), device=loss.device)).detach().float()])
        with self.jit.watch(self._replicated_state):  # a peer failing here gets its JIT checkpoint too
            total_loss, total_norm = self.dist.sum_over_ranks(both)
        values = {"loss": total_loss / self.dist.world_size,
                  "grad_norm": total_norm / self.dist.world_size if norm is not None else None}
        hit = self.divergence.check(self.progress.step, values)
        if hit is not None:
            self._diverge(hit)
        return values["loss"], values["grad_norm"]

    def _diverge(self, hit: Divergence) -> None:
        """Diverged at this step: nothing of it is saved; say so in the heartbeat, exit 65."""
        log.error("diverged at step %d: %s; exiting for a rollback to an earlier checkpoint", hit.step, hit.describe())
        error = self.checkpointer.wait()  # a save in flight is of an earlier, healthy step
        if error is not None:
            log.error("the last periodic checkpoint failed: %r", error)
        p = self.progress
        self.heartbeat.tick(step=p.step, epoch=p.epoch, samples=0, last_checkpoint=self.checkpointer.last_published,
                            status="diverged", force=True, diverged=hit)
        raise Diverged(hit)

    def _beat(self, status: str) -> None:
        p = self.progress
        self.heartbeat.tick(step=p.step, epoch=p.epoch, samples=0, last_checkpoint=self.checkpointer.last_published,
                            status=status, force=True, checkpoint_stall=self._checkpoint_stall)

    def _stalled_save(self, *, blocking: bool, after_pending: bool = False) -> None:
        """`_save`, its time (and that of waiting for the save still in flight, `after_pending`)
        counted as the loop's checkpoint stall: the daemon's goodput ledger reports it."""
        began = time.monotonic()
        if after_pending:
            self.checkpointer.wait()
        self._save(blocking=blocking)
        self._checkpoint_stall += time.monotonic() - began

    def _preempt(self) -> None:
        """SIGTERM reached every rank at this step: checkpoint it, say so, exit 75."""
        step = self.progress.step
        log.warning("preempted at step %d: writing a checkpoint before exiting", step)
        self._stalled_save(blocking=True, after_pending=True)
        self._beat(status="preempted")
        raise Preempted(step)

    # ---- resume -------------------------------------------------------------------------------

    def _resume(self) -> int | None:
        """Load the checkpoint rank 0 chose (SPX_RESUME_FROM, else the latest complete one)."""
        if self.replay is not None:
            return self._resume_replay()
        chosen, local = None, None
        if self.is_main:
            local_dir = self.config.resolved_local_checkpoint_dir()
            if self.config.resume:
                found = resolve_resume_path(self.checkpointer.dir, local_dir)
                chosen = str(found) if found else None
            local = self._local_tier(local_dir, Path(chosen) if chosen else None)
        chosen, local = self.dist.broadcast_object((chosen, local))
        if local is not None:
            self.checkpointer.use_local_tier(Path(local))
            self.jit.ckpt_dir = self.checkpointer.dir
            self.jit.on_published = lambda final: self.checkpointer.adopt(final, replicate_now=True)
        if self.is_main:
            self.checkpointer.sweep_stale()
            if chosen is not None:
                self.checkpointer.replicate_resumed(Path(chosen))
        if chosen is None:
            log.info("no checkpoint to resume from in %s: starting at step 0", self.checkpointer.dir)
            return None
        return self._load_resume_point(chosen)

    def _load_resume_point(self, chosen: str) -> int:
        rank_state, manifest = self._load(Path(chosen))
        self.progress = Progress.from_state(rank_state["progress"])
        old_world = int(manifest["world_size"])
        if old_world != self.dist.world_size:
            consumed = self.progress.batches_in_epoch * old_world
            self.progress.batches_in_epoch = consumed // self.dist.world_size
            log.warning("checkpoint was written by %d ranks, running on %d: data position rescaled, RNG streams "
                        "reused modulo the old world; the run is no longer bitwise reproducible",
                        old_world, self.dist.world_size)
        rng.restore(rank_state["rng"])
        self.skip_steps = merge_step_ranges((*self.skip_steps, *rank_state.get("skip_steps", ())))
        log.info("resumed from %s: step %d, epoch %d, %d batches into the epoch", chosen, self.progress.step,
                 self.progress.epoch, self.progress.batches_in_epoch)
        if self.skip_steps:
            log.info("skipping the data of steps %s (rolled back after a divergence)", format_skip_steps(self.skip_steps))
        return self.progress.step

    # ---- verification replay (SPX_REPLAY) -------------------------------------------------------

    def _resume_replay(self) -> int | None:
        """Rank 0 plans the replay from the records (replay.py); every rank resumes where it begins.
        Nothing is swept or written in the checkpoint dir."""
        assert self.replay is not None
        plan = self.replay.plan(self.checkpointer.dir, self.dist.world_size) if self.is_main else None
        plan = self.dist.broadcast_object(plan)
        self.replay.adopt(plan)
        self.skip_steps = merge_step_ranges((*self.skip_steps, *self.replay.skip_steps))
        if self.replay.done:
            return None
        if self.replay.start is None:
            log.info("replaying from step 0 to checkpoint %d", self.replay.end_step)
            return None
        log.info("replaying from checkpoint %s to checkpoint %d", self.replay.start, self.replay.end_step)
        return self._load_resume_point(self.replay.start)

    def _replay_checkpoint_reached(self) -> bool:
        """At a checkpoint step of the replayed chain: compare this interval's values and the state hash
        with its record (rank 0), agreed by every rank; True when the replay ends here."""
        assert self.replay is not None and self.recorder is not None
        step = self.progress.step
        if step not in self.replay.checkpoint_steps:
            return False
        _start, steps = self.recorder.take(self.dist.distributed)
        self.recorder.from_step = step
        digest = self.state_sha256()  # a collective for ZeRO-3: every rank
        done = self.replay.check(step, steps, digest) if self.is_main else False
        self.replay.done = bool(self.dist.broadcast_object(done))
        return self.replay.done

    def _end_replay(self, resumed_from: int | None) -> FitResult:
        """Log the verdict, beat it with status "replayed"; no checkpoint is written."""
        assert self.replay is not None
        verdict: ReplayVerdict | None = self.replay.verdict() if self.is_main else None
        if verdict is not None:
            log.info("replay verdict: %s", verdict.describe())
        p = self.progress
        self.heartbeat.tick(step=p.step, epoch=p.epoch, samples=0, last_checkpoint=None, status="replayed",
                            force=True, replay=verdict)
        return FitResult(p.step, p.epoch, resumed_from, 0)

    def _take_record(self, step: int) -> dict | None:
        """The replay record of a checkpoint of `step` (a collective; rank 0 gets it, without its state
        hash), or None when records are off. The interval starts again here."""
        if self.recorder is None:
            return None
        start, steps = self.recorder.take(self.dist.distributed)
        self.recorder.from_step = step
        if not steps and self._last_record is not None and self._last_record["step"] == step:
            return self._last_record  # the same step saved again (SIGTERM right after a periodic save)
        record = {"version": RECORD_VERSION, "from_step": start, "step": step, "world_size": self.dist.world_size,
                  "steps": json_steps(steps)}
        self._last_record = record
        return record if self.is_main else None

    def _local_tier(self, local_dir: Path | None, resume_from: Path | None) -> str | None:
        """Rank 0: the host-local dir to checkpoint into (tiers.py), or None: none given, ranks on
        other hosts, or no room for `keep + 1` checkpoints of the last one's (else the estimated) size."""
        if local_dir is None or not self.config.local_checkpoint:
            return None
        if int(os.environ.get("LOCAL_WORLD_SIZE", self.dist.world_size)) != self.dist.world_size:
            log.info("ranks on several hosts: checkpoints go straight to %s", self.checkpointer.dir)
            return None
        need = (checkpoint_bytes(resume_from) if resume_from else 0) or self._checkpoint_bytes_estimate()
        try:
            local_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            log.warning("local checkpoint dir %s unusable (%r): checkpoints go to %s", local_dir, exc, self.checkpointer.dir)
            return None
        if not has_room(local_dir, need, self.checkpointer.keep):
            log.warning("local checkpoint dir %s lacks room for %d checkpoints of %d MiB: checkpoints go to %s",
                        local_dir, self.checkpointer.keep + 1, need >> 20, self.checkpointer.dir)
            return None
        log.info("checkpoints go to %s first, replicated to %s", local_dir, self.checkpointer.dir)
        return str(local_dir)

    def _checkpoint_bytes_estimate(self) -> int:
        """A checkpoint's size before the first one exists (0: unknown, any free space will do)."""
        return 0

    def _rank_state(self, progress: Progress | None = None) -> dict:
        return {"rng": rng.capture(), "progress": (progress or self.progress).to_state(),
                "skip_steps": [list(r) for r in self.skip_steps]}

    def _record_boundary(self) -> None:
        """Between the forward and the backward of a step's last micro-batch: this rank's state of
        the end of the step (its data consumed, its draws made) for a JIT checkpoint (trainer/jit.py)."""
        p = self.progress
        self.jit.record(p.step + 1, lambda: self._rank_state(Progress(p.step + 1, p.epoch, p.batches_in_epoch + 1)))

    # ---- what a subclass provides -------------------------------------------------------------

    def _train_micro_batch(self, batch: Any, boundary: bool,
                           before_backward: Callable[[], None] | None = None) -> torch.Tensor:
        """Forward + backward of one micro-batch; `boundary` = the last of an optimizer step.
        `before_backward`, if given, is called between the two: it writes the JIT boundary file (one
        that is never called leaves that file to after the update, a wider window: trainer/jit.py)."""
        raise NotImplementedError

    def _optimizer_step(self) -> None:
        raise NotImplementedError

    def _grad_norm(self) -> torch.Tensor | None:
        """The global gradient norm of the last optimizer step, if the step measured it (clipping)."""
        return None

    def _record_norms(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The last step's global gradient norm and this rank's own (before the all-reduce), as device
        tensors for the replay record (None: not measured)."""
        return None, None

    def _replicated_state(self) -> dict | None:
        """The whole model/optimizer/scheduler state when every rank holds all of it (DDP): what a
        survivor saves as the JIT checkpoint. A trainer with sharded state (ZeRO-3) does not
        override this, and gets no JIT checkpoint."""
        return None

    def _save(self, *, blocking: bool) -> None:
        """Checkpoint the current step (all ranks call this at the same step)."""
        raise NotImplementedError

    def _load(self, path: Path) -> tuple[dict, dict]:
        """Load model/optimizer state from `path`; return (this rank's state, manifest)."""
        raise NotImplementedError

    def state_sha256(self) -> str | None:
        """Fingerprint of the full model state (call on every rank; rank 0 gets the hex)."""
        raise NotImplementedError

    def close(self) -> None:
        """Finish any save in flight, restore SIGTERM, leave the process group. After a peer
        failed, a save in flight waits for nobody (the dead rank's file never comes) and the broken
        process group is not torn down (gloo's teardown can block on the dead peer)."""
        if self.jit.peer_failed:
            self.checkpointer.abandon()
        error = self.checkpointer.wait()
        if error is not None:
            log.error("checkpoint in flight at close failed: %r", error)
        error = self.checkpointer.wait_replicas()
        if error is not None:
            log.error("replicating the last checkpoint to the persistent dir failed: %r", error)
        self.jit.close()
        self.stop_flag.uninstall()
        if not self.jit.peer_failed:
            self.dist.close()
