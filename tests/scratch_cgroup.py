"""A throw-away cgroup v2 directory for tests, under this process's own cgroup, removed afterwards.

The cgroup tests use the machine's real cgroup2 (on this host: the unified hierarchy of a v1/v2
hybrid, at /sys/fs/cgroup/unified). Where none is writable they skip, saying why.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from spx.daemon.run import cgroups


def own_cgroup() -> Path | None:
    return cgroups.own_cgroup(Path("/proc/self/mountinfo").read_text(), Path("/proc/self/cgroup").read_text())


def cannot_use_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root to create cgroups"
    own = own_cgroup()
    if own is None:
        return "no cgroup v2 hierarchy is mounted here"
    if not os.access(own, os.W_OK):
        return f"this process's cgroup {own} is not writable (read-only cgroupfs?)"
    return None


@contextmanager
def scratch_cgroup(prefix: str = "spx-test") -> Iterator[Path]:
    """A uniquely named cgroup below our own; on exit, whatever runs in it is killed and the whole
    subtree removed, deepest first."""
    why = cannot_use_reason()
    if why:
        pytest.skip(f"no writable cgroup v2: {why}")
    own = own_cgroup()
    assert own is not None
    top = own / f"{prefix}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    top.mkdir()
    try:
        yield top
    finally:
        remove_tree(top)


def remove_tree(top: Path, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while top.exists():
        for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda w: -len(Path(w[0]).parts)):
            cg = Path(dirpath)
            for pid in cgroups.procs(cg):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            cgroups.remove(cg)
        if time.monotonic() > deadline:
            raise AssertionError(f"could not remove the test cgroup {top}")
        time.sleep(0.05)


def cgroup_of(pid: int) -> Path | None:
    """The cgroup v2 directory a process is in, as this process sees the hierarchy."""
    try:
        proc_cgroup = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return None
    return cgroups.own_cgroup(Path("/proc/self/mountinfo").read_text(), proc_cgroup)
