"""What the daemon costs while nothing happens: its CPU with 8 jobs running steadily, /metrics scraped
every 15 s as Prometheus would, against the same daemon with no job running.

    .venv/bin/python bench/bench_idle.py [--seconds 300] [--rounds 3] [--settle-seconds 20]
                                         [--scrape-every 15] [--quick]

One daemon on the fake 8-GPU fixture (`--gpu-backend fake`, the bundled 8×H100 host with its
simulated faults taken out: its one GPU that falls off the bus every 5 minutes would stop a job and
leave it waiting for a GPU, which is not rest), at its default log level (info: debug logs every
loop turn), told the unit's WatchdogSec (60 s: it pings every 30 s, and a quiet loop turns once a
second; under the test harness's 1 s it would turn twice a second). First it runs with no job (an idle host): `--rounds` windows of `--seconds`
each. Then 8 one-GPU jobs are dropped into the spool, each a plain python loop that sleeps 1 s and
writes a heartbeat (`spx.daemon.contract.worker_env.write_heartbeat`) per step; once all 8 run with
a step, after `--settle-seconds`, another `--rounds` windows. In every window /metrics is scraped
every `--scrape-every` seconds (the first at the window's start).

Measured per window: the daemon's CPU time (utime + stime of its process, every thread, from
/proc/PID/stat: time on the CPU, which the machine's other load barely changes, unlike wall time)
at the window's start and end: CPU % of one core = 100 × Δcpu / Δwall. And the scrapes' own share:
the daemon's CPU time from just before each scrape's request to just after its answer (a thread of
the metrics server's own per request, ended by then: only the process's total counts it), summed
over the window, in % of a core too — each span is within a clock tick (10 ms) of the truth and
unbiased, so the sum over a window's scrapes is close; the window's CPU less that is the daemon
without scrapes. Per-job
marginal cost = (8 jobs − 0 jobs) / 8. Each row gives the median over the rounds and the spread
(min–max), not the best round.

Goal (issue 29): the daemon's CPU with 8 running jobs and /metrics every 15 s ≤ 0.5 % of a core.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchlib import Goal, write_result
from process_tree import cpu_seconds

from spx.daemon.gpu.fake import DEFAULT_FIXTURE
from spx.daemon.service import control

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from harness import Daemon, wait_for  # noqa: E402

PY = str(Path(sys.executable).absolute())  # a job's `python` may not contain ".."; the venv's link kept
JOBS = 8
GOAL_PERCENT = 0.5
BEATS = ("import os, time\nfrom spx.daemon.contract.worker_env import Heartbeat, write_heartbeat\n"
         "step = 0\nwhile True:\n    time.sleep(1)\n    step += 1\n"
         "    write_heartbeat(os.environ['SPX_HEARTBEAT_FILE'], Heartbeat(step=step))\n")


def job_yaml(name: str, script: Path) -> str:
    return f"name: {name}\nlauncher: python\nscript: {script}\npython: {PY}\ngpus: 1\nstop: {{grace_seconds: 2}}\n"


def window(pid: int, url: str, seconds: float, scrape_every: float) -> dict[str, float]:
    """One window: the daemon's CPU % over it, and the scrapes' share of it (module doc)."""
    cpu0, wall0 = cpu_seconds(pid), time.monotonic()
    scrape_cpu, scrapes, next_scrape = 0.0, 0, wall0
    while True:
        now = time.monotonic()
        if now - wall0 >= seconds:
            break
        if now >= next_scrape:
            before = cpu_seconds(pid)
            urllib.request.urlopen(url, timeout=60).read()
            scrape_cpu += cpu_seconds(pid) - before
            scrapes += 1
            next_scrape += scrape_every
        time.sleep(max(0.0, min(next_scrape, wall0 + seconds) - time.monotonic()))
    wall = time.monotonic() - wall0
    cpu = cpu_seconds(pid) - cpu0
    return {"cpu_percent": 100 * cpu / wall, "scrape_percent": 100 * scrape_cpu / wall,
            "without_scrapes_percent": 100 * (cpu - scrape_cpu) / wall, "scrapes": scrapes, "seconds": wall}


def summarise(jobs: int, windows: list[dict[str, float]]) -> dict[str, Any]:
    row: dict[str, Any] = {"case": f"{jobs} running jobs", "jobs": jobs, "rounds": len(windows),
                           "window_s": round(statistics.median(w["seconds"] for w in windows), 1),
                           "scrapes_per_window": min(w["scrapes"] for w in windows)}
    for key in ("cpu_percent", "scrape_percent", "without_scrapes_percent"):
        xs = [w[key] for w in windows]
        row[key] = round(statistics.median(xs), 3)
        row[f"{key}_min"], row[f"{key}_max"] = round(min(xs), 3), round(max(xs), 3)
        row[f"{key}_rounds"] = [round(x, 3) for x in xs]
    return row


def running_with_step(sock: Path, name: str) -> bool:
    st = control.request(sock, "status", name, timeout=60).get("result") or {}
    return st.get("state") == "running" and (st.get("step") or 0) >= 1


def quiet_fixture(path: Path) -> Path:
    """The bundled fixture without its scheduled XIDs."""
    fixture = json.loads(DEFAULT_FIXTURE.read_text())
    for gpu in fixture["devices"]:
        gpu["xid_schedule"] = []
    path.write_text(json.dumps(fixture))
    return path


def run(tmp: Path, seconds: float, rounds: int, settle: float, scrape_every: float) -> list[dict[str, Any]]:
    script = tmp / "beats.py"
    script.write_text(BEATS)
    # The unit's WatchdogSec (60 s): the harness's default 1 s would have a quiet loop turn twice a second.
    d = Daemon(tmp / "root", gpu_backend="fake", extra_args=["--fake-gpus", str(quiet_fixture(tmp / "gpus.json"))],
               watchdog_seconds=60.0)
    d.start(timeout=120)
    try:
        assert d.proc is not None
        pid, url, sock = d.proc.pid, f"http://127.0.0.1:{d.metrics_port}/metrics", d.root / "run" / "spx.sock"
        time.sleep(settle)  # the start's one-off work done
        idle = []
        for r in range(rounds):
            idle.append(window(pid, url, seconds, scrape_every))
            print(json.dumps({"jobs": 0, "round": r, **idle[-1]}), flush=True)
        names = [f"beat-{i}" for i in range(JOBS)]
        for name in names:
            d.drop(f"{name}.yaml", job_yaml(name, script))
        wait_for(lambda: all(running_with_step(sock, n) for n in names), 180, f"all {JOBS} jobs running with a step",
                 interval=1.0)
        time.sleep(settle)
        busy = []
        for r in range(rounds):
            busy.append(window(pid, url, seconds, scrape_every))
            print(json.dumps({"jobs": JOBS, "round": r, **busy[-1]}), flush=True)
        still = sum(running_with_step(sock, n) for n in names)
        assert still == JOBS, f"only {still} of {JOBS} jobs still running at the end"
    finally:
        d.stop()
    return [summarise(0, idle), summarise(JOBS, busy)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=300.0, help="each window's length")
    p.add_argument("--rounds", type=int, default=3, help="windows with 0 jobs, then as many with 8")
    p.add_argument("--settle-seconds", type=float, default=20.0, help="after the start, and once the jobs run")
    p.add_argument("--scrape-every", type=float, default=15.0)
    p.add_argument("--quick", action="store_true", help="windows of 60 s")
    p.add_argument("--name", default="idle", help="the result's name (bench/results/NAME.json)")
    a = p.parse_args()
    if a.quick:
        a.seconds = 60.0
    with tempfile.TemporaryDirectory(prefix="spx-idle-") as tmp:
        idle, busy = run(Path(tmp), a.seconds, a.rounds, a.settle_seconds, a.scrape_every)
    per_job = {k: round((busy[k] - idle[k]) / JOBS, 4) for k in ("cpu_percent", "without_scrapes_percent")}
    rows = [idle, busy, {"case": f"per running job ((8 − 0) / {JOBS}, medians)", **per_job}]
    for row in rows:
        print(json.dumps(row), flush=True)
    goals = [Goal(f"daemon CPU with {JOBS} running jobs, /metrics every {a.scrape_every:g} s (median of {a.rounds} "
                  f"× {a.seconds:g} s; range {busy['cpu_percent_min']}–{busy['cpu_percent_max']}; 0 jobs: "
                  f"{idle['cpu_percent']})", busy["cpu_percent"], "<=", GOAL_PERCENT, "% of a core")]
    write_result(a.name, rows, goals)


if __name__ == "__main__":
    main()
