"""What a daemon restart costs a running job: job restarts and lost training seconds per restart,
relaunching (before issue 14) against adopting (now), measured in the same run.

    .venv/bin/python bench/bench_daemon_restart.py [--restarts 3] [--steps 240]

One real 2-worker DDP job (examples/train_ddp.py, gloo on CPU, a checkpoint every 40 steps) runs
three times on a fresh daemon each:
- reference: no daemon restart — its wall time (first attempt's start → its end) is the floor;
- relaunch: the daemon is stopped and started RESTARTS times while the job trains. A stop gives the
  job SIGTERM, its checkpoint and a relaunch from it on the next start: exactly what every daemon
  restart (crash, watchdog, upgrade) did to every running job before jobs outlived the daemon;
- adopt: the daemon is killed with SIGKILL and started RESTARTS times: the new daemon adopts the
  running attempt as it is.
Lost seconds per restart = (the job's wall time − the reference's) / RESTARTS. Goal (issue 14): 0 job
restarts and ~0 lost seconds per daemon restart when adopting.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import daemon_query  # noqa: E402
from benchlib import Goal, write_result  # noqa: E402

from harness import EXAMPLES, Daemon, wait_for  # noqa: E402

PY = sys.executable


def job_yaml(name: str, steps: int) -> str:
    args = ["--batch_size", "4", "--model-size", "tiny", "--seed", "7", "--steps", str(steps),
            "--checkpoint-every", "40", "--sleep-per-step", "0.1"]
    argv = ", ".join(f'"{a}"' for a in args)
    return (f"name: {name}\nlauncher: torchrun\nscript: {EXAMPLES / 'train_ddp.py'}\npython: {PY}\n"
            f"args: [{argv}]\nprocs: 2\nstop: {{grace_seconds: 60}}\n")


def run(mode: str, restarts: int, steps: int, base: Path) -> tuple[int, float]:
    """(attempts, the job's wall time from its first attempt's start to its end)."""
    d = Daemon(base / mode)
    d.start()
    try:
        d.drop(f"{mode}.yaml", job_yaml(mode, steps))
        for i in range(restarts):
            # Restarts spread over the run, each once the job has trained past the next mark.
            mark = (i + 1) * steps // (restarts + 2)
            wait_for(lambda m=mark: ((daemon_query.job(d.root, mode) or {}).get("step") or 0) >= m, 600, f"step {mark}",
                     interval=0.5)
            if mode == "adopt":
                d.kill9()
            elif mode == "relaunch":
                d.stop()
            d.start()
        wait_for(lambda: (daemon_query.job(d.root, mode) or {}).get("state") in ("succeeded", "failed"), 900,
                 "the job's end", interval=0.5)
        st = d.status(mode)
        assert st["state"] == "succeeded", st
        history = st["history"]
        return len(history), history[-1]["end"] - history[0]["start"]
    finally:
        d.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--restarts", type=int, default=3)
    ap.add_argument("--steps", type=int, default=240)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="spx-bench-restart-") as tmp:
        base = Path(tmp)
        t0 = time.time()
        _, reference = run("reference", 0, a.steps, base)
        results = {mode: run(mode, a.restarts, a.steps, base) for mode in ("relaunch", "adopt")}
    print(f"job: 2-worker DDP, {a.steps} steps; {a.restarts} daemon restarts; reference wall {reference:.1f} s")
    print(f"{'mode':<10} {'attempts':>8} {'wall s':>8} {'job restarts / daemon restart':>30} {'lost s / daemon restart':>24}")
    for mode, (attempts, wall) in results.items():
        print(f"{mode:<10} {attempts:>8} {wall:>8.1f} {(attempts - 1) / a.restarts:>30.2f} "
              f"{(wall - reference) / a.restarts:>24.1f}")
    relaunch_lost = (results["relaunch"][1] - reference) / a.restarts
    adopt_lost = (results["adopt"][1] - reference) / a.restarts
    print(f"lost seconds per daemon restart: adopt {adopt_lost:.1f} vs relaunch {relaunch_lost:.1f} "
          f"(bench took {time.time() - t0:.0f} s)")
    rows = [{"mode": "reference", "attempts": 1, "wall_s": round(reference, 1)}]
    rows += [{"mode": mode, "attempts": attempts, "wall_s": round(wall, 1),
              "job_restarts_per_daemon_restart": round((attempts - 1) / a.restarts, 2),
              "lost_s_per_daemon_restart": round((wall - reference) / a.restarts, 1)} for mode, (attempts, wall) in results.items()]
    write_result("daemon_restart", rows, [
        Goal("adopt: job restarts per daemon restart", (results["adopt"][0] - 1) / a.restarts, "==", 0),
        Goal("adopt: job wall / reference wall", round(results["adopt"][1] / reference, 3), "<=", 1.05),
    ])
    return 0 if results["adopt"][0] == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
