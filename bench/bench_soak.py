"""The soak: one daemon kept busy for an hour with short jobs of every kind, sampled for growth.

    .venv/bin/python bench/bench_soak.py [--minutes 60] [--sample-seconds 60] [--warmup-seconds 300]
                                         [--concurrency 2] [--disruptions 4] [--torchrun-every 20] [--quick]
                                         [--disrupt-within 0.4] [--no-job-labels]

One real daemon (`--gpu-backend fake`, the bundled 8-GPU fixture) while jobs flow through it, at most
`--concurrency` in flight, each one submitted (dropped into the spool) as the one before it ends, the
kinds in turn:
- ok: a python script that writes 5 heartbeats and exits 0 (every `--torchrun-every`th ok job is a
  2-worker torchrun of examples/train_ddp.py for a few steps instead: its standby launcher, its
  workers' process group); ends succeeded;
- crash: exits 3 at once, `max_restarts: 2`, backoff 1 s; ends failed after 3 attempts;
- hang: one heartbeat, then no progress: `hang_timeout_seconds: 3`, `max_restarts: 1`; ends failed
  after 2 hangs (stacks dumped, killed);
- cancel: heartbeats until `spx cancel` (the command, as a user runs it) once it is running; ends
  cancelled;
- adopt / reload (`--disruptions` of them, spread over the first 40 % of the run, `--disrupt-within`,
  alternating, so the last 60 % is one daemon's uninterrupted life): a job writing heartbeats for 15 s; once it is
  running the daemon is killed (SIGKILL) and started again on the same root, or sent SIGHUP after
  its config file changed (`straggler_threshold_percent`: a reload re-executes it in place with the
  config re-read). Every running job is adopted; the disrupted one ends succeeded in its 1 attempt.

Every `--sample-seconds`: the daemon's RSS, open descriptors (/proc/PID/fd), threads, its
descendants (and how many are zombies), its loop turn p99 over the window (the increments of
`spx_daemon_loop_turn_seconds` between two scrapes, interpolated within the bucket as Prometheus'
histogram_quantile does), the /metrics scrape's time, the store's size (with its WAL) and the jobs
ended since the last sample.

A restart or a reload is a new process image (a new segment): RSS, descriptors, threads and the
histogram start again. So every figure is taken within segments, each after its own warm-up
(`--warmup-seconds`): slopes are pooled within segments (Theil–Sen: the median of the slopes between
every two samples of one segment), ranges are the largest max − min of a segment. The run fails
(exit 1, each broken bound said) if:
- RSS grows faster than 5 MiB/hour;
- descriptors or threads are not flat: max − min over a segment after warm-up above FD_FLAT /
  THREADS_FLAT (each running job holds a few descriptors and a thread or two while it runs: the
  bound allows two jobs' worth, never a growth with the number of jobs done);
- any process is left: the daemon's descendants once every job has ended, zombies among them, or
  any process anywhere tagged with a soak job's name (SPX_JOB) — an attempt orphaned by a kill;
- the loop's turn p99 or the scrape's time trends up: the pooled slope times the run's length above
  the run's median of it (it would double within the run);
- a job did not end in a terminal state with a reason, or ended otherwise than its kind says.

`--no-job-labels` runs the daemon with `metrics_job_labels: false`: /metrics then builds no per-job
series, so what still grows is not the scrape of the jobs that ended in the last day.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from benchlib import Goal, write_result
from process_tree import live_environments

from spx.daemon.service import control

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from harness import EXAMPLES, Daemon, wait_for  # noqa: E402

PY = os.path.abspath(sys.executable)  # a job's `python` may not contain ".." (bench/../.venv); the venv's link kept
RSS_MIB_PER_HOUR = 5.0  # the goal
FD_FLAT = 16  # descriptors: max − min within a segment after warm-up
THREADS_FLAT = 8
TREND_FACTOR = 1.0  # loop p99 / scrape time: pooled slope × run length ≤ this × the run's median
TERMINAL = {"succeeded", "failed", "cancelled"}
EXPECTED = {"ok": "succeeded", "ok-torchrun": "succeeded", "crash": "failed", "hang": "failed",
            "cancel": "cancelled", "adopt": "succeeded", "reload": "succeeded"}
CYCLE = ("ok", "crash", "ok", "hang", "ok", "cancel")
CONFIG = {"straggler_threshold_percent": 10.0}

BEATS = ("import os, sys, time\nfrom spx.daemon.contract.worker_env import Heartbeat, write_heartbeat\n"
         "steps, every = int(sys.argv[1]), float(sys.argv[2])\nstep = 0\n"
         "while steps == 0 or step < steps:\n    time.sleep(every)\n    step += 1\n"
         "    write_heartbeat(os.environ['SPX_HEARTBEAT_FILE'], Heartbeat(step=step))\n")
HANG = ("import os, time\nfrom spx.daemon.contract.worker_env import Heartbeat, write_heartbeat\n"
        "write_heartbeat(os.environ['SPX_HEARTBEAT_FILE'], Heartbeat(step=1))\ntime.sleep(1e6)\n")
CRASH = "import sys, time\ntime.sleep(0.3)\nsys.exit(3)\n"


def job_yaml(name: str, kind: str, scripts: Path) -> str:
    restart = "{max_restarts: 0, backoff_seconds: [1, 1]}"
    if kind == "ok-torchrun":
        args = ["--batch_size", "4", "--model-size", "tiny", "--steps", "5", "--checkpoint-every", "0"]
        return (f"name: {name}\nlauncher: torchrun\nscript: {EXAMPLES / 'train_ddp.py'}\npython: {PY}\n"
                f"args: {json.dumps(args)}\nprocs: 2\nrestart: {restart}\nstop: {{grace_seconds: 5}}\n")
    script, args = {"ok": ("beats.py", ["5", "0.2"]), "cancel": ("beats.py", ["0", "0.5"]),
                    "adopt": ("beats.py", ["30", "0.5"]), "reload": ("beats.py", ["30", "0.5"]),
                    "crash": ("crash.py", []), "hang": ("hang.py", [])}[kind]
    if kind == "crash":
        restart = "{max_restarts: 2, backoff_seconds: [1, 1]}"
    elif kind == "hang":
        restart = "{max_restarts: 1, backoff_seconds: [1, 1], hang_timeout_seconds: 3}"
    return (f"name: {name}\nlauncher: python\nscript: {scripts / script}\npython: {PY}\nargs: {json.dumps(args)}\n"
            f"restart: {restart}\nstop: {{grace_seconds: 2}}\n")


# --- what is read from /proc and /metrics ------------------------------------------------------------


def proc_status(pid: int) -> dict[str, str]:
    return dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)


def process_table() -> dict[int, tuple[int, str]]:
    """{pid: (ppid, state)} of every process now."""
    table = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            table[int(entry.name)] = (int(fields[1]), fields[0])
    return table


def descendants(pid: int) -> list[tuple[int, str]]:
    """(pid, state) of every process below `pid`."""
    table = process_table()
    children: dict[int, list[int]] = {}
    for p, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(p)
    found, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        found.append((p, table[p][1]))
        todo += children.get(p, [])
    return found


def tagged(names: set[str]) -> list[int]:
    """Live processes anywhere whose environment names one of these jobs (SPX_JOB)."""
    tags = {f"SPX_JOB={n}".encode() for n in names}
    return [pid for pid, env in live_environments() if env & tags]


def turn_buckets(metrics_text: str) -> list[tuple[float, float]]:
    """[(upper bound, cumulative count)] of spx_daemon_loop_turn_seconds, +Inf last."""
    out = []
    for line in metrics_text.splitlines():
        if line.startswith("spx_daemon_loop_turn_seconds_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            out.append((float("inf") if le == "+Inf" else float(le), float(line.rsplit(" ", 1)[1])))
    return sorted(out)


def histogram_quantile(q: float, before: list[tuple[float, float]], after: list[tuple[float, float]]) -> float | None:
    """The q-quantile of the turns between two readings (linear within the bucket, as Prometheus
    does; the last finite bound when it falls in +Inf); None without turns or across a reset."""
    if len(before) != len(after):
        return None
    inc = [(le, a - b) for (le, b), (_, a) in zip(before, after, strict=True)]
    total = inc[-1][1] if inc else 0
    if total <= 0 or any(c < 0 for _, c in inc):
        return None
    rank, lo, below = q * total, 0.0, 0.0
    for le, cum in inc:
        if cum >= rank:
            if le == float("inf"):
                return lo
            return lo + (le - lo) * ((rank - below) / (cum - below) if cum > below else 1.0)
        lo, below = le, cum
    return lo


def pooled_slope(points: list[tuple[int, float, float]]) -> float:
    """The median of the slopes between every two points of the same segment ([(segment, x, y)]):
    Theil–Sen pooled within segments. Robust: a sample slowed by the machine's other load (a scrape
    that waited for the CPU) does not tilt it, and a segment's own level does not count as a trend."""
    by: dict[int, list[tuple[float, float]]] = {}
    for seg, x, y in points:
        by.setdefault(seg, []).append((x, y))
    slopes = [(b[1] - a[1]) / (b[0] - a[0]) for pts in by.values()
              for i, a in enumerate(pts) for b in pts[i + 1:] if b[0] > a[0]]
    return statistics.median(slopes) if slopes else 0.0


