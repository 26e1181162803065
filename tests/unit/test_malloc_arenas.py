"""The daemon caps glibc's malloc arenas and pins its mmap threshold at start-up, unless MALLOC_ARENA_MAX
/ MALLOC_MMAP_THRESHOLD_ (glibc's own knobs; the unit sets the first) already did; off glibc it does nothing
and says so."""

from __future__ import annotations

import ctypes
import platform

import pytest

from spx.daemon.core import malloc_arenas


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt(M_ARENA_MAX) is glibc's")
def test_on_glibc_the_cap_is_set(monkeypatch):
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert malloc_arenas.cap_arenas() == malloc_arenas.ARENA_MAX


def test_the_environments_cap_wins_and_libc_is_not_asked(monkeypatch):
    def no_libc(_name):
        raise AssertionError("mallopt called although MALLOC_ARENA_MAX is set")

    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    monkeypatch.setattr(ctypes, "CDLL", no_libc)
    assert malloc_arenas.cap_arenas() == 4


def test_a_libc_without_mallopt_is_left_alone(monkeypatch):
    class NoMallopt:
        def __init__(self, _name):
            pass

    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    monkeypatch.setattr(ctypes, "CDLL", NoMallopt)
    assert malloc_arenas.cap_arenas() is None


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt(M_MMAP_THRESHOLD) is glibc's")
def test_on_glibc_the_mmap_threshold_is_pinned(monkeypatch):
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    assert malloc_arenas.fix_mmap_threshold() == malloc_arenas.MMAP_THRESHOLD


def test_the_environments_mmap_threshold_wins(monkeypatch):
    def no_libc(_name):
        raise AssertionError("mallopt called although MALLOC_MMAP_THRESHOLD_ is set")

    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    monkeypatch.setattr(ctypes, "CDLL", no_libc)
    assert malloc_arenas.fix_mmap_threshold() == 65536
