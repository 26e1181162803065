"""The launcher-exit wake: the loop hears of an exit at once, and Popen still reads the status."""

from __future__ import annotations

import subprocess
import sys
import threading

from spx.daemon.run import exit_wake


def test_an_exit_wakes_the_loop_and_leaves_the_status_to_popen():
    child = subprocess.Popen([sys.executable, "-c", "import sys, time; time.sleep(0.3); sys.exit(7)"])
    woke = threading.Event()
    assert exit_wake.watch(child.pid, woke.set)
    assert not woke.is_set(), "no wake while it runs"
    assert woke.wait(30), "its exit woke the loop"
    assert child.wait(30) == 7, "not reaped by the watcher: the exit status is still Popen's"
    for t in threading.enumerate():
        if t.name == f"spx-exit-{child.pid}":
            t.join(10)


def test_a_process_that_cannot_be_watched_is_left_to_the_tick():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: its pid names no process now
    assert exit_wake.watch(child.pid, lambda: None) is False
