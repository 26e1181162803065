"""Exporter cost: one scrape of the 8×18-link fixture, and the daemon's idle footprint, against baselines.

    .venv/bin/python bench/bench_scrape.py [--scrapes N] [--idle-seconds S] [--call-latency-us US]

Scrape (in this process; fake backend, 8× H100 × 18 NVLink links). Candidate: the daemon's own
registry (`build_registry`), timed through `generate_latest`; NVML calls counted by the fake (the XID
thread's event-set calls excluded). Baseline: a naive collector (below) on the same fixture that reads
the same data the usual way, one pynvml call per counter: per link `nvmlDeviceGetNvLinkState`, one
`nvmlDeviceGetNvLinkErrorCounter` per error type and one single-field `nvmlDeviceGetFieldValues` per
throughput counter, plus the per-GPU reads; it yields the same samples but spx's own few. Both also run
on a 4-link copy of the fixture, to show whose call count grows with the links. "NVML ms" is the time
inside nvmlDevice* calls, "rest ms" the collector's Python plus the text exposition. The fake's calls
are Python (its field-values call costs over 10 µs per requested field, which penalises the one big
request of 168 fields per GPU); a driver's are ioctls of tens of µs each. So both are also timed with a
fixed latency spun into every nvmlDevice* call (`--call-latency-us`, default 20), and costed as
"rest ms + calls × latency" (the fake's own cost left out): MODELS, charging per call, not per field.
The fake's clock steps 15 s between scrapes and stands still within one, so the fake's counter
integration (O(links) on every call, which a driver does not do) does not inflate the naive side.
Scrapes of all subjects are interleaved round by round, so noise from other work hits them alike.

Idle (real processes, same window, same schedule): the daemon started as users start it,
`spx-trainer --root TMP --gpu-backend fake --metrics-address 127.0.0.1:0`, against a bare
`python -c` that imports prometheus-client and serves its default registry. Each is scraped over HTTP
every 5 s; RSS/PSS come from /proc/PID/{status,smaps_rollup}, CPU from utime+stime in /proc/PID/stat
(10 ms ticks) over the window, "in scrapes" being the part spent while a scrape was in flight.
`--gpu-backend none` runs alongside for scale (a daemon that never reads a GPU).

Goals (issue): NVML calls per scrape ≤ a few per GPU and independent of link count; idle RSS and CPU
stated against the bare-client baseline.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pynvml
import structlog
from prometheus_client import CollectorRegistry, generate_latest

from spx.daemon.exporter.gpu_collector import CLOCK_EVENT_REASONS, GPU_FAMILIES
from spx.daemon.exporter.metrics import Families
from spx.daemon.exporter.server import build_registry
from spx.daemon.gpu import fields as F
from spx.daemon.gpu.backend import GpuBackend, fake_backend
from spx.daemon.gpu.fake import DEFAULT_FIXTURE, FakeNvml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from benchlib import Goal, write_result  # noqa: E402

from harness import Daemon  # noqa: E402

SCRAPE_INTERVAL = 15.0  # fake-clock seconds between scrapes (a common Prometheus interval)
IDLE_SCRAPE_EVERY = 5.0
TICK = os.sysconf("SC_CLK_TCK")

BARE = (
    "import sys, time, prometheus_client\n"
    "httpd, _ = prometheus_client.start_http_server(0, addr='127.0.0.1')\n"
    "print(httpd.server_port, flush=True)\n"
    "time.sleep(3600)\n"
)

# -- scrape: the naive baseline ---------------------------------------------------------------------

LINK_ERROR_COUNTERS = {
    "crc_flit": pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT,
    "crc_data": pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA,
    "replay": pynvml.NVML_NVLINK_ERROR_DL_REPLAY,
    "recovery": pynvml.NVML_NVLINK_ERROR_DL_RECOVERY,
}
# The same families as the real collector, less its own NVML-error and XID-thread metrics.
NAIVE_FAMILIES = [f for f in GPU_FAMILIES if f not in ("spx_nvml_errors_total", "spx_xid_watch_up")]


class NaiveCollector:
    """The usual exporter: one pynvml call per counter, same metric names and samples as spx's.

    Flattered on purpose: it remembers NOT_SUPPORTED (Hopper's crc_data counter) instead of asking again
    each scrape, and it reuses the backend's device identity and XID counts (no calls).
    """

    def __init__(self, backend: GpuBackend) -> None:
        self.backend = backend
        self.nvml = backend.nvml
        self.unsupported: set[tuple[Any, ...]] = set()
        self.links = {
            d.index: int(self._field(backend.handle(d.index), F.LINK_COUNT) or 0) for d in backend.devices()
        }

    def _get(self, function: str, handle: Any, *args: Any, **kwargs: Any) -> Any:
        key = (id(handle), function, *(tuple(a) if isinstance(a, list) else a for a in args))
        if key in self.unsupported:
            return None
        try:
            return getattr(self.nvml, function)(handle, *args, **kwargs)
        except pynvml.NVMLError as err:
            if err.value == pynvml.NVML_ERROR_NOT_SUPPORTED:
                self.unsupported.add(key)
            return None

    def _field(self, handle: Any, fid: int, scope: int = 0) -> float | None:
        values = self._get("nvmlDeviceGetFieldValues", handle, [(fid, scope)])
        if values is None or values[0].nvmlReturn != pynvml.NVML_SUCCESS:
            return None
        return F.field_value(values[0])

    def collect(self) -> Iterable[Any]:
        fam = Families(NAIVE_FAMILIES)
        watcher = self.backend.xid_watcher
        xids = watcher.counts() if watcher is not None else {}
        for dev in self.backend.devices():
            base = {"gpu": str(dev.index), "uuid": dev.uuid}
            fam.add("spx_gpu_info", {**base, "name": dev.name, "pci_bus_id": dev.pci_bus_id,
                                     "driver": self.backend.driver_version}, 1)
            for (index, xid), count in sorted(xids.items()):
                if index == dev.index:
                    fam.add("spx_gpu_xid_errors_total", {**base, "xid": str(xid)}, count)
            samples = self._gpu(self.backend.handle(dev.index), base, self.links[dev.index])
            fam.add("spx_gpu_up", base, 0 if samples is None else 1)
            for name, labels, value in samples or []:
                if value is not None:
                    fam.add(name, labels, value)
        return fam.metrics()

    def _gpu(self, h: Any, base: dict[str, str], links: int) -> list[tuple[str, dict[str, str], Any]] | None:
        mem = self._get("nvmlDeviceGetMemoryInfo", h, version=pynvml.nvmlMemory_v2)
        if mem is None:
            return None
        util = self._get("nvmlDeviceGetUtilizationRates", h)
        out: list[tuple[str, dict[str, str], Any]] = [
            ("spx_gpu_memory_total_bytes", base, mem.total), ("spx_gpu_memory_used_bytes", base, mem.used),
            ("spx_gpu_memory_free_bytes", base, mem.free), ("spx_gpu_memory_reserved_bytes", base, mem.reserved),
            ("spx_gpu_utilization_ratio", base, util and util.gpu / 100),
            ("spx_gpu_memory_utilization_ratio", base, util and util.memory / 100),
        ]
        scaled = [
            ("spx_gpu_power_watts", 1e-3, "nvmlDeviceGetPowerUsage"),
            ("spx_gpu_power_limit_watts", 1e-3, "nvmlDeviceGetEnforcedPowerLimit"),
            ("spx_gpu_energy_joules_total", 1e-3, "nvmlDeviceGetTotalEnergyConsumption"),
            ("spx_gpu_temperature_celsius", 1, "nvmlDeviceGetTemperature", pynvml.NVML_TEMPERATURE_GPU),
            ("spx_gpu_sm_clock_hertz", 1e6, "nvmlDeviceGetClockInfo", pynvml.NVML_CLOCK_SM),
            ("spx_gpu_memory_clock_hertz", 1e6, "nvmlDeviceGetClockInfo", pynvml.NVML_CLOCK_MEM),
            ("spx_gpu_pcie_transmit_bytes_per_second", 1024, "nvmlDeviceGetPcieThroughput", pynvml.NVML_PCIE_UTIL_TX_BYTES),
            ("spx_gpu_pcie_receive_bytes_per_second", 1024, "nvmlDeviceGetPcieThroughput", pynvml.NVML_PCIE_UTIL_RX_BYTES),
        ]
        for name, scale, function, *args in scaled:
            value = self._get(function, h, *args)
            out.append((name, base, None if value is None else value * scale))
        for name, fid in (("spx_gpu_memory_temperature_celsius", F.MEMORY_TEMP),
                          ("spx_gpu_pcie_transmit_bytes_total", F.PCIE_TX_BYTES),
                          ("spx_gpu_pcie_receive_bytes_total", F.PCIE_RX_BYTES)):
            out.append((name, base, self._field(h, fid)))
        for kind, etype in (("corrected", pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                            ("uncorrected", pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)):
            value = self._get("nvmlDeviceGetTotalEccErrors", h, etype, pynvml.NVML_VOLATILE_ECC)
            out.append(("spx_gpu_ecc_errors_total", {**base, "type": kind}, value))
        rows = self._get("nvmlDeviceGetRemappedRows", h)
        for i, kind in enumerate(("correctable", "uncorrectable", "pending", "failure")):
            out.append(("spx_gpu_remapped_rows", {**base, "type": kind}, rows and rows[i]))
        reasons = self._get("nvmlDeviceGetCurrentClocksEventReasons", h)
        for reason, bit in CLOCK_EVENT_REASONS.items():
            out.append(("spx_gpu_clocks_event_active", {**base, "reason": reason},
                        None if reasons is None else float(bool(reasons & bit))))
        for proc in self._get("nvmlDeviceGetComputeRunningProcesses", h) or []:
            out.append(("spx_gpu_process_memory_used_bytes", {**base, "pid": str(proc.pid)}, proc.usedGpuMemory))
        for link in range(links):
            labels = {**base, "link": str(link)}
            state = self._get("nvmlDeviceGetNvLinkState", h, link)
            out.append(("spx_gpu_nvlink_up", labels, None if state is None else float(state == pynvml.NVML_FEATURE_ENABLED)))
            tx, rx = self._field(h, F.LINK_TX, link), self._field(h, F.LINK_RX, link)
            out.append(("spx_gpu_nvlink_transmit_bytes_total", labels, None if tx is None else tx * 1024))
            out.append(("spx_gpu_nvlink_receive_bytes_total", labels, None if rx is None else rx * 1024))
            for kind, counter in LINK_ERROR_COUNTERS.items():
                value = self._get("nvmlDeviceGetNvLinkErrorCounter", h, link, counter)
                out.append(("spx_gpu_nvlink_errors_total", {**labels, "type": kind}, value))
        return out


# -- scrape: harness -------------------------------------------------------------------------------


class StepClock:
    """The fake's monotonic clock: stands still within a scrape, steps SCRAPE_INTERVAL between them."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class TimedNvml:
    """The fake, timing every nvmlDevice* call and first spinning `latency_s` in it (sleep is too coarse)."""

    def __init__(self, fake: FakeNvml, latency_s: float) -> None:
        self._fake = fake
        self._latency = latency_s
        self.inside = 0.0  # seconds spent in nvmlDevice* calls (the scrape thread is the only caller)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._fake, name)
        if not name.startswith("nvmlDevice") or not callable(value):
            return value

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            while time.perf_counter() - start < self._latency:
                pass
            try:
                return value(*args, **kwargs)
            finally:
                self.inside += time.perf_counter() - start

        self.__dict__[name] = timed  # built once per function: the wrapper costs the same on both sides
        return timed


def fixture_with_links(links: int) -> dict:
    fixture = json.loads(DEFAULT_FIXTURE.read_text())
    if links != fixture["defaults"]["nvlink_links"]:
        fixture = copy.deepcopy(fixture)
        fixture["defaults"]["nvlink_links"] = links
        for dev in fixture["devices"]:
            dev["nvlink_down"] = [link for link in dev.get("nvlink_down", []) if link < links]
    return fixture


class Subject:
    """One collector on its own fake (8 GPUs, `links` links each), timed one scrape at a time.

    The subjects' scrapes are interleaved round by round, so load from elsewhere on the host lands on
    all of them alike. Calls and samples are those of the last scrape (they are the same every scrape).
    """

    def __init__(self, kind: str, links: int, latency_s: float) -> None:
        self.clock = StepClock()
        # No process of this host counts as a job's: both sides see the same idle GPUs, whatever else runs.
        self.fake = FakeNvml(fixture_with_links(links), clock=self.clock, process_filter=lambda pid, env: False,
                             source=f"{links}-link")
        self.nvml = TimedNvml(self.fake, latency_s)
        self.backend = fake_backend(self.nvml)
        if kind == "spx":
            self.registry = build_registry(self.backend, lambda: [], "bench")
        else:
            self.backend.start_xid_watch()
            self.registry = CollectorRegistry(auto_describe=False)
            self.registry.register(NaiveCollector(self.backend))  # type: ignore[arg-type]
        generate_latest(self.registry)  # warm-up: spx asks each GPU its link count once
        self.times: list[float] = []
        self.inside: list[float] = []
        self.calls = self.samples = 0

    def scrape(self) -> None:
        self.clock.now += SCRAPE_INTERVAL
        self.fake.calls.clear()
        self.nvml.inside = 0.0
        start = time.perf_counter()
        text = generate_latest(self.registry)
        self.times.append(time.perf_counter() - start)
        self.inside.append(self.nvml.inside)
        self.calls = sum(v for k, v in self.fake.calls.items() if not k.startswith("nvmlEventSet"))
        self.samples = sum(1 for line in text.decode().splitlines() if line and not line.startswith("#"))

    def result(self) -> dict[str, Any]:
        times = sorted(self.times)
        return {"calls": self.calls, "per_gpu": self.calls / len(self.backend.devices()), "samples": self.samples,
                "p50": statistics.median(times) * 1000, "p95": times[int(0.95 * (len(times) - 1))] * 1000,
                "nvml": statistics.median(self.inside) * 1000,
                "own": statistics.median([t - i for t, i in zip(self.times, self.inside, strict=True)]) * 1000}


def scrape_costs(scrapes: int, latency_s: float) -> dict[tuple[str, int, bool], dict[str, Any]]:
    """{(kind, links, modelled): result} for naive/spx × (18 links, 18 links + latency, 4 links)."""
    subjects = {(kind, links, slow): Subject(kind, links, latency_s if slow else 0.0)
                for kind in ("naive", "spx") for links, slow in ((18, False), (18, True), (4, False))}
    try:
        for _ in range(scrapes):
            for subject in subjects.values():
                subject.scrape()
    finally:
        for subject in subjects.values():
            subject.backend.close()
    return {key: subject.result() for key, subject in subjects.items()}


# -- idle ------------------------------------------------------------------------------------------


def memory_kib(pid: int) -> tuple[int, int | None]:
    """(VmRSS, Pss) in KiB; Pss None where smaps_rollup is not readable."""
    rss = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
               if line.startswith("VmRSS:"))
    try:
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
    except OSError:
        return rss, None
    return rss, next((int(line.split()[1]) for line in rollup if line.startswith("Pss:")), None)


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime, every thread (live or exited) included


