"""The script most people bring: a plain DDP loop on torch alone — no spx.trainer, no heartbeat, no
checkpoint — for bench_recovery's `--plain` case (a relaunch that cannot be told of a first step).

    torchrun --nproc-per-node 2 bench/plain_ddp.py --first-step-file F [--sleep-per-step 0.1]

Rank 0 appends `time.time()` to F after its first optimizer step of each start (the bench's only
way to see a first step), then trains until killed.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--first-step-file", required=True)
    ap.add_argument("--sleep-per-step", type=float, default=0.1)
    a = ap.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(7)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = 0
    while True:
        x = torch.randn(16, 64)
        loss = (model(x) - x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if step == 1 and int(os.environ.get("RANK", "0")) == 0:
            with open(a.first_step_file, "a") as f:
                f.write(f"{time.time()}\n")
        time.sleep(a.sleep_per_step)


if __name__ == "__main__":
    main()
