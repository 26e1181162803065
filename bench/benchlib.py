"""What every benchmark reports, in one shape: `make bench` (bench/run_all.py) collects the files and
prints one table with each goal marked met or not.

A benchmark measures its figures and its baseline in the same run, then calls `write_result`:

    write_result("recovery", rows=[{"case": "bare torchrun cold start", "median_s": 8.0}, ...],
                 goals=[Goal("spx cold start / bare torchrun", 1.02, "<=", 1.05)])

which writes bench/results/<name>.json: {"bench", "machine", "when", "rows", "goals"}. Goals are
ratios or counts against a baseline of the same run (never absolute seconds of this machine), so the
file says something on any host.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
_COMPARE = {"<=": lambda v, t: v <= t, ">=": lambda v, t: v >= t, "==": lambda v, t: v == t, ">": lambda v, t: v > t}


@dataclass(frozen=True)
class Goal:
    """One target of an issue: `value op target`, e.g. Goal("goodput at T=60 s", 0.97, ">=", 0.95)."""

    name: str
    value: float
    op: str
    target: float
    unit: str = ""

    @property
    def met(self) -> bool:
        return _COMPARE[self.op](self.value, self.target)


def machine() -> dict[str, Any]:
    """The host a figure was measured on: figures are only comparable within one run on one machine."""
    try:
        mem_kib = int(next(line for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal")).split()[1])
    except (OSError, StopIteration, ValueError):
        mem_kib = 0
    # platform.processor() runs `uname -p`: asked only where /proc/cpuinfo names no model.
    cpu = next((line.split(":", 1)[1].strip() for line in _read_lines("/proc/cpuinfo") if line.startswith("model name")),
               None) or platform.processor()
    return {
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "memory_gib": round(mem_kib / 2**20, 1),
        "gpu": "none (gloo on CPU, fake NVML)" if not Path("/proc/driver/nvidia/version").exists() else "nvidia",
        "python": platform.python_version(),
        "kernel": platform.release(),
    }


def _read_lines(path: str) -> list[str]:
    try:
        return Path(path).read_text().splitlines()
    except OSError:
        return []


def write_result(name: str, rows: list[dict[str, Any]], goals: list[Goal], results_dir: Path = RESULTS) -> Path:
    """Write bench/results/<name>.json (atomically: a half-written result is never read by run_all)."""
    results_dir.mkdir(parents=True, exist_ok=True)
    doc = {
        "bench": name,
        "machine": machine(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rows": rows,
        "goals": [asdict(g) | {"met": g.met} for g in goals],
    }
    path = results_dir / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)
    return path
