"""The jobs' views of one scrape, read once and shared by the parts that show them.

Three parts of a scrape need the jobs: the GPU part (which job holds each GPU, which pid is whose),
the job part (a series set per job, its goodput ledger too) and the host's account (every live
job's ledger times its GPUs). Each read them for itself: on a host with a thousand queued jobs,
three passes of a view and a ledger per job per scrape (bench/bench_scale.py). Here the views are
read at the scrape's first need, at one wall-clock `now` for the whole scrape, with the live jobs'
ledgers kept as they were computed for them; the host's account takes those at that same `now`, so
its figures are what computing them afresh would give. Per thread: each scrape runs its parts on
its own thread, and two scrapes at once each read their own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from spx.daemon.state.goodput import Ledger
from spx.daemon.state.views import JobView

# Reads the views at `now`, putting each live job's ledger (computed for its view) in the dict.
Read = Callable[[float, dict[int, Ledger]], list[JobView]]


class ScrapeJobs:
    def __init__(self, read: Read, wall: Callable[[], float] = time.time) -> None:
        self.read = read
        self.wall = wall
        self._local = threading.local()
        self.reads = 0  # views read (the tests count them)

    @contextmanager
    def scrape(self) -> Iterator[None]:
        """One scrape: what its parts read in here is read once."""
        self._local.taken = None
        self._local.inside = True
        try:
            yield
        finally:
            self._local.inside = False
            self._local.taken = None

    def _taken(self) -> tuple[float, list[JobView], dict[int, Ledger]]:
        taken = getattr(self._local, "taken", None)
        if taken is None:
            now, ledgers = self.wall(), dict[int, Ledger]()
            self.reads += 1
            taken = (now, self.read(now, ledgers), ledgers)
            if getattr(self._local, "inside", False):
                self._local.taken = taken
        return taken

    def views(self) -> list[JobView]:
        return self._taken()[1]

    def live_ledgers(self) -> tuple[float, dict[int, Ledger]]:
        """The scrape's `now` and each live job's ledger at it (job id → ledger)."""
        now, _views, ledgers = self._taken()
        return now, ledgers
