"""Caps glibc's malloc arenas before the daemon's threads start, maps large blocks on their own, and
gives back what the arenas keep free, so the daemon's memory stays flat.

glibc gives each thread that allocates while another holds an arena an arena of its own, up to 8 per
core, and keeps what was freed in an arena for that arena's later use (it gives back only whole free
pages at an arena's top). The daemon's threads come and go all day (a thread per control request,
per /metrics scrape, per exited process's watcher) and each takes its SQLite connection's page cache
and the request's buffers from whichever arena it landed in: a long soak filled 15 of 16 arenas on a
2-core machine (1,024 on a 128-core GPU host) and the daemon's RSS rose with each one filled. The
daemon's threads mostly run one at a time under Python's GIL, so two arenas cost it no waiting.

`MALLOC_ARENA_MAX` in the environment (the systemd unit sets it) is glibc's own knob, read at
start-up: when it is set, it wins and nothing is done here. Off glibc (no `mallopt`), nothing is done.

glibc also serves a large block (a scrape's text, a long `spx ls` reply) from the heap rather
than from a mapping of its own once a block that large was freed (its mmap threshold follows the
largest block freed, up to 32 MiB): each such block then lands wherever the heap has room and leaves
a hole when freed. `fix_mmap_threshold` pins the threshold at MMAP_THRESHOLD (glibc's starting value),
so every block from 128 KiB up is mapped and unmapped on its own, whatever was freed before.
`MALLOC_MMAP_THRESHOLD_` in the environment is glibc's knob for it and wins as well.

What is freed inside an arena or the main heap below its top stays the process's: glibc hands
back only whole free pages at a heap's top, so a heap fragmented by a day of short-lived requests
keeps its high-water mark. `Trim` calls `malloc_trim(0)` every TRIM_EVERY_SECONDS from the main loop,
which releases every whole free page in every arena (a few milliseconds for the daemon's ~20 MiB).
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Callable

M_ARENA_MAX = -8  # glibc's <malloc.h>
M_MMAP_THRESHOLD = -3
ARENA_MAX = 2
MMAP_THRESHOLD = 128 * 1024
TRIM_EVERY_SECONDS = 300.0


def cap_arenas(limit: int = ARENA_MAX) -> int | None:
    """Bound the arenas threads started from now on may create; the cap in force, or None when
    this libc cannot be told (not glibc). Call it first thing, before any thread starts: arenas made
    before it stay."""
    return _set("MALLOC_ARENA_MAX", M_ARENA_MAX, limit)


def fix_mmap_threshold(size: int = MMAP_THRESHOLD) -> int | None:
    """Pin the size from which a block gets a mapping of its own (module doc); the threshold in
    force, or None when this libc cannot be told."""
    return _set("MALLOC_MMAP_THRESHOLD_", M_MMAP_THRESHOLD, size)


def _set(env: str, option: int, value: int) -> int | None:
    """`mallopt(option, value)` unless glibc's own environment variable `env` already set it."""
    if os.environ.get(env):
        return int(os.environ[env]) if os.environ[env].isdigit() else None
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return value if mallopt(option, value) == 1 else None


class Trim:
    """`malloc_trim(0)` every TRIM_EVERY_SECONDS (module doc); nothing off glibc."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 malloc_trim: Callable[[int], int] | None = None) -> None:
        """`malloc_trim`: glibc's unless given (None where there is no glibc)."""
        if malloc_trim is None:
            try:
                malloc_trim = ctypes.CDLL(None).malloc_trim
            except (OSError, AttributeError):
                malloc_trim = None
        self._trim = malloc_trim
        self._next = clock() + TRIM_EVERY_SECONDS

    def tick(self, now: float) -> None:
        if self._trim is None or now < self._next:
            return
        self._next = now + TRIM_EVERY_SECONDS
        self._trim(0)
