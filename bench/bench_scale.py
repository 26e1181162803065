"""What the daemon costs as its history and its queue grow: loop turn time, `spx ls` / `spx status` /
`/metrics` latency, store size, RSS and CPU, against finished jobs in the store and queued jobs.

    .venv/bin/python bench/bench_scale.py [--history 1000 10000 100000] [--queued 1 10 100 1000]
                                          [--calls 30] [--idle-seconds 10] [--quick]

Each point is a fresh daemon on the fake 8-GPU fixture (`--gpu-backend fake`, debug log) over a store
seeded before it starts (bench/scale_seed.py: finished jobs with 1–3 attempts, their events, phases and
progress records, written through the store's API; 200 of them ended in the last day, the rest over
the year before, kept: `retention.finished_jobs_days: null`), plus Q queued jobs that really wait:
one job of priority 1000 takes all 8 GPUs at the first turn (a python script that sleeps), so the
queued ones wait for GPUs behind it, head of line. Two curves: history 1,000 / 10,000 / 100,000 at
10 queued, and queued 1 / 10 / 100 / 1,000 at 1,000 finished.

Per point, once the blocker runs and the first turns' one-off work (each queued job's reason) is done:
an idle window (`--idle-seconds`), then `--calls` rounds of `spx ls`, `spx status NAME` (a job that
finished in the last day) and a `/metrics` scrape, interleaved. Measured: the loop's turn time (each
turn's `loop_turn` debug line, `seconds`: the daemon's own measure, also `spx_daemon_loop_turn_seconds`)
over the idle window and the calls, p50/p99; each request's time — over the control socket in this
process (the daemon's answer), and as the `spx` command (what a user waits, a Python start-up
included); the scrape over HTTP; the store's file size (with its WAL); the daemon's RSS at the end
and its CPU seconds (utime + stime) from exec to ready + blocker running ("start") and over the window.

Slopes: a least-squares fit of log(value) on log(size) along each curve — 0 is flat, 1 linear. Goals
(issue 29): flat in finished history (`spx ls` p99 and loop p99 at 100,000 within 1.5× of 1,000),
at most linear in queued jobs (the loop's p99 slope ≤ 1).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchlib import Goal, write_result
from process_tree import cpu_seconds
from scale_seed import BLOCKER, RECENT, seed

from spx.daemon.service import control

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from harness import Daemon, wait_for  # noqa: E402

CONFIG = {"retention": {"finished_jobs_days": None}}
SCRIPT = "import time\ntime.sleep(1e6)\n"


def quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))] if xs else float("nan")


def rss_mib(pid: int) -> float:
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmRSS"))
    return int(line.split()[1]) / 1024


def timed(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def point(tmp: Path, finished: int, queued: int, calls: int, idle: float) -> dict[str, Any]:
    """One daemon over a seeded store: the figures of one point of a curve (module doc)."""
    root = tmp / f"h{finished}-q{queued}"
    script = tmp / "sleep.py"
    script.write_text(SCRIPT)
    seeded = seed(root / "state" / "spx.sqlite", finished, queued, str(script))
    d = Daemon(root, gpu_backend="fake", config=CONFIG, log_level="debug")
    started = time.monotonic()
    d.start(timeout=600)
    try:
        pid = d.proc.pid
        d.wait_event("attempt_started", job=BLOCKER, timeout=120)
        wait_for(lambda: len(d.events("job_waiting")) >= queued, 120, "every queued job's reason")
        start_cpu, ready_s = cpu_seconds(pid), time.monotonic() - started
        d.wait_turns(4, timeout=60)
        first_turn = len(d.events("loop_turn"))
        time.sleep(idle)
        sock = root / "run" / "spx.sock"
        status_name = f"train-{(finished - 1) % 5000}" if finished else BLOCKER
        url = f"http://127.0.0.1:{d.metrics_port}/metrics"
        lat: dict[str, list[float]] = {k: [] for k in ("ls", "status", "metrics", "spx ls", "spx status")}
        window_cpu = cpu_seconds(pid)
        window_start = time.monotonic()
        for _ in range(calls):
            lat["ls"].append(timed(lambda: control.request(sock, "ls")))
            lat["status"].append(timed(lambda: control.request(sock, "status", status_name)))
            lat["metrics"].append(timed(lambda: urllib.request.urlopen(url, timeout=60).read()))
        for _ in range(max(3, calls // 5)):  # the commands: a Python start-up each, fewer of them
            lat["spx ls"].append(timed(lambda: d.spx("ls", "--json")))
            lat["spx status"].append(timed(lambda: d.spx("status", status_name, "--json", check=False)))
        window_s = time.monotonic() - window_start
        window_cpu = cpu_seconds(pid) - window_cpu
        listed = len(control.request(sock, "ls")["result"])
        turns = [float(e["seconds"]) * 1000 for e in d.events("loop_turn")[first_turn:]]
        store = root / "state" / "spx.sqlite"
        size = sum(p.stat().st_size for p in (store, store.with_name("spx.sqlite-wal")) if p.exists())
        row = {"finished": finished, "queued": queued, "seed_s": seeded["seed_seconds"], "ready_s": round(ready_s, 2),
               "listed": listed, "turns": len(turns),
               "loop_p50_ms": round(statistics.median(turns), 3), "loop_p99_ms": round(quantile(turns, 0.99), 3),
               "store_mib": round(size / 2**20, 2), "rss_mib": round(rss_mib(pid), 1),
               "start_cpu_s": round(start_cpu, 2), "window_cpu_percent": round(100 * window_cpu / window_s, 1)}
        for name, xs in lat.items():
            key = name.replace(" ", "_")
            row[f"{key}_p50_ms"] = round(statistics.median(xs), 2)
            row[f"{key}_p99_ms"] = round(quantile(xs, 0.99), 2)
        return row
    finally:
        d.stop()


def slope(rows: list[dict[str, Any]], x: str, y: str) -> float:
    """Least-squares slope of log(y) on log(x): 0 flat, 1 linear."""
    pts = [(math.log(r[x]), math.log(max(r[y], 1e-6))) for r in rows if r[x] > 0]
    if len(pts) < 2:
        return float("nan")
    mx, my = statistics.fmean(p[0] for p in pts), statistics.fmean(p[1] for p in pts)
    den = sum((p[0] - mx) ** 2 for p in pts)
    return round(sum((p[0] - mx) * (p[1] - my) for p in pts) / den, 3)


METRICS = ("loop_p50_ms", "loop_p99_ms", "ls_p99_ms", "status_p99_ms", "metrics_p99_ms", "spx_ls_p99_ms",
           "spx_status_p99_ms", "store_mib", "rss_mib", "start_cpu_s", "window_cpu_percent")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--history", type=int, nargs="+", default=[1000, 10000, 100000])
    p.add_argument("--queued", type=int, nargs="+", default=[1, 10, 100, 1000])
    p.add_argument("--history-queued", type=int, default=10, help="queued jobs along the history curve")
    p.add_argument("--queue-history", type=int, default=1000, help="finished jobs along the queue curve")
    p.add_argument("--calls", type=int, default=30)
    p.add_argument("--idle-seconds", type=float, default=10.0)
    p.add_argument("--quick", action="store_true", help="history 1,000 / 10,000, queued 1 / 100, 10 calls")
    p.add_argument("--name", default="scale", help="the result's name (bench/results/NAME.json)")
    a = p.parse_args()
    if a.quick:
        a.history, a.queued, a.calls, a.idle_seconds = [1000, 10000], [1, 100], 10, 4.0
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="spx-scale-") as tmp:
        for curve, points in (("history", [(h, a.history_queued) for h in a.history]),
                              ("queued", [(a.queue_history, q) for q in a.queued])):
            for finished, queued in points:
                done = next((r for r in rows if r["finished"] == finished and r["queued"] == queued), None)
                row = dict(done) if done else point(Path(tmp), finished, queued, a.calls, a.idle_seconds)
                row["curve"] = curve
                rows.append(row)
                print(json.dumps(row), flush=True)
    slopes = {curve: {m: slope([r for r in rows if r["curve"] == curve], "finished" if curve == "history" else "queued", m)
                      for m in METRICS} for curve in ("history", "queued")}
    print(json.dumps({"slopes": slopes}, indent=1))
    hist = sorted((r for r in rows if r["curve"] == "history"), key=lambda r: r["finished"])
    queue = sorted((r for r in rows if r["curve"] == "queued"), key=lambda r: r["queued"])
    lo, hi = hist[0], hist[-1]
    goals = [
        Goal(f"spx ls p99 at {hi['finished']:,} finished jobs / at {lo['finished']:,} ({hi['ls_p99_ms']} ms vs {lo['ls_p99_ms']} ms)",
             round(hi["ls_p99_ms"] / lo["ls_p99_ms"], 2), "<=", 1.5, "×"),
        Goal(f"loop p99 at {hi['finished']:,} finished jobs / at {lo['finished']:,} ({hi['loop_p99_ms']} ms vs {lo['loop_p99_ms']} ms)",
             round(hi["loop_p99_ms"] / lo["loop_p99_ms"], 2), "<=", 1.5, "×"),
        Goal(f"loop p99 at {queue[-1]['queued']:,} queued jobs ({queue[-1]['loop_p99_ms']} ms): log-log slope over "
             f"{queue[0]['queued']:,}…{queue[-1]['queued']:,} queued", slopes["queued"]["loop_p99_ms"], "<=", 1.0),
    ]
    rows.append({"case": "slopes (log-log, 0 flat, 1 linear)", "recent_finished_per_point": RECENT, **slopes})
    write_result(a.name, rows, goals)


if __name__ == "__main__":
    main()
