"""The loop's periodic malloc_trim (core/malloc_arenas.Trim): once every TRIM_EVERY_SECONDS, never
between. A fake clock, and the trim given: each call is recorded with its argument."""

from __future__ import annotations

from spx.daemon.core.malloc_arenas import TRIM_EVERY_SECONDS, Trim


def test_the_trim_runs_once_per_period_from_the_loops_turns():
    calls: list[int] = []
    trim = Trim(clock=lambda: 100.0, malloc_trim=lambda pad: calls.append(pad) or 1)
    for now in (100.0, 150.0, 100.0 + TRIM_EVERY_SECONDS - 0.1):
        trim.tick(now)
    assert calls == [], "not before a whole period"
    trim.tick(100.0 + TRIM_EVERY_SECONDS)
    trim.tick(100.0 + TRIM_EVERY_SECONDS + 1)
    assert calls == [0], "all that malloc keeps free above the heap's top goes back (pad 0)"
    trim.tick(100.0 + 2 * TRIM_EVERY_SECONDS)
    assert calls == [0, 0]
