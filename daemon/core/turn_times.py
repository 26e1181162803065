"""How long the main loop's turns take: a histogram the loop adds each turn to and `/metrics` reads
(`spx_daemon_loop_turn_seconds`).

Why it exists: everything the daemon does for its jobs waits on a turn (a launch, a relaunch, a
cancel, the watchdog's ping), so the turn's length as work grows — queued jobs, the history in the
store — is the daemon's own cost (bench/bench_scale.py draws it). A turn is measured from its start
to the end of its last stage, not counting the wait for the next wake-up. Stdlib only; the loop's
thread adds, the scrape's thread reads, under one lock.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass

# Upper bounds in seconds: a quiet turn is well under a millisecond; a turn past 2 s is one the
# hostile tests call a stall (the watchdog's own limit is longer).
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True)
class TurnHistogram:
    """A reading: the count of turns at or under each bound of `BUCKETS` (cumulative, then +Inf as
    `count`), their total seconds and their number."""

    cumulative: tuple[int, ...]
    sum: float
    count: int


class TurnTimes:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = [0] * (len(BUCKETS) + 1)
        self._sum = 0.0

    def add(self, seconds: float) -> None:
        """One turn that took `seconds`."""
        with self._lock:
            self._counts[bisect.bisect_left(BUCKETS, seconds)] += 1
            self._sum += seconds

    def read(self) -> TurnHistogram:
        with self._lock:
            counts, total = list(self._counts), self._sum
        running, cumulative = 0, []
        for n in counts[:-1]:
            running += n
            cumulative.append(running)
        return TurnHistogram(tuple(cumulative), total, running + counts[-1])
