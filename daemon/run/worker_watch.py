"""A worker's abnormal death, seen by the daemon the moment it happens, not when its launcher ends.

When one rank of a torchrun (or DeepSpeed) attempt dies, the launcher notices at its next monitor
look, SIGTERMs the surviving ranks, waits for them to leave (a traceback and an interpreter's
teardown with torch loaded: up to seconds) and only then exits, which is when the daemon heard of it.
Here the daemon watches the workers itself: each attempt's workers are found under its monitor (the
first processes below it whose environment has LOCAL_RANK: the launcher's children, never a rank's
own children such as data-loader workers, which inherit it), and each gets a pidfd on the one exit
thread (exit_wake.ExitWatch). At a worker's exit the thread reads its wait status from
/proc/PID/stat (field 52, exit_code) while it is still a zombie — the launcher reaps it at its next
look, a tenth of a second later for torchrun — and an abnormal one (a signal, a nonzero code) is
queued for the loop, which wakes. The daemon is not the worker's parent, so this is the only way to
its status: if it cannot be read (reaped first, no permission, a pid already reused), nothing is
reported and the launcher's own exit tells as before. An exit 0 is never reported (ranks finish at
slightly different times at the end of training). What it means is the machine's (WorkerDied).

Workers are looked for every LOOK_SECONDS while an attempt has fewer than its expected count
(a handful of small /proc reads: the children files of a few processes and their environments),
then every SLOW_LOOK_SECONDS past LOOK_FAST_FOR_SECONDS, until the attempt is dropped.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from spx.daemon.lifecycle.record import WorkerExit
from spx.daemon.run import proctree
from spx.daemon.run.exit_wake import ExitWatch

WORKER_LAUNCHERS = ("torchrun", "deepspeed")  # their workers are their children, each with its LOCAL_RANK
LOOK_SECONDS = 0.2
LOOK_FAST_FOR_SECONDS = 60.0
SLOW_LOOK_SECONDS = 2.0
DEPTH = 4  # monitor → exec shim/launcher → (a launcher's own helper) → workers, with a level to spare


def worker_rank(pid: int) -> tuple[bool, int | None]:
    """(is it a worker — its environment names a LOCAL_RANK —, its RANK if readable)."""
    env = proctree.read_proc(f"/proc/{pid}/environ").split(b"\0")
    if not any(v.startswith(b"LOCAL_RANK=") for v in env):
        return False, None
    rank = next((v[len(b"RANK="):] for v in env if v.startswith(b"RANK=")), b"")
    return True, int(rank) if rank.isdigit() and len(rank) < 10 else None


def find_workers(root: int, depth: int = DEPTH) -> dict[int, int | None]:
    """The workers below process `root` (pid → rank): the first processes on each branch whose
    environment has LOCAL_RANK; what a worker starts itself is not looked at."""
    found: dict[int, int | None] = {}
    level = sorted(proctree.children(root))
    for _ in range(depth):
        below: list[int] = []
        for pid in level:
            worker, rank = worker_rank(pid)
            if worker:
                found[pid] = rank
            else:
                below.extend(sorted(proctree.children(pid)))
        level = below
    return found


def start_ticks(pid: int) -> int | None:
    fields = proctree.stat_fields(pid)
    return int(fields[19]) if len(fields) > 19 else None


def exit_status(pid: int, ticks: int | None) -> int | None:
    """The wait status of exited process `pid` (a zombie not reaped yet, started at `ticks`), or
    None if it cannot be told: reaped already, the pid another process's now, a kernel before 3.5."""
    fields = proctree.stat_fields(pid)
    if len(fields) < 50 or fields[0] not in (b"Z", b"X") or ticks is None or int(fields[19]) != ticks:
        return None
    return int(fields[49])  # field 52: exit_code, the status as waitpid(2) reports it


def death_of(pid: int, rank: int | None, status: int | None) -> WorkerExit | None:
    """A worker's abnormal exit (a signal, a nonzero code); None for exit 0 or an unknown status."""
    if status is None:
        return None
    if os.WIFSIGNALED(status):
        return WorkerExit(pid, rank, None, os.WTERMSIG(status))
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
    return None if not code else WorkerExit(pid, rank, code, None)


@dataclass
class _Attempt:
    monitor: int
    expected: int
    since: float
    watched: dict[int, int | None] = field(default_factory=dict)  # pid → rank
    deaths: list[tuple[WorkerExit, float]] = field(default_factory=list)  # (death, wall time seen)
    next_look: float = 0.0


class WorkerWatch:
    """Each watched attempt's workers, and the abnormal deaths seen of them (drained by the loop)."""

    def __init__(self, exits: ExitWatch, wake: Callable[[], None], wall: Callable[[], float] = time.time,
                 clock: Callable[[], float] = time.monotonic):
        self.exits, self.wake, self.wall, self.clock = exits, wake, wall, clock
        self._lock = threading.Lock()
        self._attempts: dict[tuple[int, int], _Attempt] = {}  # (job id, attempt number) → its watch

    def attempt(self, job_id: int, number: int, monitor: int, expected: int) -> None:
        """Watch the workers of attempt `number` of the job, below its monitor `monitor`."""
        key = (job_id, number)
        with self._lock:
            self._attempts[key] = _Attempt(monitor, max(1, expected), self.clock())
        self.exits.repeat(LOOK_SECONDS, lambda: self._look(key))

    def drop(self, job_id: int) -> None:
        """The job's attempt is over (or the job forgotten): no more looks, its deaths discarded
        (its pidfds close as its processes end)."""
        with self._lock:
            for key in [k for k in self._attempts if k[0] == job_id]:
                del self._attempts[key]

    def deaths(self, job_id: int, number: int) -> list[tuple[WorkerExit, float]]:
        """The attempt's abnormal worker deaths seen since the last call, with when each was seen."""
        with self._lock:
            w = self._attempts.get((job_id, number))
            if w is None or not w.deaths:
                return []
            out, w.deaths = w.deaths, []
            return out

    def watched(self, job_id: int, number: int) -> dict[int, int | None]:
        """The attempt's workers found so far (pid → rank), each with a pidfd on the exit thread."""
        with self._lock:
            w = self._attempts.get((job_id, number))
            return dict(w.watched) if w is not None else {}

    def _look(self, key: tuple[int, int]) -> bool:
        """(On the exit thread.) New workers of the attempt get a pidfd; False once all are watched
        or the attempt is dropped."""
        with self._lock:
            w = self._attempts.get(key)
            if w is None or len(w.watched) >= w.expected:
                return False
            now = self.clock()
            if now < w.next_look:
                return True
            w.next_look = now + (SLOW_LOOK_SECONDS if now - w.since > LOOK_FAST_FOR_SECONDS else 0.0)
            known = set(w.watched)
        for pid, rank in find_workers(w.monitor).items():
            if pid in known:
                continue
            ticks = start_ticks(pid)
            with self._lock:
                w.watched[pid] = rank
            self.exits.watch(pid, functools.partial(self._exited, key, pid, rank, ticks))
        return True

    def _exited(self, key: tuple[int, int], pid: int, rank: int | None, ticks: int | None) -> None:
        """(On the exit thread, at once.) Read the worker's status before its launcher reaps it."""
        death = death_of(pid, rank, exit_status(pid, ticks))
        if death is None:
            return
        with self._lock:
            w = self._attempts.get(key)
            if w is None:
                return
            w.deaths.append((death, self.wall()))
        self.wake()
