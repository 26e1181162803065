"""A DeepSpeed ZeRO-3 training script on spx.trainer.

    deepspeed --num_gpus=2 examples/train_deepspeed.py --deepspeed --deepspeed_config examples/ds_config.json
    spx submit examples/jobs/deepspeed-zero3.yaml      # the same, supervised by the daemon

`examples/ds_config.json` is a plain DeepSpeed config (ZeRO-3, optimizer and parameters
offloaded to CPU, bf16, micro-batch 1 × 8 accumulation steps); it runs on GPUs and, with
DeepSpeed's CPU accelerator and gloo, on CPU. Checkpoints are DeepSpeed's own sharded ones inside
the spx layout, written by every rank and published by rank 0 once all are done.
`--batch_size` overrides the config's micro-batch size. Rank 0 prints `final_state_sha256=<hex>`.
"""

from __future__ import annotations

from example_args import common_parser, fault_hook, print_final_hash, run_main, trainer_config
from tinylm import SIZES, MarkovCorpus, TinyLM

from spx.trainer import DeepSpeedTrainer


def main() -> object:
    """Train; returns the trainer, which `run_main` keeps referenced until the process exits."""
    parser = common_parser(__doc__.splitlines()[0])
    parser.set_defaults(batch_size=None, steps=20, lr=1e-3)
    # What the `deepspeed` launcher and the seed pass.
    parser.add_argument("--deepspeed", action="store_true", help="(accepted for the deepspeed launcher)")
    parser.add_argument("--deepspeed_config", default="ds_config.json")
    parser.add_argument("--local_rank", type=int, default=None, help="(set by the deepspeed launcher)")
    args = parser.parse_args()
    trainer = DeepSpeedTrainer(trainer_config(args), args.deepspeed_config, micro_batch_size=args.batch_size)
    try:
        lm = SIZES[args.model_size]
        engine = trainer.wrap(TinyLM(lm), lr=args.lr, weight_decay=0.01)
        loader = trainer.dataloader(MarkovCorpus(args.dataset_size, lm.seq_len, lm.vocab, seed=args.seed))
        trainer.fit(engine, loader, on_step=fault_hook(args))
        print_final_hash(trainer)
    finally:
        trainer.close()
    return trainer


if __name__ == "__main__":
    run_main(main)
