"""When this worker's start-up phases ended, for the daemon's per-attempt timeline (`spx status --timeline`).

The loop marks each phase of `contract.worker_env.WORKER_PHASES` once, as it passes it; rank 0's
heartbeat carries what was marked (`recorded()`), so the first beat after the first step tells the
daemon where this attempt's start-up time went. `interpreter_up` is not marked but read: the
process's own start time from /proc (the kernel's, 10 ms resolution), because nothing of ours runs
that early. Torch-free and process-global on purpose: one process is one attempt's worker.
"""

from __future__ import annotations

import os
import time

from spx.daemon.contract.worker_env import WORKER_PHASES

_marked: dict[str, float] = {}


def mark(name: str, when: float | None = None) -> None:
    """Record that phase `name` ended now (or at `when`); only its first mark counts."""
    if name not in WORKER_PHASES:
        raise ValueError(f"not a worker phase: {name!r} (one of {', '.join(WORKER_PHASES)})")
    _marked.setdefault(name, time.time() if when is None else when)


def taken_now(when: float | None = None) -> None:
    """This process became an attempt's worker now, its interpreter and imports done before (a
    standby worker handed its rank: daemon/run/standby_worker.py). For this attempt they were ready
    at that moment, so both phases are that moment; what was marked before is forgotten."""
    at = time.time() if when is None else when
    _marked.clear()
    _marked.update(interpreter_up=at, torch_imported=at)


def recorded() -> dict[str, float]:
    """Every phase marked so far, with `interpreter_up` where /proc tells it (read once)."""
    if "interpreter_up" not in _marked:
        started = process_start_time()
        if started is not None:
            _marked["interpreter_up"] = started
    return dict(_marked)


def process_start_time(pid: int | str = "self") -> float | None:
    """When process `pid` started (Unix seconds): /proc/PID/stat field 22 counts clock ticks since
    boot on the boot-time clock, so now minus (boot clock now − that) is its wall time, to a tick
    (/proc/stat's btime is whole seconds: too coarse for a phase). None where /proc cannot tell."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
        return time.time() - (since_boot - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None
