"""Suite-wide guards: a test that leaks a thread or a child process fails (watchdog's conftest
idea). Long-lived processes must be stopped by the test that started them."""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE}


@pytest.fixture(autouse=True)
def no_leaked_threads_or_children():
    threads_before = set(threading.enumerate())
    children_before = _children()
    yield
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        leaked_threads = [t for t in threading.enumerate() if t not in threads_before and t.is_alive()]
        leaked_children = _children() - children_before
        if not leaked_threads and not leaked_children:
            return
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
    pytest.fail("; ".join(problems))
