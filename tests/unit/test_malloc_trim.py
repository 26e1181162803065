"""The loop's periodic malloc_trim (core/malloc_arenas.Trim): once every TRIM_EVERY_SECONDS, never
between. A fake clock; the trim itself is glibc's and harmless to call here."""

from __future__ import annotations

from spx.daemon.core.malloc_arenas import TRIM_EVERY_SECONDS, Trim


def test_the_trim_runs_once_per_period_from_the_loops_turns():
    trim = Trim(clock=lambda: 100.0)
    for now in (100.0, 150.0, 100.0 + TRIM_EVERY_SECONDS - 0.1):
        trim.tick(now)
    assert trim.trims == 0, "not before a whole period"
    trim.tick(100.0 + TRIM_EVERY_SECONDS)
    trim.tick(100.0 + TRIM_EVERY_SECONDS + 1)
    assert trim.trims == 1
    trim.tick(100.0 + 2 * TRIM_EVERY_SECONDS)
    assert trim.trims == 2