# --- the run -----------------------------------------------------------------------------------------


@dataclass
class Job:
    name: str
    kind: str
    submitted: float
    cancelled: bool = False
    end: dict[str, Any] = field(default_factory=dict)


class Soak:
    """One daemon, the flow of jobs through it, the samples, and the disruptions (module doc)."""

    def __init__(self, base: Path, minutes: float, sample_seconds: float, concurrency: int, disruptions: int,
                 torchrun_every: int, config: dict[str, Any] | None = None, disrupt_within: float = 0.4) -> None:
        self.base = base
        self.scripts = base / "scripts"
        self.scripts.mkdir(parents=True)
        for name, text in (("beats.py", BEATS), ("hang.py", HANG), ("crash.py", CRASH)):
            (self.scripts / name).write_text(text)
        self.config = {**CONFIG, **(config or {})}
        self.d = Daemon(base / "root", gpu_backend="fake", config=dict(self.config))
        self.seconds = minutes * 60
        self.sample_seconds = sample_seconds
        self.concurrency = concurrency
        self.torchrun_every = torchrun_every
        # adopt / reload alternating, spread over the run's first `disrupt_within` (40 %)
        self.disruptions = [(self.seconds * disrupt_within * (i + 1) / (disruptions + 1), ("adopt", "reload")[i % 2])
                            for i in range(disruptions)]
        self.jobs: dict[str, Job] = {}
        self.in_flight: list[str] = []
        self.samples: list[dict[str, Any]] = []
        self.segment = 0
        self.segment_start = 0.0
        self.t0 = 0.0
        self.turns_before: list[tuple[float, float]] = []
        self.ended_since_sample = 0
        self.submitted = 0
        self.ok_count = 0
        self.events: list[dict[str, Any]] = []
        self.leftover: dict[str, list[dict[str, Any]]] = {"descendants": [], "tagged": []}

    @property
    def sock(self) -> Path:
        return self.d.root / "run" / "spx.sock"

    def now(self) -> float:
        return time.monotonic() - self.t0

    def status(self, name: str) -> dict[str, Any]:
        reply = control.request(self.sock, "status", name, timeout=60)
        return reply.get("result") or {}

    def submit(self, kind: str) -> str:
        if kind == "ok":
            self.ok_count += 1
            if self.torchrun_every and self.ok_count % self.torchrun_every == 0:
                kind = "ok-torchrun"
        self.submitted += 1
        name = f"{kind}-{self.submitted}"
        self.d.drop(f"{name}.yaml", job_yaml(name, kind, self.scripts))
        self.jobs[name] = Job(name, kind, self.now())
        self.in_flight.append(name)
        return name

    def poll(self) -> None:
        for name in list(self.in_flight):
            job = self.jobs[name]
            st = self.status(name)
            state = st.get("state")
            rejected = self.d.spool / "rejected" / f"{name}.yaml.error"
            if not st and rejected.exists():
                job.end = {"state": "rejected", "reason": rejected.read_text()[:300]}
                self.in_flight.remove(name)
            elif state in TERMINAL:
                history = st.get("history") or []
                job.end = {"state": state, "reason": st.get("reason") or (history[-1].get("reason") if history else None),
                           "attempts": len(history), "seconds": round(self.now() - job.submitted, 1)}
                self.in_flight.remove(name)
                self.ended_since_sample += 1
            elif job.kind == "cancel" and not job.cancelled and state == "running" and (st.get("step") or 0) >= 1:
                self.d.spx("cancel", name)
                job.cancelled = True

    def running_with_step(self, name: str) -> bool:
        st = self.status(name)
        return st.get("state") == "running" and (st.get("step") or 0) >= 1

    def disrupt(self, kind: str) -> None:
        """A job running across a daemon restart (kill -9, start again) or a reload (SIGHUP after a
        config change): waits until it runs, disrupts, starts a new segment."""
        name = self.submit(kind)
        wait_for(lambda: self.running_with_step(name), 120, f"{name} running")
        self.take_sample()  # the segment's last sample before the new image
        started = time.monotonic()
        if kind == "adopt":
            self.d.kill9()
            self.d.start(timeout=120)
        else:
            self.d.config = {**self.config, "straggler_threshold_percent": 10.0 + self.segment + 1}
            cfg = self.d.root.parent / f"{self.d.root.name}-config.yaml"  # where Daemon.start wrote it
            cfg.write_text(yaml.safe_dump(self.d.config))
            readies = len(self.d.events("daemon_ready"))
            assert self.d.proc is not None
            os.kill(self.d.proc.pid, signal.SIGHUP)
            ready = wait_for(lambda: (self.d.events("daemon_ready")[readies:] or [None])[-1], 120, "the reloaded daemon")
            self.d.metrics_port = int(ready["metrics"].rsplit(":", 1)[1])
        self.events.append({"t": round(self.now(), 1), "what": kind, "job": name,
                            "seconds": round(time.monotonic() - started, 2)})
        self.segment += 1
        self.segment_start = self.now()
        self.turns_before = []

    def take_sample(self) -> None:
        assert self.d.proc is not None
        pid = self.d.proc.pid
        st = proc_status(pid)
        below = descendants(pid)
        url = f"http://127.0.0.1:{self.d.metrics_port}/metrics"
        start = time.perf_counter()
        text = urllib.request.urlopen(url, timeout=60).read().decode()
        scrape_ms = (time.perf_counter() - start) * 1000
        turns = turn_buckets(text)
        p99 = histogram_quantile(0.99, self.turns_before, turns) if self.turns_before else None
        self.turns_before = turns
        store = self.d.root / "state" / "spx.sqlite"
        size = sum(p.stat().st_size for p in (store, store.with_name("spx.sqlite-wal")) if p.exists())
        self.samples.append({
            "t": round(self.now(), 1), "segment": self.segment, "age_s": round(self.now() - self.segment_start, 1),
            "rss_mib": round(int(st["VmRSS"].split()[0]) / 1024, 2), "fds": len(os.listdir(f"/proc/{pid}/fd")),
            "threads": int(st["Threads"]), "descendants": len(below), "zombies": sum(s == "Z" for _, s in below),
            "loop_p99_ms": None if p99 is None else round(p99 * 1000, 3), "scrape_ms": round(scrape_ms, 2),
            "store_mib": round(size / 2**20, 3), "jobs_ended": self.ended_since_sample,
            "in_flight": len(self.in_flight)})
        self.ended_since_sample = 0
        print(json.dumps(self.samples[-1]), flush=True)

    def run(self) -> None:
        self.d.start(timeout=120)
        self.t0 = time.monotonic()
        try:
            self.take_sample()
            next_sample = self.sample_seconds
            todo = list(self.disruptions)
            kinds = 0
            while self.now() < self.seconds:
                if todo and self.now() >= todo[0][0]:
                    self.disrupt(todo.pop(0)[1])
                self.poll()
                while len(self.in_flight) < self.concurrency:
                    self.submit(CYCLE[kinds % len(CYCLE)])
                    kinds += 1
                if self.now() >= next_sample:
                    self.take_sample()
                    next_sample += self.sample_seconds
                time.sleep(0.5)
            wait_for(lambda: self.poll() or not self.in_flight, 300, "every job to end")
            self.leftover = self.wait_empty()
            self.take_sample()  # the end, settled: an exit the daemon has yet to reap is no zombie left
        finally:
            self.d.stop()

    def wait_empty(self) -> dict[str, Any]:
        """Once every job has ended: what is still below the daemon or tagged with a soak job
        (given 30 s to go: a log relay draining, a monitor reaping)."""
        assert self.d.proc is not None
        pid, names = self.d.proc.pid, set(self.jobs)
        try:
            wait_for(lambda: not descendants(pid) and not tagged(names), 30, "the daemon's tree to empty")
        except AssertionError:
            pass
        left = descendants(pid)
        return {"descendants": [{"pid": p, "state": s, "cmdline": cmdline(p)} for p, s in left],
                "tagged": [{"pid": p, "cmdline": cmdline(p)} for p in tagged(names)]}


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    except OSError:
        return "?"


