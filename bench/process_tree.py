"""Ending a bare torchrun run completely: its agent starts the workers in sessions of their own, so
killing the agent's process group leaves the workers running (orphans that train on for hours and
skew every later measurement). The benchmarks find the whole tree by parent pid and kill all of it."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def descendants(root: int) -> list[int]:
    """Every live process below `root`, parents before children."""
    parent: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found: list[int] = []
    frontier = [root]
    while frontier:
        children = [pid for pid, ppid in parent.items() if ppid in frontier]
        found += children
        frontier = children
    return found


def kill_tree(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    """Send `sig` to `proc`'s process group and to every process below it, then reap `proc`."""
    below = descendants(proc.pid)
    for pid in below:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
    proc.wait()


def live_environments() -> Iterator[tuple[int, set[bytes]]]:
    """(pid, its environment's KEY=VALUE entries) of every live process (zombies and the dead left
    out) this user may read: how the benches find a job's processes by the variables spx gives them."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            env = set(Path(entry.path, "environ").read_bytes().split(b"\0"))
            state = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X"):
            yield int(entry.name), env


def cpu_seconds(pid: int) -> float:
    """The CPU time `pid` has used (utime + stime, every thread, the ones that ended included): what a
    busy machine's contention barely changes, unlike wall time. The kernel keeps it in ns and shows it
    in clock ticks (10 ms here): the difference of two readings is within a tick of the truth, and
    unbiased, so a sum of many short spans (a scrape's few ms each) comes out right."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK

