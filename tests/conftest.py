"""Suite-wide: a test that leaks a thread or a child process fails (watchdog's conftest idea;
long-lived processes must be stopped by the test that started them); the hostile-probe and
fault-injection summary lines (run_summaries.py); and what may run in parallel (tests/run.sh runs
the suite on pytest-xdist workers)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable

import psutil
import pytest
import run_summaries

# Tests that add or remove real users (useradd/userdel, here or inside the systemd sandbox, whose /etc
# is the machine's): /etc/passwd is one file for the whole machine, and the hostile probes' users are
# fixed names created and removed per module, so these run one after another, on one worker.
USER_DB_TESTS = (
    "tests/hostile/", "tests/systemd/", "tests/faults/test_owner_deleted.py", "tests/integration/test_intake.py",
    "tests/integration/test_isolation.py", "tests/staging/test_staging_groups.py", "tests/processes/test_fsafe_users.py",
    "tests/integration/test_queue_features.py::test_per_user",
)

SLOW_SECONDS = 30.0  # a slow test's expected time when its marker does not say (`slow(seconds=N)`)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Parallel runs (pytest-xdist): every test is its own unit of work, except the USER_DB_TESTS,
    which form one unit that runs on one worker, in order."""
    from xdist.scheduler import LoadScopeScheduling

    class UsersTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "users" if nodeid.startswith(USER_DB_TESTS) else nodeid

    return UsersTogether(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest first: the suite's wall time on two workers is set by the test that starts last, so
    the slow tests go out first (those with `slow(seconds=N)` by N; the DeepSpeed test, minutes
    long, was collected among the last) and the quick ones fill in behind.
    The USER_DB_TESTS keep their order: they run as one unit on one worker whatever their place."""
    items.sort(key=_expected_seconds, reverse=True)  # stable: equal keys keep the collection's order


def _expected_seconds(item: pytest.Item) -> float:
    mark = item.get_closest_marker("slow")
    if mark is None or item.nodeid.startswith(USER_DB_TESTS):
        return 0.0
    return float(mark.kwargs.get("seconds", SLOW_SECONDS))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    run_summaries.record(report)


def pytest_terminal_summary(terminalreporter) -> None:
    run_summaries.write(terminalreporter)


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

