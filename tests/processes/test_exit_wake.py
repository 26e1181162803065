"""The exit thread: the loop hears of an exit at once, Popen still reads the status, and one thread
waits on every pidfd."""

from __future__ import annotations

import subprocess
import sys
import threading

from spx.daemon.run.exit_wake import ExitWatch


def test_an_exit_wakes_the_loop_and_leaves_the_status_to_popen():
    exits = ExitWatch()
    try:
        child = subprocess.Popen([sys.executable, "-c", "import sys, time; time.sleep(0.3); sys.exit(7)"])
        woke = threading.Event()
        assert exits.watch(child.pid, woke.set)
        assert not woke.is_set(), "no wake while it runs"
        assert woke.wait(30), "its exit woke the loop"
        assert child.wait(30) == 7, "not reaped by the watcher: the exit status is still Popen's"
    finally:
        exits.close()


def exit_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "spx-exits"}


def test_one_thread_waits_on_every_pidfd():
    before = exit_threads()
    exits = ExitWatch()
    children = [subprocess.Popen([sys.executable, "-c", f"import time; time.sleep(0.2 + {i} / 10)"]) for i in range(4)]
    woke = [threading.Event() for _ in children]
    try:
        for child, event in zip(children, woke, strict=True):
            assert exits.watch(child.pid, event.set)
        assert len(exit_threads() - before) == 1
        assert all(e.wait(30) for e in woke), "each exit called its own callback"
    finally:
        exits.close()
        for child in children:
            child.wait(30)


def test_a_process_that_cannot_be_watched_is_left_to_the_tick():
    exits = ExitWatch()
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: its pid names no process now
    assert exits.watch(child.pid, lambda: None) is False
    exits.close()
