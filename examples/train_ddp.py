"""A DDP training script on spx.trainer.

    torchrun --nproc_per_node=2 --nnodes=1 examples/train_ddp.py --batch_size 8 --gradient_checkpointing
    spx submit examples/jobs/ddp-crash-resume.yaml      # the same, supervised by the daemon

Unlike a plain DDP loop it resumes exactly (model, optimizer, scheduler, every rank's RNG and data
position), checkpoints atomically in the background, checkpoints and exits 75 on SIGTERM, writes
the daemon's heartbeat, and runs on CPU (gloo) as well as GPUs (nccl, bf16). Rank 0 prints
`final_state_sha256=<hex>` at the end, so two runs can be compared bitwise.
"""

from __future__ import annotations

import math

import torch
from example_args import (
    common_parser,
    corrupt_grad,
    fault_hook,
    kill_in_update,
    poisoned_loss,
    print_final_hash,
    run_main,
    slow_rank_loss,
    trainer_config,
)
from tinylm import SIZES, MarkovCorpus, TinyLM

from spx.trainer import Trainer


def warmup_cosine(warmup: int, total: int):
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))

    return factor


def main() -> object:
    """Train; returns the trainer, which `run_main` keeps referenced until the process exits."""
    args = common_parser(__doc__.splitlines()[0]).parse_args()
    trainer = Trainer(trainer_config(args))
    try:
        lm = SIZES[args.model_size]
        model = trainer.wrap(TinyLM(lm))
        corrupt_grad(args, trainer, trainer.module)
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
        kill_in_update(args, trainer, optimizer)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(max(1, args.steps // 10), args.steps))
        loader = trainer.dataloader(MarkovCorpus(args.dataset_size, lm.seq_len, lm.vocab, seed=args.seed),
                                    batch_size=args.batch_size)
        trainer.fit(model, optimizer, loader, scheduler=scheduler, on_step=fault_hook(args),
                    loss_fn=poisoned_loss(args, trainer, base=slow_rank_loss(args, trainer.dist.rank)))
        print_final_hash(trainer)
    finally:
        trainer.close()
    return trainer


if __name__ == "__main__":
    run_main(main)
