"""A few steps of `spx.trainer` on the GPUs, reporting what the trainer chose (not a test module).

    python -m torch.distributed.run --nproc-per-node=N tests/gpu/ddp_backend_probe.py CHECKPOINT_DIR

Every rank prints one `SPX_PROBE {json}` line: its rank and world, the process-group backend
(`torch.distributed.get_backend()`), the trainer's device and bf16 decision, the dtype and device
of a Linear layer's output inside the training step (bf16 only under autocast), the parameters'
dtype (fp32 master weights), whether the model is DDP-wrapped, the steps trained, and the sum of
one all-reduce of a 1 from every rank. The trainer
itself logs none of this, hence the probe.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from tinylm import SIZES, MarkovCorpus, TinyLM  # noqa: E402

from spx.trainer import Trainer, TrainerConfig  # noqa: E402

STEPS = 3


def main() -> None:
    trainer = Trainer(TrainerConfig(max_steps=STEPS, resume=False, save_final=False, log_every_steps=0,
                                    checkpoint_dir=sys.argv[1]))
    try:
        lm = SIZES["tiny"]
        model = trainer.wrap(TinyLM(lm))
        seen: list[tuple[str, str]] = []
        trainer.module.blocks[0].qkv.register_forward_hook(
            lambda m, i, out: seen.append((str(out.dtype), str(out.device))))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        result = trainer.fit(model, optimizer, trainer.dataloader(MarkovCorpus(64, lm.seq_len, lm.vocab), batch_size=4))
        # One all-reduce through the trainer's process group on its device: with one rank the
        # trainer makes no collective call (no DDP wrap) and NCCL creates its communicator lazily,
        # so this is what proves the backend really reduces on the GPU, in any world size.
        reduced = torch.ones(1, device=trainer.device)
        if dist.is_initialized():
            dist.all_reduce(reduced)
        report = {
            "rank": trainer.dist.rank,
            "world": trainer.dist.world_size,
            "backend": dist.get_backend() if dist.is_initialized() else None,
            "device": str(trainer.device),
            "device_name": torch.cuda.get_device_name(trainer.device) if trainer.device.type == "cuda" else None,
            "bf16": trainer.bf16,
            "forward_dtypes": sorted({d for d, _ in seen}),
            "forward_devices": sorted({d for _, d in seen}),
            "param_dtypes": sorted({str(p.dtype) for p in model.parameters()}),
            "ddp": isinstance(model, DDP),
            "steps": result.step,
            "all_reduce": reduced.item(),
            "nccl_version": ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None,
        }
        print("SPX_PROBE " + json.dumps(report), flush=True)
    finally:
        trainer.close()


if __name__ == "__main__":
    main()
    # Skip interpreter teardown: freeing the DDP model right after its last gloo all-reduce can
    # deadlock (~ProcessGroupGloo joins its worker thread while holding the GIL, and that thread
    # needs the GIL to free the finished work's tensors; pytorch/pytorch#56297). Seen on CPU in 2 of
    # 5 runs of this probe, which exits straight after `fit`; the report is already printed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
