"""How long a checkpoint stops training: spx's async save vs a synchronous `torch.save`.

    .venv/bin/python bench/bench_checkpoint_stall.py [--model-size 50m] [--repeats 3] [--json]

The state is the examples' 50m model (≈67 M parameters) with its AdamW moments after one step
(≈0.8 GB), written to a directory on the same filesystem as the benchmark's temp dir (override
with --dir to measure /checkpoints). Baseline: the seed's `torch.save(state, path)` (without even
an fsync, so the baseline is flattered). Candidate: `Checkpointer.save(blocking=False)` — the
time until the training loop gets control back (the host snapshot into reused buffers); the
serialisation, fsync, manifest and publish run in the background. The background write competes
for CPU with training, so the time of training steps taken while it runs is reported too.
Goal (issue 5): stall ≤ 0.2× the synchronous save.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from benchlib import Goal, write_result

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "examples"))
from tinylm import SIZES, MarkovCorpus, TinyLM, parameter_count  # noqa: E402

from spx.daemon.contract import checkpoint_layout as layout  # noqa: E402
from spx.trainer.checkpoint import Checkpointer  # noqa: E402


def train_step(model, optimizer, batch) -> float:
    start = time.perf_counter()
    model(**batch).loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-size", default="50m", choices=sorted(SIZES))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    torch.manual_seed(0)
    cfg = SIZES[args.model_size]
    model = TinyLM(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = MarkovCorpus(16, cfg.seq_len, cfg.vocab)
    batch = {k: torch.stack([data[i][k] for i in range(2)]) for k in ("input_ids", "labels")}
    train_step(model, optimizer, batch)  # creates the AdamW moments: the state is now full size

    def state() -> dict:
        return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}

    state_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values()) * 3
    with tempfile.TemporaryDirectory(prefix="spx-bench-ckpt-", dir=args.dir) as work:
        work_dir = Path(work)
        sync_times = []
        for i in range(args.repeats):
            start = time.perf_counter()
            torch.save(state(), work_dir / f"sync-{i}.pt")
            sync_times.append(time.perf_counter() - start)
            (work_dir / f"sync-{i}.pt").unlink()

        ck = Checkpointer(work_dir / "async", rank=0, world_size=1, token="bench", keep=2)
        stalls, background, step_plain, step_during = [], [], [], []
        for i in range(args.repeats + 1):  # the first save allocates the reused host buffers
            step_plain.append(train_step(model, optimizer, batch))
            start = time.perf_counter()
            ck.save(i + 1, 0, {"rank": 0}, state, blocking=False)
            stall = time.perf_counter() - start
            step_during.append(train_step(model, optimizer, batch))
            error = ck.wait()
            assert error is None, error
            if i:
                stalls.append(stall)
                background.append(time.perf_counter() - start)
        assert layout.latest_complete(work_dir / "async").step == args.repeats + 1

    sync, stall = statistics.median(sync_times), statistics.median(stalls)
    result = {
        "model_size": args.model_size, "parameters": parameter_count(model), "state_bytes": state_bytes,
        "sync_torch_save_s": round(sync, 4), "async_stall_s": round(stall, 4), "ratio": round(stall / sync, 4),
        "goal": "<= 0.2", "async_background_total_s": round(statistics.median(background), 4),
        "step_s_plain": round(statistics.median(step_plain), 4),
        "step_s_during_background_write": round(statistics.median(step_during), 4),
        "raw": {"sync": sync_times, "stall": stalls},
    }
    write_result("checkpoint_stall", [{k: v for k, v in result.items() if k not in ("goal", "raw")}],
                 [Goal("async save stall / synchronous torch.save", result["ratio"], "<=", 0.2)])
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(f"state: {result['parameters'] / 1e6:.1f} M parameters + AdamW moments, {state_bytes / 2**30:.2f} GiB")
    print(f"synchronous torch.save        : {sync:7.3f} s  (training stopped for all of it)")
    print(f"async save, training stalled  : {stall:7.3f} s  (host snapshot)   ratio {stall / sync:.3f}  (goal <= 0.2)")
    print(f"async save, start → published  : {result['async_background_total_s']:7.3f} s  (serialise, checksum, fsync, publish; a step ran meanwhile)")
    print(f"train step alone / during write: {result['step_s_plain']:.3f} s / {result['step_s_during_background_write']:.3f} s")


if __name__ == "__main__":
    main()
