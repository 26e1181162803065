"""The daemon caps glibc's malloc arenas and pins its mmap threshold at start-up, unless MALLOC_ARENA_MAX
/ MALLOC_MMAP_THRESHOLD_ (glibc's own knobs; the unit sets the first) already did; off glibc it does nothing
and says so."""

from __future__ import annotations

import ctypes
import platform

import pytest

from spx.daemon.core import malloc_arenas

# (what sets it, glibc's environment variable for it, what the daemon sets)
KNOBS = [(malloc_arenas.cap_arenas, "MALLOC_ARENA_MAX", malloc_arenas.ARENA_MAX),
         (malloc_arenas.fix_mmap_threshold, "MALLOC_MMAP_THRESHOLD_", malloc_arenas.MMAP_THRESHOLD)]


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
@pytest.mark.parametrize(("tune", "env", "value"), KNOBS)
def test_on_glibc_it_is_set(monkeypatch, tune, env, value):
    monkeypatch.delenv(env, raising=False)
    assert tune() == value


@pytest.mark.parametrize(("tune", "env", "value"), KNOBS)
def test_the_environments_value_wins_and_libc_is_not_asked(monkeypatch, tune, env, value):
    def no_libc(_name):
        raise AssertionError(f"mallopt called although {env} is set")

    monkeypatch.setenv(env, "4")
    monkeypatch.setattr(ctypes, "CDLL", no_libc)
    assert tune() == 4


def test_a_libc_without_mallopt_is_left_alone(monkeypatch):
    class NoMallopt:
        def __init__(self, _name):
            pass

    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    monkeypatch.setattr(ctypes, "CDLL", NoMallopt)
    assert malloc_arenas.cap_arenas() is None