# --- the verdict -------------------------------------------------------------------------------------


def analyse(soak: Soak, warmup: float) -> dict[str, Any]:
    """The figures and the bounds they are held to (module doc): {"figures", "broken", "jobs"}."""
    settled = [s for s in soak.samples if s["age_s"] >= warmup]
    hours = soak.seconds / 3600

    def slope(key: str) -> float:
        return pooled_slope([(s["segment"], s["t"] / 3600, s[key]) for s in settled if s[key] is not None])

    def span(key: str) -> float:
        by: dict[int, list[float]] = {}
        for s in settled:
            by.setdefault(s["segment"], []).append(s[key])
        return max((max(v) - min(v) for v in by.values() if len(v) >= 2), default=0)

    def median(key: str) -> float:
        xs = [s[key] for s in settled if s[key] is not None]
        return statistics.median(xs) if xs else 0.0

    by_kind: dict[str, Counter[str]] = {}
    unexpected = []
    for job in soak.jobs.values():
        end = job.end
        by_kind.setdefault(job.kind, Counter())[end.get("state", "not ended")] += 1
        if end.get("state") != EXPECTED[job.kind] or not end.get("reason"):
            unexpected.append({"job": job.name, **end})
        if job.kind in ("adopt", "reload") and end.get("attempts") != 1:
            unexpected.append({"job": job.name, "why": "relaunched instead of adopted", **end})
    figures = {
        "samples_after_warmup": len(settled), "segments": soak.segment + 1,
        "rss_mib_per_hour": round(slope("rss_mib"), 2),
        "fds_range": span("fds"), "threads_range": span("threads"),
        "fds_slope_per_hour": round(slope("fds"), 2), "threads_slope_per_hour": round(slope("threads"), 2),
        "loop_p99_ms_median": round(median("loop_p99_ms"), 3),
        "loop_p99_ms_per_hour": round(slope("loop_p99_ms"), 3),
        "scrape_ms_median": round(median("scrape_ms"), 2), "scrape_ms_per_hour": round(slope("scrape_ms"), 2),
        "store_mib_per_hour": round(slope("store_mib"), 3),
        "jobs_ended": sum(1 for j in soak.jobs.values() if j.end), "jobs": len(soak.jobs),
        "jobs_per_minute": round(sum(1 for j in soak.jobs.values() if j.end) / (soak.seconds / 60), 2),
        "max_zombies": max((s["zombies"] for s in soak.samples), default=0),
        "leftover_processes": len(soak.leftover["descendants"]) + len(soak.leftover["tagged"]),
    }
    loop_trend = figures["loop_p99_ms_per_hour"] * hours / max(figures["loop_p99_ms_median"], 1e-3)
    scrape_trend = figures["scrape_ms_per_hour"] * hours / max(figures["scrape_ms_median"], 1e-3)
    figures["loop_p99_trend_over_median"] = round(loop_trend, 3)
    figures["scrape_trend_over_median"] = round(scrape_trend, 3)
    checks = (
        (figures["rss_mib_per_hour"] <= RSS_MIB_PER_HOUR, f"RSS grows {figures['rss_mib_per_hour']} MiB/hour > {RSS_MIB_PER_HOUR}"),
        (figures["fds_range"] <= FD_FLAT, f"descriptors range {figures['fds_range']} > {FD_FLAT} within a segment"),
        (figures["threads_range"] <= THREADS_FLAT, f"threads range {figures['threads_range']} > {THREADS_FLAT} within a segment"),
        (figures["leftover_processes"] == 0, f"processes left after every job ended: {soak.leftover}"),
        (figures["max_zombies"] == 0 or soak.samples[-1]["zombies"] == 0, "zombies below the daemon at the end"),
        (loop_trend <= TREND_FACTOR, f"loop p99 trends up: {loop_trend:.2f} × its median over the run > {TREND_FACTOR}"),
        (scrape_trend <= TREND_FACTOR, f"scrape time trends up: {scrape_trend:.2f} × its median over the run > {TREND_FACTOR}"),
        (not unexpected, f"jobs that did not end as their kind says, or without a reason: {unexpected}"),
        (len(settled) >= 3, f"only {len(settled)} samples after the warm-up: nothing to fit"),
    )
    broken = [why for ok, why in checks if not ok]
    return {"figures": figures, "broken": broken, "unexpected": unexpected,
            "jobs": {k: dict(v) for k, v in sorted(by_kind.items())}}


def soak(base: Path, minutes: float, sample_seconds: float, warmup: float, concurrency: int = 2,
         disruptions: int = 4, torchrun_every: int = 20, config: dict[str, Any] | None = None,
         disrupt_within: float = 0.4) -> tuple[Soak, dict[str, Any]]:
    """Run a soak under `base` (`config`: over the daemon's CONFIG; the disruptions spread over the
    first `disrupt_within` of the run); the run and its verdict (analyse)."""
    s = Soak(base, minutes, sample_seconds, concurrency, disruptions, torchrun_every, config, disrupt_within)
    s.run()
    return s, analyse(s, warmup)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=60.0)
    p.add_argument("--sample-seconds", type=float, default=60.0)
    p.add_argument("--warmup-seconds", type=float, default=300.0, help="after the start and after each disruption")
    p.add_argument("--concurrency", type=int, default=2, help="jobs in flight at once")
    p.add_argument("--disruptions", type=int, default=4, help="adopt/reload disruptions, alternating")
    p.add_argument("--torchrun-every", type=int, default=20, help="every Nth ok job is a torchrun job (0: none)")
    p.add_argument("--disrupt-within", type=float, default=0.4, help="the disruptions spread over this first part of the run")
    p.add_argument("--no-job-labels", action="store_true",
                   help="metrics_job_labels: false (no per-job series in /metrics): what grows without them")
    p.add_argument("--quick", action="store_true",
                   help="3 minutes, a sample every 5 s, 60 s warm-up, 2 disruptions in the first 15 %%, no torchrun job")
    p.add_argument("--name", default="soak", help="the result's name (bench/results/NAME.json)")
    a = p.parse_args()
    # SIGTERM (or SIGINT, ignored in a shell's background jobs) ends the run through its `finally`:
    # the daemon is stopped with its jobs, nothing is left running.
    signal.signal(signal.SIGTERM, lambda _sig, _frame: sys.exit(143))
    if a.quick:
        a.minutes, a.sample_seconds, a.warmup_seconds, a.disruptions, a.torchrun_every = 3, 5, 60, 2, 0
        a.disrupt_within = 0.15
    with tempfile.TemporaryDirectory(prefix="spx-soak-") as tmp:
        run, verdict = soak(Path(tmp), a.minutes, a.sample_seconds, a.warmup_seconds, a.concurrency,
                            a.disruptions, a.torchrun_every,
                            {"metrics_job_labels": False} if a.no_job_labels else None, a.disrupt_within)
    f = verdict["figures"]
    print(json.dumps(verdict, indent=1))
    goals = [
        Goal(f"RSS growth over the soak (goal < 5 MiB/hour; {a.minutes:g} min, pooled within {f['segments']} daemon lives)",
             f["rss_mib_per_hour"], "<=", RSS_MIB_PER_HOUR, "MiB/h"),
        Goal("descriptors/threads flat: descriptors max − min within a daemon's life after warm-up", f["fds_range"], "<=", FD_FLAT),
        Goal("descriptors/threads flat: threads max − min within a daemon's life after warm-up", f["threads_range"], "<=", THREADS_FLAT),
        Goal("processes left once every job ended (descendants, orphans tagged with a soak job)", f["leftover_processes"], "==", 0),
        Goal(f"loop turn p99 trend over the run / its median ({f['loop_p99_ms_median']} ms)", f["loop_p99_trend_over_median"],
             "<=", TREND_FACTOR),
        Goal(f"/metrics scrape time trend over the run / its median ({f['scrape_ms_median']} ms)", f["scrape_trend_over_median"],
             "<=", TREND_FACTOR),
        Goal(f"jobs not ended as their kind says, or without a reason (of {f['jobs']}: "
             + ", ".join(f"{kind} {sum(ends.values())}" for kind, ends in verdict["jobs"].items()) + ")",
             len(verdict["unexpected"]), "==", 0),
    ]
    rows = [{"case": "sample", **s} for s in run.samples]
    rows += [{"case": "disruption", **e} for e in run.events]
    rows.append({"case": "figures", **f, "jobs_by_kind": verdict["jobs"], "broken": verdict["broken"],
                 "minutes": a.minutes, "sample_seconds": a.sample_seconds, "warmup_seconds": a.warmup_seconds,
                 "concurrency": a.concurrency, "disrupt_within": a.disrupt_within,
                 "metrics_job_labels": not a.no_job_labels,
                 "bounds": {"rss_mib_per_hour": RSS_MIB_PER_HOUR, "fds_range": FD_FLAT, "threads_range": THREADS_FLAT,
                            "trend_factor": TREND_FACTOR}})
    write_result(a.name, rows, goals)
    for why in verdict["broken"]:
        print(f"SOAK FAILED: {why}", file=sys.stderr)
    return 1 if verdict["broken"] else 0


if __name__ == "__main__":
    sys.exit(main())
