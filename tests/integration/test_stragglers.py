"""Slow ranks explained, end to end: a real daemon on the fake 8×H100, a 4-rank torchrun DDP job
(CPU, gloo) of examples/train_ddp.py. Its rank 2 is slowed (`--slow-rank 2`: that rank's forward
computes 5 ms more per micro-batch) and fake GPU 2 reports a thermal slowdown while busy (the
fixture's `clock_event_reasons_busy`, 1410 MHz, 89 °C): `spx status` names rank 2, GPU 2 and the
thermal cause within 30 s of the first step, /metrics has the straggler gauge. An undisturbed run
names no straggler in 60 s (a 5-minute run, 129 reports, slowest rank at most 8.7 % above the median, was
measured once by hand; a soak belongs in `make bench`).

The daemon explains stragglers when someone looks (`spx status`, `spx ls`, a scrape): the test
asks `spx status` once a second, as a person watching would, and scrapes at the end."""

from __future__ import annotations

import json
import statistics
import sys
import time
import urllib.request
from pathlib import Path

from harness import Daemon
from spx.daemon.gpu.fake import DEFAULT_FIXTURE

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PY = sys.executable


def fixture(tmp_path: Path, thermal_gpu: int | None) -> Path:
    doc = json.loads(DEFAULT_FIXTURE.read_text())
    for dev in doc["devices"]:
        dev["xid_schedule"] = []  # GPU 3's XID 79 would stop the job
    if thermal_gpu is not None:
        doc["devices"][thermal_gpu].update(clock_event_reasons_busy=["HwThermalSlowdown"], sm_clock_busy_mhz=1410,
                                           temperature_busy_c=87)  # the fake adds index % 4: 89 °C
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps(doc))
    return path


def job(name: str, extra: str) -> str:
    return (f"name: {name}\nlauncher: torchrun\nscript: {EXAMPLES / 'train_ddp.py'}\npython: {PY}\n"
            f"args: ['--steps', '100000', '--checkpoint-every', '0'{extra}]\n"
            "gpus: 4\nrestart: {max_restarts: 0}\n")


def first_step(d: Daemon, name: str, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (d.status(name).get("step") or 0) > 0:
            return time.monotonic()
        time.sleep(0.5)
    raise AssertionError(f"{name} made no step in {timeout} s: {d.status(name)}")


def watch(d: Daemon, name: str, seconds: float, until_found: bool) -> tuple[list[dict], list[list[float]]]:
    """`spx status` once a second for `seconds`: (stragglers when found, every rank-times list seen)."""
    seen: list[list[float]] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        doc = d.status(name)
        assert doc["state"] == "running", doc
        if doc.get("rank_step_seconds") and doc["rank_step_seconds"] not in seen:
            seen.append(doc["rank_step_seconds"])
        if doc.get("stragglers") and until_found:
            return doc["stragglers"], seen
        assert until_found or not doc.get("stragglers"), (doc["stragglers"], seen)
        time.sleep(1)
    return [], seen


def scrape(d: Daemon) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{d.metrics_port}/metrics", timeout=30) as r:
        return r.read().decode()


def test_a_slow_rank_on_a_thermally_throttled_gpu_is_named_with_its_cause(tmp_path: Path):
    d = Daemon(tmp_path / "root", gpu_backend="fake", extra_args=["--fake-gpus", str(fixture(tmp_path, 2))]).start()
    try:
        d.drop("slow.yaml", job("slow", ", '--slow-rank', '2', '--slow-rank-seconds', '0.005'"))
        began = first_step(d, "slow", 180)
        found, seen = watch(d, "slow", 30, until_found=True)
        took = time.monotonic() - began
        assert found, f"no straggler named within 30 s of the first step; rank times seen: {seen}"
        [s] = found
        assert (s["rank"], s["gpu"], s["cause"]) == (2, 2, "thermal"), s
        assert s["text"].startswith("rank 2 is ") and s["text"].endswith(
            "slower than the median: GPU 2 at 1410 of 1980 MHz, thermal slowdown (89 °C)"), s
        print(f"named after {took:.1f} s: {s['text']}")
        assert "straggler: rank 2 is" in d.spx("status", "slow").stdout
        metrics = scrape(d)
        assert 'spx_job_straggler{cause="thermal",gpu="2",rank="2",spx_job="slow"}' in metrics
        assert 'spx_job_rank_step_seconds{rank="3",spx_job="slow"}' in metrics
        said = d.wait_event("straggler_found", job="slow")
        assert said["rank"] == 2 and said["gpu"] == 2 and said["attempt"] == 1
        d.spx("cancel", "slow")
        d.wait_state("slow", "cancelled", 60)
    finally:
        d.stop()


def undisturbed(tmp_path: Path, seconds: float) -> None:
    # Four ranks on this 2-core box share two cores with the rest of the suite: a rank of an undisturbed
    # run was seen 10.7 % above the median under full-suite load (CPU contention, truthfully), so here
    # the threshold is 20 % (the default 10 % is for a GPU host, where ranks do not share cores).
    d = Daemon(tmp_path / "root", gpu_backend="fake", extra_args=["--fake-gpus", str(fixture(tmp_path, None))],
               config={"straggler_threshold_percent": 20}).start()
    try:
        d.drop("calm.yaml", job("calm", ""))
        first_step(d, "calm", 180)
        _, seen = watch(d, "calm", seconds, until_found=False)
        assert len(seen) >= 3, seen  # rank times did arrive, and none was a straggler
        worst = max(max(t) / statistics.median(t) for t in seen)
        print(f"{len(seen)} rank-time reports, slowest rank at most {100 * (worst - 1):.1f} % above the median")
        assert not d.events("straggler_found")
        d.spx("cancel", "calm")
        d.wait_state("calm", "cancelled", 60)
    finally:
        d.stop()


def test_an_undisturbed_run_names_no_straggler(tmp_path: Path):
    undisturbed(tmp_path, 60)
