"""The spx.trainer loop's steps/s against the seed's plain DDP loop, same model, data and ranks.

    .venv/bin/python bench/bench_trainer_loop.py [--steps 200] [--rounds 3] [--json]

Both loops run inside the same 2-rank torchrun group (gloo on CPU here, nccl on GPUs), in
alternating rounds so that drift of the machine hits both alike; the figure is the median round.
Baseline: the seed's loop (DistributedSampler + set_epoch, forward, backward, AdamW step, no
checkpoint). Candidate: `Trainer.fit` with everything a supervised job uses on: heartbeat file
every second, the per-step stop/time agreement all-reduce, the resumable sampler, the LR
scheduler, per-rank step timing (every 20 steps, the default), and no periodic checkpoint (its cost
is `bench_checkpoint_stall.py`'s subject). Goal (issue 5): ≥ 0.98×. A third loop, the same with
per-rank step timing off, gives that timing's own cost (issue 28, goal: on ≥ 0.98× off); a fourth,
with the replay record off (`replay_record=False`: no per-step norms, no DDP communication hook),
gives the record's (issue 28, goal: on ≥ 0.98× off).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import Goal, write_result

from spx.daemon.run.launcher import free_port

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "examples"))

# Between the examples' tiny and 50m sizes: step time dominated by compute, not Python overhead,
# yet 200 steps on 2 CPU cores in well under a minute.
MODEL = dict(vocab=2048, dim=192, layers=4, heads=6, seq_len=64, dropout=0.1)
BATCH = 8


def plain_loop(steps: int, seed: int) -> float:
    """The seed's loop (on whatever device torch has), timed over `steps` optimizer steps."""
    import torch
    import torch.distributed as dist
    from tinylm import LMConfig, MarkovCorpus, TinyLM
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler

    torch.manual_seed(seed)
    cfg = LMConfig(**MODEL)
    model = DDP(TinyLM(cfg))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dataset = MarkovCorpus(4096, cfg.seq_len, cfg.vocab, seed=seed)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=BATCH, sampler=sampler)
    done = 0
    dist.barrier()
    start = time.perf_counter()
    for epoch in range(10**6):
        sampler.set_epoch(epoch)
        for batch in loader:
            loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            done += 1
            if done == steps:
                dist.barrier()
                return time.perf_counter() - start
    raise AssertionError("unreachable")


def spx_loop(steps: int, seed: int, work: Path, rank_timing: bool = True, replay_record: bool = True) -> float:
    import torch
    import torch.distributed as dist
    from tinylm import LMConfig, MarkovCorpus, TinyLM

    from spx.trainer import Trainer, TrainerConfig

    cfg = LMConfig(**MODEL)
    trainer = Trainer(TrainerConfig(
        max_steps=steps, seed=seed, checkpoint_dir=str(work / f"ck-{time.monotonic_ns()}"),
        checkpoint_every_steps=None, save_final=False, resume=False, log_every_steps=0,
        heartbeat_file=str(work / "heartbeat.json"), deterministic=False,
        rank_timing_every_steps=20 if rank_timing else 0, replay_record=replay_record,
    ))
    model = trainer.wrap(TinyLM(cfg))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    loader = trainer.dataloader(MarkovCorpus(4096, cfg.seq_len, cfg.vocab, seed=seed), batch_size=BATCH)
    dist.barrier()
    start = time.perf_counter()
    trainer.fit(model, optimizer, loader, scheduler=scheduler)
    dist.barrier()
    elapsed = time.perf_counter() - start
    trainer.stop_flag.uninstall()  # keep the group for the next round; close() would destroy it
    return elapsed


def worker(args: argparse.Namespace) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    work = Path(args.work)
    plain_loop(10, seed=1)  # warm-up: allocator, thread pools, gloo connections
    plain, spx, untimed, unrecorded = [], [], [], []
    for r in range(args.rounds):
        plain.append(args.steps / plain_loop(args.steps, seed=r))
        spx.append(args.steps / spx_loop(args.steps, seed=r, work=work))
        untimed.append(args.steps / spx_loop(args.steps, seed=r, work=work, rank_timing=False))
        unrecorded.append(args.steps / spx_loop(args.steps, seed=r, work=work, replay_record=False))
    if dist.get_rank() == 0:
        (work / "result.json").write_text(json.dumps({"plain": plain, "spx": spx, "spx_rank_timing_off": untimed,
                                                      "spx_replay_record_off": unrecorded}))
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", action="store_true")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    with tempfile.TemporaryDirectory(prefix="spx-bench-loop-") as work:
        subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2",
             "--master-addr=127.0.0.1", f"--master-port={free_port()}", __file__, "--worker", "--work", work,
             "--steps", str(args.steps), "--rounds", str(args.rounds)],
            check=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        raw = json.loads((Path(work) / "result.json").read_text())
    plain, spx = statistics.median(raw["plain"]), statistics.median(raw["spx"])
    untimed = statistics.median(raw["spx_rank_timing_off"])
    unrecorded = statistics.median(raw["spx_replay_record_off"])
    # Per round (the loops of one round ran back to back): the spread the median hides.
    record_ratios = [on / off for on, off in zip(raw["spx"], raw["spx_replay_record_off"], strict=True)]
    result = {"steps_per_round": args.steps, "rounds": args.rounds, "plain_steps_per_s": round(plain, 3),
              "spx_steps_per_s": round(spx, 3), "ratio": round(spx / plain, 4),
              "spx_rank_timing_off_steps_per_s": round(untimed, 3), "rank_timing_ratio": round(spx / untimed, 4),
              "spx_replay_record_off_steps_per_s": round(unrecorded, 3),
              "replay_record_ratio": round(spx / unrecorded, 4),
              "replay_record_ratio_per_round": [round(r, 4) for r in record_ratios],
              "goal": ">= 0.98", "raw": raw}
    write_result("trainer_loop", [{k: v for k, v in result.items() if k not in ("goal", "raw")}],
                 [Goal("spx.trainer / plain DDP loop, steps/s", result["ratio"], ">=", 0.98),
                  Goal("per-rank step timing on / off, steps/s", result["rank_timing_ratio"], ">=", 0.98),
                  Goal("replay record on / off, steps/s", result["replay_record_ratio"], ">=", 0.98)])
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(f"seed's plain DDP loop : {plain:8.2f} steps/s (median of {args.rounds} rounds of {args.steps})")
        print(f"spx.trainer loop      : {spx:8.2f} steps/s")
        print(f"ratio                 : {spx / plain:8.3f}  (goal >= 0.98)")
        print(f"rank timing off       : {untimed:8.2f} steps/s")
        print(f"timing on / off       : {spx / untimed:8.3f}  (goal >= 0.98)")
        print(f"replay record off     : {unrecorded:8.2f} steps/s")
        print(f"record on / off       : {spx / unrecorded:8.3f}  (goal >= 0.98; per round "
              f"{', '.join(f'{r:.3f}' for r in record_ratios)})")


if __name__ == "__main__":
    main()
