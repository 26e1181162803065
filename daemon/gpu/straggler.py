"""A slow rank, named and explained: which rank is slower than the others, on which GPU, and why.

    slow = slow_rank(times, threshold_percent)     # from the heartbeat's rank_step_seconds
    gpu = rank_gpu(slow.rank, job_gpus, first)     # torchrun's local rank → CUDA_VISIBLE_DEVICES
    found = explain(slow, gpu, *board.latest(gpu)) # "rank 2 is 14 % slower than the median: GPU 2
                                                   #  at 1410 of 1980 MHz, thermal slowdown (89 °C)"

A rank is slow when its own work per step (spx.trainer's per-rank forward time, heartbeat
`rank_step_seconds`) is at least `threshold_percent` above the median of all ranks. The trainer
reports each rank's best window of its last few, so a passing hiccup is not a straggler.

Rank → GPU: the daemon set CUDA_VISIBLE_DEVICES to the job's GPUs in order, and torchrun gives local
rank i device i of those (spx.trainer: `local_rank % device_count`); a node's local rank is its
global rank minus the node's first (the heartbeat's `ranks`). The cause is the first of: the GPU's
throttle reasons (thermal, power brake, HW slowdown, power cap, sync boost), NVLink errors that grew
between the last two readings, the rank's process waiting for a CPU (run/rank_cpu.py) at least 20 %
of its time, an SM clock under 90 % of its maximum; else "unknown".

Scripts without spx.trainer report no rank times: `throttled_gpus` then names the job's GPUs whose
clocks are held down, with the same evidence.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from spx.daemon.gpu.evidence import GpuReading

DEFAULT_THRESHOLD_PERCENT = 10.0
LOW_CLOCK_FRACTION = 0.9
# A rank's process that spent at least this share of its time runnable but waiting for a CPU
# (/proc/PID/schedstat, run/rank_cpu.py) is starved of CPU: the cause when its GPU shows none.
CPU_CONTENTION_SHARE = 0.2

# Throttle reasons by the cause label they give (in this order of precedence), and their words.
CAUSES = (
    ("thermal", ("hw_thermal_slowdown", "sw_thermal_slowdown"), "thermal slowdown"),
    ("power_brake", ("hw_power_brake",), "power brake"),
    ("hw_slowdown", ("hw_slowdown",), "HW slowdown"),
    ("power_cap", ("sw_power_cap",), "power cap"),
    ("sync_boost", ("sync_boost",), "sync boost"),
)


@dataclass(frozen=True)
class SlowRank:
    rank: int
    seconds: float
    median: float

    @property
    def slower(self) -> float:
        """How much slower than the median, as a fraction (0.14: 14 %)."""
        return self.seconds / self.median - 1.0


@dataclass(frozen=True)
class Straggler:
    """A slow rank (or, for a script without rank times, `rank` None: a throttled GPU of the job)
    with its GPU (None: a CPU job), the cause label and the sentence `spx status` shows."""

    rank: int | None
    gpu: int | None
    slower: float | None
    cause: str
    text: str

    def to_json(self) -> dict:
        return {"rank": self.rank, "gpu": self.gpu, "slower": self.slower, "cause": self.cause, "text": self.text}


def slow_rank(times: list[float] | None, threshold_percent: float = DEFAULT_THRESHOLD_PERCENT) -> SlowRank | None:
    """The slowest rank if it is at least `threshold_percent` above the median of all (None: no
    such rank, fewer than 2 ranks, or nothing measured)."""
    if not times or len(times) < 2:
        return None
    median = statistics.median(times)
    rank = max(range(len(times)), key=lambda r: times[r])
    if median <= 0 or times[rank] < median * (1 + threshold_percent / 100.0):
        return None
    return SlowRank(rank, times[rank], median)


def rank_gpu(rank: int, gpus: list[int], node_ranks: list[int] | None = None) -> int | None:
    """The GPU global `rank` ran on, given the job's GPUs on this host in CUDA_VISIBLE_DEVICES
    order and this node's global ranks [first, last] (None: one host, from 0); None for a CPU job
    or a rank of another node."""
    first, last = node_ranks if node_ranks else (0, None)
    if not gpus or rank < first or (last is not None and rank > last):
        return None
    return gpus[(rank - first) % len(gpus)]


def cause(now: GpuReading | None, before: GpuReading | None) -> tuple[str, str]:
    """(cause label, evidence in words) from the GPU's newest reading and the one before it."""
    if now is None:
        return "unknown", ""
    clock = (f"at {now.sm_mhz:.0f} of {now.sm_max_mhz:.0f} MHz" if now.sm_mhz is not None and now.sm_max_mhz
             else f"at {now.sm_mhz:.0f} MHz" if now.sm_mhz is not None else "")
    if "gpu_idle" in now.reasons:  # nothing ran on it when read: its clock says nothing about its speed
        return "unknown", "idle when read"
    for label, reasons, words in CAUSES:
        if now.reasons & set(reasons):
            return label, ", ".join(p for p in (clock, f"{words}{_detail(label, now)}") if p)
    if now.link_errors is not None and before is not None and before.link_errors is not None \
            and now.link_errors > before.link_errors:
        return "link_errors", ", ".join(p for p in (clock, f"NVLink errors +{now.link_errors - before.link_errors:.0f}") if p)
    if now.sm_mhz is not None and now.sm_max_mhz and now.sm_mhz < LOW_CLOCK_FRACTION * now.sm_max_mhz:
        return "low_clock", clock
    return "unknown", clock


