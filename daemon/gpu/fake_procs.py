"""Which live processes the fake NVML reports as compute processes on which fake GPU.

The daemon gives each job's processes `SPX_JOB` and a `CUDA_VISIBLE_DEVICES` of fake indices, so a
real /proc scan tells the fake what a driver would: a worker (`LOCAL_RANK` set) holds a context on
the one GPU it uses; any other process of a job (a `python` launcher job, or torchrun's agent, which
on real hardware holds none) is reported on every GPU it can see, erring towards "busy". That makes
"GPUs are free after the job was killed" and per-process memory attribution real checks with the
fake. Zombies have an empty environ, so a dead but unreaped worker counts as gone, as with a driver.

A daemon's fake is scoped to its own jobs (`run_dir_filter`): several daemons on one test machine
(tests run in parallel, sandboxed systemd daemons) each simulate a host of their own, instead of
seeing each other's workers on "their" GPUs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path

ProcessFilter = Callable[[int, Mapping[str, str]], bool]

# One /proc scan serves every GPU of a scrape; 100 ms keeps "GPUs free after kill" checks current.
SCAN_TTL_SECONDS = 0.1


def _environ(pid: int, proc: Path) -> dict[str, str] | None:
    try:
        raw = (proc / str(pid) / "environ").read_bytes()
    except OSError:
        return None
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key in (b"SPX_JOB", b"CUDA_VISIBLE_DEVICES", b"LOCAL_RANK", b"SPX_ATTEMPT_ID", b"SPX_HEARTBEAT_FILE"):
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def run_dir_filter(run_dir: Path) -> ProcessFilter:
    """Only the job processes of the daemon whose run dir this is: their heartbeat file lies in it
    (every process of an attempt inherits SPX_HEARTBEAT_FILE)."""
    prefix = f"{run_dir.absolute()}/"
    return lambda _pid, env: env.get("SPX_HEARTBEAT_FILE", "").startswith(prefix)


def _visible(value: str, uuids: list[str]) -> list[int]:
    """Fake GPU indices named by a CUDA_VISIBLE_DEVICES value (indices or GPU UUIDs)."""
    out: list[int] = []
    for item in value.split(","):
        item = item.strip()
        if item.isdigit() and int(item) < len(uuids):
            out.append(int(item))
        elif item.startswith("GPU-") and item in uuids:
            out.append(uuids.index(item))
        else:
            break  # CUDA stops at the first invalid entry
    return out


class ProcessScanner:
    """Maps fake GPU index → pids, from the environments of live processes."""

    def __init__(self, uuids: list[str], process_filter: ProcessFilter | None = None, proc: Path = Path("/proc")):
        self._uuids = uuids
        self._filter = process_filter
        self._proc = proc
        self._at = -1.0
        self._by_gpu: dict[int, list[int]] = {}

    def pids(self, index: int) -> list[int]:
        now = time.monotonic()
        if now - self._at > SCAN_TTL_SECONDS:
            self._by_gpu = self._scan()
            self._at = now
        return self._by_gpu.get(index, [])

    def _scan(self) -> dict[int, list[int]]:
        by_gpu: dict[int, list[int]] = {}
        me = os.getpid()
        try:
            names = os.listdir(self._proc)
        except OSError:
            return by_gpu
        for name in names:
            if not name.isdigit() or int(name) == me:
                continue
            pid = int(name)
            env = _environ(pid, self._proc)
            if not env or not env.get("SPX_JOB") or "CUDA_VISIBLE_DEVICES" not in env:
                continue
            if self._filter is not None and not self._filter(pid, env):
                continue
            visible = _visible(env["CUDA_VISIBLE_DEVICES"], self._uuids)
            rank = env.get("LOCAL_RANK", "")
            if rank.isdigit() and int(rank) < len(visible):
                visible = [visible[int(rank)]]
            for index in visible:
                by_gpu.setdefault(index, []).append(pid)
        for pids in by_gpu.values():
            pids.sort()
        return by_gpu