def http_scrape(port: int) -> float:
    start = time.perf_counter()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
        resp.read()
    return time.perf_counter() - start


def idle(idle_seconds: float, settle: float = 3.0) -> dict[str, dict[str, Any]]:
    """Start all three, settle, then scrape each every 5 s for `idle_seconds` and read /proc."""
    with tempfile.TemporaryDirectory() as tmp:
        daemons = {"fake": Daemon(Path(tmp) / "fake", gpu_backend="fake"),
                   "none": Daemon(Path(tmp) / "none", gpu_backend="none")}
        bare = subprocess.Popen([sys.executable, "-c", BARE], stdout=subprocess.PIPE, text=True)
        try:
            for d in daemons.values():
                d.start()
            assert bare.stdout is not None
            procs = {"bare": (bare.pid, int(bare.stdout.readline()))}
            for kind, d in daemons.items():
                assert d.proc is not None and d.metrics_port is not None
                procs[kind] = (d.proc.pid, d.metrics_port)
            for _, port in procs.values():
                http_scrape(port)  # first scrape: imports, link counts
            time.sleep(settle)
            ticks0 = {k: cpu_ticks(pid) for k, (pid, _) in procs.items()}
            start = time.monotonic()
            lat: dict[str, list[float]] = {k: [] for k in procs}
            in_scrapes = dict.fromkeys(procs, 0)
            peak: dict[str, tuple[int, int | None]] = {k: (0, None) for k in procs}
            deadline = start + idle_seconds
            while True:
                for k, (pid, port) in procs.items():
                    before = cpu_ticks(pid)
                    lat[k].append(http_scrape(port))
                    in_scrapes[k] += cpu_ticks(pid) - before
                    peak[k] = max(peak[k], memory_kib(pid), key=lambda m: m[0])
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                time.sleep(min(IDLE_SCRAPE_EVERY, left))
            wall = time.monotonic() - start
            out = {}
            for k, (pid, _) in procs.items():
                rss, pss = memory_kib(pid)
                ticks = cpu_ticks(pid) - ticks0[k]
                out[k] = {"rss": rss / 1024, "peak": peak[k][0] / 1024, "pss": None if pss is None else pss / 1024,
                          "ticks": ticks, "cpu_ms": ticks * 1000 / TICK, "cpu_pct": ticks / TICK / wall * 100,
                          "scrape_cpu_ms": in_scrapes[k] * 1000 / TICK,
                          "scrape_ms": statistics.median(lat[k]) * 1000, "scrapes": len(lat[k]), "wall": wall}
        finally:
            bare.terminate()
            bare.wait(timeout=10)
            for d in daemons.values():
                d.stop()
    return out


