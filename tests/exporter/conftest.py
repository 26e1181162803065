"""Fixtures for the exporter tests: a fake backend and a real "worker" process.

The only stand-in is the fake NVML; processes, HTTP, promtool and Prometheus are real.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from spx.daemon.gpu.backend import GpuBackend, fake_backend
from spx.daemon.gpu.fake import FakeNvml


@pytest.fixture
def worker() -> Iterator[subprocess.Popen]:
    """A live process that looks like a job's rank-0 worker on fake GPUs 0,1 (SPX_JOB set)."""
    env = {**os.environ, "SPX_JOB": "train-a", "CUDA_VISIBLE_DEVICES": "0,1"}
    env.pop("LOCAL_RANK", None)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], env=env)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def make_backend() -> Iterator[Callable[..., GpuBackend]]:
    """make_backend(clock=..., only_pids=[...], fixture=dict|path) -> an open fake backend (closed after)."""
    opened: list[GpuBackend] = []

    def make(clock: Callable[[], float] | None = None, only_pids: list[int] | None = None,
             fixture: dict | Path | None = None) -> GpuBackend:
        allowed = set(only_pids or [])
        kwargs: dict = {"process_filter": lambda pid, env: pid in allowed}
        if clock is not None:
            kwargs["clock"] = clock
        if isinstance(fixture, dict):
            fake = FakeNvml(fixture, source="test-fixture", **kwargs)
        else:
            fake = FakeNvml.from_fixture(**({"path": fixture} if fixture else {}), **kwargs)
        backend = fake_backend(fake)
        opened.append(backend)
        return backend

    yield make
    for backend in opened:
        backend.close()
