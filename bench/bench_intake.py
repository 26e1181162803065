"""Spool drop → job queued latency, against a bare inotify watcher measured in the same run.

    .venv/bin/python bench/bench_intake.py [--drops 50]

Baseline: a plain watchdog observer in this process, timing rename → its moved-to event (the floor
any inotify-based intake can reach). Candidate: the real daemon (subprocess), timing rename → its
`job_queued` log line (claim with O_NOFOLLOW + fstat, parse, validate, fsync the copy, commit).
Goal (issue 3): well under 100 ms.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

from benchlib import Goal, write_result
from watchdog.events import FileSystemEventHandler
from watchdog.observers import Observer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from harness import Daemon  # noqa: E402

JOB = f"name: {{name}}\nlauncher: python\nscript: {__file__}\ngpus: 64\n"  # an existing script (checked at intake); 64 GPUs: queued, never runs


def bare_watcher(dir_: Path, drops: int) -> list[float]:
    seen: dict[str, float] = {}
    cond = threading.Condition()

    class H(FileSystemEventHandler):
        def on_moved(self, event):
            with cond:
                seen[Path(str(event.dest_path)).name] = time.time()
                cond.notify_all()

    obs = Observer()
    obs.schedule(H(), str(dir_))
    obs.start()
    lat = []
    try:
        for i in range(drops):
            tmp, final = dir_ / f".b{i}.tmp", dir_ / f"b{i}.yaml"
            tmp.write_text(JOB.format(name=f"b{i}"))
            t0 = time.time()
            tmp.rename(final)
            with cond:
                cond.wait_for(lambda n=final.name: n in seen, timeout=5)
            lat.append(seen[final.name] - t0)
    finally:
        obs.stop()
        obs.join()
    return lat


def daemon_latency(root: Path, drops: int) -> list[float]:
    d = Daemon(root, gpu_backend="none").start()
    lat = []
    try:
        for i in range(drops):
            name = f"d{i}"
            tmp = d.spool / f".{name}.tmp"
            tmp.write_text(JOB.format(name=name))
            t0 = time.time()
            tmp.rename(d.spool / f"{name}.yaml")
            ev = d.wait_event("job_queued", job=name, timeout=10)
            lat.append(datetime.fromisoformat(ev["timestamp"]).timestamp() - t0)
    finally:
        d.stop()
    return lat


def summary(xs: list[float]) -> tuple[float, float]:
    xs = sorted(xs)
    return statistics.median(xs) * 1000, xs[int(0.95 * (len(xs) - 1))] * 1000


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--drops", type=int, default=50)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "bare"
        base.mkdir()
        b50, b95 = summary(bare_watcher(base, args.drops))
        d50, d95 = summary(daemon_latency(Path(tmp) / "root", args.drops))
    print(f"{'':28}{'p50 ms':>10}{'p95 ms':>10}")
    print(f"{'baseline: bare inotify':28}{b50:10.2f}{b95:10.2f}")
    print(f"{'spx-trainer drop→queued':28}{d50:10.2f}{d95:10.2f}")
    write_result("intake", [{"case": "baseline: bare inotify", "p50_ms": round(b50, 2), "p95_ms": round(b95, 2)},
                            {"case": "spx-trainer drop→queued", "p50_ms": round(d50, 2), "p95_ms": round(d95, 2)}],
                 [Goal("spx drop→queued p95", round(d95, 2), "<=", 100, "ms")])
    print(f"ratio (daemon / bare): p50 {d50 / b50:.1f}×, p95 {d95 / b95:.1f}×; goal p95 < 100 ms: "
          f"{'met' if d95 < 100 else 'NOT met'}")


if __name__ == "__main__":
    main()