# -- report ----------------------------------------------------------------------------------------


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}×" if b else "∞"


def print_scrape(r: dict[tuple[str, int, bool], dict[str, Any]], scrapes: int, latency_us: float) -> None:
    names = {"naive": "baseline: naive, 1 call/counter", "spx": "spx exporter (build_registry)"}
    print(f"Scrape of the 8×18-link fixture: generate_latest, {scrapes} scrapes, fake NVML")
    head = ("samples", "NVML calls", "calls/GPU", "p50 ms", "p95 ms", "NVML ms", "rest ms")
    print(f"{'':38}{head[0]:>8}{head[1]:>11}{head[2]:>10}{head[3]:>8}{head[4]:>8}{head[5]:>9}{head[6]:>9}")

    def row(label: str, m: dict[str, Any]) -> None:
        print(f"{label:38}{m['samples']:8d}{m['calls']:11d}{m['per_gpu']:10.1f}{m['p50']:8.2f}{m['p95']:8.2f}"
              f"{m['nvml']:9.2f}{m['own']:9.2f}")

    for kind in ("naive", "spx"):
        row(names[kind], r[(kind, 18, False)])
    print(f"MODELLED: + {latency_us:g} µs spun into every nvmlDevice* call (a driver's ioctl)")
    for kind in ("naive", "spx"):
        row("  " + names[kind], r[(kind, 18, True)])
    spx, naive = r[("spx", 18, False)], r[("naive", 18, False)]
    spx4, naive4 = r[("spx", 4, False)], r[("naive", 4, False)]
    modelled = ratio(r[("spx", 18, True)]["p50"], r[("naive", 18, True)]["p50"])
    cost = {k: r[(k, 18, False)]["own"] + r[(k, 18, False)]["calls"] * latency_us / 1000 for k in names}
    print(f"MODELLED without the fake's own cost (rest ms + calls × {latency_us:g} µs): naive {cost['naive']:.2f} ms, "
          f"spx {cost['spx']:.2f} ms")
    print(f"NVML calls per scrape, 4 → 18 links: naive {naive4['calls']} → {naive['calls']}, "
          f"spx {spx4['calls']} → {spx['calls']}")
    print(f"ratio (spx / naive): calls {ratio(spx['calls'], naive['calls'])}; p50 {ratio(spx['p50'], naive['p50'])} "
          f"on the fake, {modelled} / {ratio(cost['spx'], cost['naive'])} modelled; goal ≤ a few calls/GPU, independent of links: "
          f"{spx['per_gpu']:.0f}/GPU, {'independent' if spx4['calls'] == spx['calls'] else 'NOT independent'}")


