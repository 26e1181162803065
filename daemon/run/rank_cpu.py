"""How much a rank's process waits for a CPU: the host-side cause of a slow rank whose GPU looks fine.

`/proc/PID/schedstat` holds three numbers the kernel keeps per task: nanoseconds run on a CPU,
nanoseconds runnable but waiting on a run queue, timeslices. The share of waiting between two reads
(since the process started, at the first) says whether the rank is starved of CPU (a data loader
fighting it, another job's threads on its cores). The rank's process is the job's process whose
environment has RANK=<rank> (torchrun sets it in each worker's), found once per pid. Reads /proc only,
never a file a user writes; a few hundred bytes per straggler seen.
"""

from __future__ import annotations

import threading
from pathlib import Path

PROC = Path("/proc")


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()[:1 << 20]
    except OSError:
        return b""


class RunQueueWait:
    """Per pid: its rank (from its environment) and its last schedstat sample. Thread-safe."""

    def __init__(self, proc: Path = PROC) -> None:
        self.proc = proc
        self._rank: dict[int, int | None] = {}
        self._last: dict[int, tuple[int, int]] = {}
        self._lock = threading.Lock()

    def rank_pid(self, pids: list[int], rank: int) -> int | None:
        """The pid among `pids` that is global rank `rank` (None: none is)."""
        for pid in pids:
            with self._lock:
                known = pid in self._rank
            if not known:
                found = next((v[5:] for v in _read(self.proc / str(pid) / "environ").split(b"\0")
                              if v.startswith(b"RANK=")), b"")
                with self._lock:
                    self._rank[pid] = int(found) if found.isdigit() and len(found) < 8 else None
            if self._rank.get(pid) == rank:
                return pid
        return None

    def waiting_share(self, pid: int) -> float | None:
        """The share of its time `pid` was runnable but waiting for a CPU, since the last call for
        it (the first: since it started); None when /proc cannot say."""
        fields = _read(self.proc / str(pid) / "schedstat").split()
        if len(fields) < 2 or not all(f.isdigit() and len(f) < 20 for f in fields[:2]):
            return None
        ran, waited = int(fields[0]), int(fields[1])
        with self._lock:
            before = self._last.get(pid, (0, 0))
            self._last[pid] = (ran, waited)
        d_ran, d_waited = ran - before[0], waited - before[1]
        if d_ran < 0 or d_waited < 0 or d_ran + d_waited == 0:
            return None
        return d_waited / (d_ran + d_waited)

    def forget(self, live: set[int]) -> None:
        """Drop what is kept of pids no longer live."""
        with self._lock:
            for table in (self._rank, self._last):
                for pid in [p for p in table if p not in live]:
                    del table[pid]
