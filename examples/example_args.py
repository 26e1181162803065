"""Flags and fault injection shared by `train_ddp.py` and `train_deepspeed.py`.

The fault flags act in the daemon's first attempt only (`SPX_ATTEMPT`, 1 when run by hand), so a
job that crashes or hangs once shows the restart, and its relaunch runs clean; and never in a
verification replay (`SPX_REPLAY`), which must compute what a healthy GPU computes.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Callable

import torch

from spx.daemon.contract.worker_env import ENV_REPLAY, attempt_number, parse_skip_steps
from spx.trainer import TrainerConfig
from spx.trainer.loop import default_loss


def common_parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    # The seed's flags.
    p.add_argument("--batch_size", type=int, default=8, help="micro-batch size per rank")
    p.add_argument("--gradient_checkpointing", action="store_true", help="recompute activations in backward")
    # Run length, checkpoints, model.
    p.add_argument("--steps", type=int, default=60, help="global optimizer steps to train")
    p.add_argument("--checkpoint-every", type=int, default=10, help="checkpoint every K steps (0: only at the end)")
    p.add_argument("--checkpoint-every-seconds", type=float, default=None, help="also checkpoint every S seconds")
    p.add_argument("--checkpoint-dir", default=None, help="default: $SPX_CHECKPOINT_DIR, else ./checkpoints")
    p.add_argument("--keep", type=int, default=3, help="complete checkpoints to keep")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--model-size", choices=["tiny", "50m"], default="tiny")
    p.add_argument("--dataset-size", type=int, default=256, help="sequences in the synthetic corpus")
    # Fault injection (tests, demo).
    p.add_argument("--crash-at-step", type=int, default=None, help="raise at step K (first attempt only)")
    p.add_argument("--hang-at-step", type=int, default=None, help="stop making progress at step K (first attempt only)")
    p.add_argument("--no-jit-checkpoint", action="store_true",
                   help="no JIT checkpoint when a peer fails (a restart resumes from the last periodic one)")
    p.add_argument("--sleep-per-step", type=float, default=0.0, help="slow each step down (to watch or kill it)")
    p.add_argument("--slow-rank", type=int, default=None,
                   help="this global rank's forward computes --slow-rank-seconds longer per micro-batch (a slow GPU)")
    p.add_argument("--slow-rank-seconds", type=float, default=0.05)
    p.add_argument("--rank-timing-every", type=int, default=20,
                   help="gather per-rank step times every K steps for the daemon (0: off)")
    p.add_argument("--kill-in-update-at", type=int, default=None,
                   help="SIGKILL --kill-in-update-rank inside step K's optimizer update (train_ddp.py; first attempt only)")
    p.add_argument("--kill-in-update-rank", type=int, default=1)
    p.add_argument("--corrupt-grad-step", type=int, default=None,
                   help="at step K, --corrupt-grad-rank's own gradient of one weight is off by 1e-3 before the "
                        "all-reduce, as a faulty GPU's arithmetic (first attempt only, never in a replay)")
    p.add_argument("--corrupt-grad-rank", type=int, default=0)
    p.add_argument("--poison-step", type=int, action="append", default=[],
                   help="rank 0's batch of step K holds poison: its loss is NaN (every attempt; repeatable)")
    p.add_argument("--skip-steps", type=parse_skip_steps, default=(),
                   help="skip the data of these steps, e.g. 31-37 (as a divergence rollback does)")
    p.add_argument("--debug-write-delay", type=float, default=0.0,
                   help="hold each checkpoint's model file half-written this long (to kill mid-write)")
    return p


def trainer_config(args: argparse.Namespace) -> TrainerConfig:
    """The `TrainerConfig` these flags describe."""
    return TrainerConfig(
        max_steps=args.steps,
        seed=args.seed,
        gradient_checkpointing=args.gradient_checkpointing,
        checkpoint_dir=args.checkpoint_dir,
        checkpoint_every_steps=args.checkpoint_every or None,
        checkpoint_every_seconds=args.checkpoint_every_seconds,
        keep=args.keep,
        debug_write_delay_seconds=args.debug_write_delay,
        rank_timing_every_steps=args.rank_timing_every,
        jit_checkpoint=not args.no_jit_checkpoint,
        skip_steps=args.skip_steps,
    )


def slow_rank_loss(args: argparse.Namespace, rank: int):
    """The loss function for `--slow-rank`: on that rank, the forward first computes for
    `--slow-rank-seconds` of CPU time, as a throttled GPU takes longer over the same work (every
    attempt: a slow GPU stays slow); None on the others."""
    if args.slow_rank is None or args.slow_rank != rank:
        return None
    from spx.trainer.loop import default_loss

    def slow_loss(model, batch):
        began = time.process_time()
        while time.process_time() - began < args.slow_rank_seconds:
            pass
        return default_loss(model, batch)

    return slow_loss


def print_final_hash(trainer) -> None:
    """`final_state_sha256=<hex>` on rank 0 (the fingerprint is a collective for ZeRO-3)."""
    digest = trainer.state_sha256()
    if trainer.is_main:
        print(f"final_state_sha256={digest}", flush=True)


def poisoned_loss(args: argparse.Namespace, trainer, base=None):
    """`base` (default: the trainer's default loss), NaN on rank 0's batch of each `--poison-step`
    (no poison: `base` as it is). The poison is in the data: an attempt that trains that step's batch
    meets it again; one that skips the step's data (a rollback, SPX_SKIP_STEPS) never does."""
    if not args.poison_step:
        return base
    poisoned = set(args.poison_step)
    inner = base or default_loss

    def loss_fn(model, batch) -> torch.Tensor:
        loss = inner(model, batch)
        if trainer.is_main and trainer.progress.step + 1 in poisoned:
            return loss * float("nan")
        return loss

    return loss_fn


def faults_apply() -> bool:
    """Fault flags act in the first attempt only, and never in a verification replay."""
    return attempt_number() == 1 and os.environ.get(ENV_REPLAY) is None


def corrupt_grad(args: argparse.Namespace, trainer, module: torch.nn.Module) -> None:
    """`--corrupt-grad-step`: a hook on the first parameter's gradient, on `--corrupt-grad-rank`, adds 1e-3
    to one of its values in that step's backward. A tensor hook runs before DDP copies the gradient
    into its bucket, so the rank's own gradient is wrong before the all-reduce spreads it, as with a
    GPU that computed it wrong; training stays finite."""
    if args.corrupt_grad_step is None or trainer.dist.rank != args.corrupt_grad_rank or not faults_apply():
        return
    param = next(module.parameters())

    def corrupt(grad: torch.Tensor) -> torch.Tensor:
        if trainer.progress.step + 1 != args.corrupt_grad_step:
            return grad
        print(f"injected gradient error at step {args.corrupt_grad_step} on rank {trainer.dist.rank} "
              "(--corrupt-grad-step)", flush=True)
        wrong = grad.clone()
        wrong.view(-1)[0] += 1e-3
        return wrong

    param.register_hook(corrupt)


def kill_in_update(args: argparse.Namespace, trainer, optimizer: torch.optim.Optimizer) -> None:
    """`--kill-in-update-at`: the rank dies inside its optimizer update (a step pre-hook), after its
    backward took part in the step's all-reduce and before its parameters changed: the one moment a
    survivor has finished a step this rank has not."""
    if args.kill_in_update_at is None or trainer.dist.rank != args.kill_in_update_rank or not faults_apply():
        return

    def die(opt, a, kw) -> None:
        if trainer.progress.step + 1 == args.kill_in_update_at:  # the step counter moves after the update
            print(f"rank {trainer.dist.rank} killed inside the update of step {args.kill_in_update_at} "
                  "(--kill-in-update-at)", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    optimizer.register_step_pre_hook(die)


class InjectedCrash(RuntimeError):
    pass


def fault_hook(args: argparse.Namespace):
    """The `on_step` hook that realises the fault flags."""
    first_attempt = faults_apply()

    def on_step(trainer, step: int, loss: torch.Tensor) -> None:
        if args.sleep_per_step:
            time.sleep(args.sleep_per_step)
        if first_attempt and args.crash_at_step is not None and step == args.crash_at_step:
            raise InjectedCrash(f"injected crash at step {step} (--crash-at-step)")
        if first_attempt and args.hang_at_step is not None and step == args.hang_at_step:
            print(f"injected hang at step {step} (--hang-at-step): sleeping forever", flush=True)
            while True:
                time.sleep(3600)

    return on_step


def run_main(main: Callable[[], object]) -> None:
    """Run `main()` and leave without the interpreter's teardown however it ended: with its exit
    status (1 and the traceback, through the installed excepthook, for an exception; the code of a
    SystemExit, e.g. 75 for a preemption). A failing rank's teardown with torch loaded takes 0.6-1.4 s
    on the CPU host (and can deadlock, see `exit_without_teardown`), and its launcher waits for it
    before it can exit, so every recovery paid it (`spx status --timeline`: kill → launcher_exit).
    What `main()` returns (the trainer, holding the DDP module) stays referenced until the exit: freed
    earlier, as main's frame ends, the module destroys gloo's process group holding the GIL while a gloo
    thread may still need the GIL to free the last collective's tensors — that deadlock hung one
    verification replay in six here, whose last act before `close()` is a collective."""
    try:
        _kept = main()  # referenced until os._exit (see above)
    except SystemExit as e:
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
        exit_without_teardown(e.code if isinstance(e.code, int) else 0 if e.code is None else 1)
    except BaseException:
        sys.excepthook(*sys.exc_info())  # torch.distributed's hook prefixes the rank, as uncaught
        exit_without_teardown(1)
    exit_without_teardown(0)


def exit_without_teardown(code: int = 0) -> None:
    """Leave once `main()` returned (training done, final checkpoint saved, output printed) without
    the interpreter's teardown: there, freeing the DDP module destroys torch's gloo process group
    while holding the GIL, and its destructor joins a gloo thread that waits for the GIL — a
    deadlock seen with torch 2.13 on CPU. The daemon would catch it (a hang after "finished") but
    only after a minute."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