def print_idle(out: dict[str, dict[str, Any]], idle_seconds: float) -> None:
    print(f"Idle footprint ({idle_seconds:g} s window after a 3 s settle, scraped every {IDLE_SCRAPE_EVERY:g} s)")
    rows = {"bare": "baseline: bare prometheus-client", "fake": "spx-trainer --gpu-backend fake",
            "none": "  (for scale: --gpu-backend none)"}
    print(f"{'':36}{'VmRSS MiB':>10}{'peak MiB':>9}{'PSS MiB':>8}{'CPU ms':>8}{'CPU %':>7}{'in scrapes':>11}"
          f"{'scrape ms':>10}")
    for k, label in rows.items():
        m = out[k]
        pss = "n/a" if m["pss"] is None else f"{m['pss']:.1f}"
        print(f"{label:36}{m['rss']:10.1f}{m['peak']:9.1f}{pss:>8}{m['cpu_ms']:8.0f}{m['cpu_pct']:7.2f}"
              f"{m['scrape_cpu_ms']:11.0f}{m['scrape_ms']:10.2f}")
    d, b = out["fake"], out["bare"]
    tick_ms = 1000 / TICK
    if not b["ticks"]:
        cpu = f"> {d['ticks']}× (bare: under one {tick_ms:.0f} ms tick)"
    else:
        coarse = f" (bare: {b['ticks']} × {tick_ms:.0f} ms ticks, coarse)" if b["ticks"] < 10 else ""
        cpu = ratio(d["ticks"], b["ticks"]) + coarse
    pss = ratio(d["pss"], b["pss"]) if d["pss"] and b["pss"] else "n/a"
    print(f"ratio (daemon / bare): RSS {ratio(d['rss'], b['rss'])}, PSS {pss}, CPU {cpu}, "
          f"HTTP scrape p50 {ratio(d['scrape_ms'], b['scrape_ms'])} ({d['scrapes']} scrapes each, {d['wall']:.1f} s)")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--scrapes", type=int, default=50)
    p.add_argument("--idle-seconds", type=float, default=20.0)
    p.add_argument("--call-latency-us", type=float, default=20.0)
    args = p.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))  # the fixture's XID 79
    costs = scrape_costs(args.scrapes, args.call_latency_us / 1e6)
    print_scrape(costs, args.scrapes, args.call_latency_us)
    print()
    footprint = idle(args.idle_seconds)
    print_idle(footprint, args.idle_seconds)
    write_result("scrape", [{"case": f"scrape {kind}, {links} links" + (", modelled latency" if slow else ""),
                             **{k: round(v, 3) for k, v in m.items()}} for (kind, links, slow), m in costs.items()]
                 + [{"case": f"idle {kind}", **{k: v if v is None else round(v, 3) for k, v in m.items()}}
                    for kind, m in footprint.items()], [
        Goal("NVML calls per scrape, spx / naive", round(costs[("spx", 18, False)]["calls"]
                                                         / costs[("naive", 18, False)]["calls"], 3), "<=", 0.1),
        Goal("spx NVML calls, 18 links / 4 links", costs[("spx", 18, False)]["calls"] / costs[("spx", 4, False)]["calls"],
             "==", 1),
        Goal("idle RSS, daemon / bare prometheus-client", round(footprint["fake"]["rss"] / footprint["bare"]["rss"], 2),
             "<=", 3),
    ])


if __name__ == "__main__":
    main()
