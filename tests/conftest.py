"""Suite-wide guards: a test that leaks a thread or a child process fails (watchdog's conftest
idea). Long-lived processes must be stopped by the test that started them."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable

import psutil
import pytest


def _children() -> set[int]:
    live = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                live.add(p.pid)
        except psutil.NoSuchProcess:  # exited between the listing and the look
            pass
    return live


@pytest.fixture
def leak_exempt_pids() -> Callable[[], set[int]]:
    """Processes the guard leaves alone because something else owns them; a folder whose tests
    run such processes (tests/systemd: whatever runs under the sandbox's systemd) overrides it."""
    return set


@pytest.fixture(autouse=True)
def no_leaked_threads_or_children(leak_exempt_pids):
    threads_before = set(threading.enumerate())
    children_before = _children()
    yield
    deadline = time.monotonic() + 10
    while True:
        leaked_threads = [t for t in threading.enumerate() if t not in threads_before and t.is_alive()]
        leaked_children = _children() - children_before - leak_exempt_pids()
        if (not leaked_threads and not leaked_children) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    for pid in leaked_children:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    problems = []
    if leaked_threads:
        problems.append(f"leaked threads: {[t.name for t in leaked_threads]}")
    if leaked_children:
        problems.append(f"leaked child processes (killed now): {sorted(leaked_children)}")
    if problems:
        pytest.fail("; ".join(problems))