def _detail(label: str, r: GpuReading) -> str:
    if label == "thermal" and r.temperature_c is not None:
        return f" ({r.temperature_c:.0f} °C)"
    if label in ("power_brake", "power_cap") and r.power_w is not None:
        limit = f" of {r.power_limit_w:.0f}" if r.power_limit_w else ""
        return f" ({r.power_w:.0f}{limit} W)"
    return ""


def explain(slow: SlowRank, gpu: int | None, now: GpuReading | None, before: GpuReading | None,
            cpu_wait: float | None = None) -> Straggler:
    """The straggler `slow`, joined with its GPU's evidence and, where that shows no cause, its
    process's share of time waiting for a CPU (`cpu_wait`; None: not known)."""
    label, evidence = cause(now, before) if gpu is not None else ("unknown", "")
    if label in ("unknown", "low_clock") and cpu_wait is not None and cpu_wait >= CPU_CONTENTION_SHARE:
        label = "cpu_contention"
        evidence = ", ".join(p for p in (evidence if gpu is not None else "",
                                         f"CPU contention (its process waited for a CPU {cpu_wait * 100:.0f} % of the time)") if p)
        where = f"GPU {gpu} {evidence}" if gpu is not None else evidence
        return Straggler(slow.rank, gpu, round(slow.slower, 4), label,
                         f"rank {slow.rank} is {slow.slower * 100:.0f} % slower than the median: {where}")
    head = f"rank {slow.rank} is {slow.slower * 100:.0f} % slower than the median"
    where = f"GPU {gpu} {evidence}".rstrip() if gpu is not None else ""
    if where and label == "unknown":
        where += ", no throttling seen"
    return Straggler(slow.rank, gpu, round(slow.slower, 4), label, f"{head}: {where}" if where else head)


def throttled_gpus(gpus: list[int], readings: dict[int, tuple[GpuReading | None, GpuReading | None]]) -> list[Straggler]:
    """For a job without rank times: each of its GPUs whose clocks a throttle reason holds down."""
    found = []
    for gpu in gpus:
        now, before = readings.get(gpu, (None, None))
        label, evidence = cause(now, before)
        if label in {c[0] for c in CAUSES}:
            found.append(Straggler(None, gpu, None, label, f"GPU {gpu} throttled: {evidence}"))
    return found
