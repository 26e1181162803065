"""How long the main loop waits for a wake-up before it turns anyway.

Why: what the loop acts on almost always wakes it — a launcher's exit (run/exit_wake.py), a lane's
answer, a control request, inotify, an XID, a lost lease, a stop or reload signal. The timeout is
for what is polled: a running attempt's heartbeat and hang clock (read once a second,
run/attempt_runtime.py and run/executor.py), the GPUs a relaunch waits for, a grace or a backoff
running out, the claims left over from a turn's budget. Turning four times a second with none of
that due was most of what an idle daemon cost (bench/bench_idle.py). So the loop turns every
`MOVING_SECONDS` while something is in motion — a job between phases, a claim waiting, the store
refusing writes, a stop or a reload under way — and for `SETTLE_SECONDS` after the last wake-up or
motion (what follows an event, such as GPUs freed by a job's end, is often polled); otherwise every
`SETTLED_SECONDS`, the running attempts' own once-a-second cadence: a quiet host of running jobs
turns once a second, and nothing it checks is seen later than before.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable

MOVING_SECONDS = 0.25
SETTLED_SECONDS = 1.0
SETTLE_SECONDS = 3.0


class Cadence:
    """The loop's wait after each turn, from whether its turns and wake-ups lately were quiet."""

    def __init__(self, watchdog_every: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        # Never longer than the watchdog's ping interval: the loop pings only after a turn, and a
        # host with a WatchdogSec under 2 s would otherwise have its quiet daemon killed as wedged.
        self.settled = min(SETTLED_SECONDS, watchdog_every)
        self._moving_until = float("-inf")  # until then the loop turns every MOVING_SECONDS

    def wait(self, wake: queue.SimpleQueue[object], moving: bool) -> None:
        """After a turn (`moving`: something in it was in motion): wait for a wake-up, at most as
        long as the module doc says; a wake-up counts as motion."""
        now = self.clock()
        if moving:
            self._moving_until = now + SETTLE_SECONDS
        try:
            wake.get(timeout=self.wait_seconds(now))
        except queue.Empty:
            return
        self._moving_until = self.clock() + SETTLE_SECONDS

    def wait_seconds(self, now: float) -> float:
        return MOVING_SECONDS if now < self._moving_until else self.settled
