"""How long the main loop waits between turns (service/cadence.py): often while something moves and
for a few seconds after, once a second when all is quiet, and a wake-up counts as motion. A fake
clock and a queue that records its timeouts; nothing waits."""

from __future__ import annotations

import queue

from spx.daemon.service.cadence import MOVING_SECONDS, SETTLE_SECONDS, SETTLED_SECONDS, Cadence


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Wakes:
    """A wake queue that answers each `get` at once: with the next scripted token, or Empty (the
    timeout ran out), advancing the clock by what the wait took."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.script: list[object | None] = []  # None: the wait times out
        self.timeouts: list[float] = []

    def get(self, timeout: float) -> object:
        self.timeouts.append(timeout)
        token = self.script.pop(0) if self.script else None
        if token is None:
            self.clock.now += timeout
            raise queue.Empty
        self.clock.now += timeout / 2
        return token


def turns(cadence: Cadence, wakes: Wakes, moving: list[bool]) -> list[float]:
    for m in moving:
        cadence.wait(wakes, m)  # type: ignore[arg-type]  # the queue's one method the cadence calls
    return wakes.timeouts


def test_a_quiet_loop_turns_once_a_second():
    clock = Clock()
    assert turns(Cadence(5.0, clock), Wakes(clock), [False] * 5) == [SETTLED_SECONDS] * 5


def test_motion_keeps_the_fast_turns_until_it_has_settled():
    clock = Clock()
    waits = turns(Cadence(5.0, clock), Wakes(clock), [True] + [False] * 15)
    fast = int(SETTLE_SECONDS / MOVING_SECONDS)  # the turns within SETTLE_SECONDS of the motion
    assert waits[:fast] == [MOVING_SECONDS] * fast
    assert waits[fast:] == [SETTLED_SECONDS] * (len(waits) - fast)


def test_a_wake_up_is_motion():
    clock = Clock()
    cadence, wakes = Cadence(5.0, clock), Wakes(clock)
    wakes.script = [None, "lane", None, None]
    waits = turns(cadence, wakes, [False, False, False, False])
    assert waits[:2] == [SETTLED_SECONDS, SETTLED_SECONDS]  # quiet until the wake-up came
    assert waits[2:] == [MOVING_SECONDS, MOVING_SECONDS]    # then the turns after it are close


def test_steady_motion_never_slows_the_loop():
    clock = Clock()
    assert set(turns(Cadence(5.0, clock), Wakes(clock), [True] * 40)) == {MOVING_SECONDS}


def test_a_quiet_loop_still_turns_within_the_watchdogs_ping_interval():
    """A host whose WatchdogSec is under 2 s pings more often than once a second: the quiet wait
    shrinks to the ping interval, or systemd would kill a healthy daemon as wedged."""
    clock = Clock()
    assert set(turns(Cadence(0.5, clock), Wakes(clock), [False] * 4)) == {0.5}
