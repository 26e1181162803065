"""The last minutes of each GPU, kept in memory for an incident: what the exporter's collector read
on each scrape (a few numbers per GPU) and the XID events the XID thread heard, time-stamped.

Why a ring buffer fed by the collector: an incident shows the GPU's readings for the 60 s before a
failure, and the collector already reads every one of them on each scrape. Keeping its summaries
costs no NVML call; asking NVML again at the failure would be too late (a GPU off the bus answers
nothing) and would add calls to a loop that must not wait on the driver. The resolution is the
scrape interval (Prometheus' 15 s gives four readings a minute); with no scraper there are none,
and the incident says so.

Bounded: per GPU at most `MAX_READINGS` readings and `MAX_XIDS` events, none older than
`KEEP_SECONDS` once a newer one arrives; a reading is a flat dict of at most `MAX_FIELDS` numbers.
Written by the collector's and the XID thread, read on the loop: one lock.
"""

from __future__ import annotations

import collections
import math
import threading
import time
from collections.abc import Callable

KEEP_SECONDS = 180.0   # longer than an incident's window: the failure is seen some seconds after it happened
MAX_READINGS = 360     # per GPU: a scrape every 0.5 s for three minutes
MAX_XIDS = 32          # per GPU
MAX_FIELDS = 48        # numbers in one reading


class RecentReadings:
    """Per GPU, its recent readings and XID events (see the module doc)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock  # wall time: incidents compare these with the attempts' phases
        self._lock = threading.Lock()
        self._readings: dict[int, collections.deque[dict[str, float]]] = {}
        self._xids: dict[int, collections.deque[tuple[float, int]]] = {}

    def record(self, gpu: int, reading: dict[str, float]) -> None:
        """One scrape's summary of GPU `gpu` (finite numbers only, at most MAX_FIELDS), stamped now."""
        now = self.clock()
        kept = {k: float(v) for k, v in list(reading.items())[:MAX_FIELDS] if math.isfinite(v)}
        kept["time"] = now
        with self._lock:
            ring = self._readings.setdefault(gpu, collections.deque(maxlen=MAX_READINGS))
            ring.append(kept)
            while ring and ring[0]["time"] < now - KEEP_SECONDS:
                ring.popleft()

    def xid(self, gpu: int, xid: int) -> None:
        """An XID event on GPU `gpu`, heard now (the XID thread's listener)."""
        now = self.clock()
        with self._lock:
            ring = self._xids.setdefault(gpu, collections.deque(maxlen=MAX_XIDS))
            ring.append((now, xid))
            while ring and ring[0][0] < now - KEEP_SECONDS:
                ring.popleft()

    def readings(self, gpu: int, start: float, end: float) -> list[dict[str, float]]:
        """GPU `gpu`'s readings stamped within [start, end], oldest first (copies)."""
        with self._lock:
            return [dict(r) for r in self._readings.get(gpu, ()) if start <= r["time"] <= end]

    def xids(self, gpu: int, start: float, end: float) -> list[tuple[float, int]]:
        """GPU `gpu`'s XID events (time, xid) within [start, end], oldest first."""
        with self._lock:
            return [e for e in self._xids.get(gpu, ()) if start <= e[0] <= end]
