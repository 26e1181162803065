"""Fault injection against the real daemon. Every scenario records what it saw through `scenario`;
the session ends with one line computed from those records:

    N scenarios, N survived, 0 jobs lost, 0 jobs run twice

"survived" means the daemon came through the fault as it must: still serving, or (for a damaged
state store) refusing to start with its one clear line and running nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import pytest
from run_summaries import SCENARIO_PROPERTY, Scenario

from harness import Daemon


@pytest.fixture
def scenario(request) -> Iterator[Scenario]:
    """The record of this test's scenario; the test sets `survived` once the daemon came through.
    It leaves with the test's teardown report, for the summary line (tests/run_summaries.py)."""
    s = Scenario(request.node.name)
    yield s
    request.node.user_properties.append((SCENARIO_PROPERTY, asdict(s)))


@pytest.fixture
def daemons(tmp_path) -> Iterator[list[Daemon]]:
    """Daemons a scenario starts; whatever still runs at the end is stopped (its jobs with it)."""
    started: list[Daemon] = []
    yield started
    for d in started:
        if d.alive():
            d.stop(timeout=60)


@pytest.fixture
def root(tmp_path) -> Path:
    return tmp_path / "root"
