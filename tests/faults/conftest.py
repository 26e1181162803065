"""Fault injection against the real daemon. Every scenario records what it saw through `scenario`;
the session ends with one line computed from those records:

    N scenarios, N survived, 0 jobs lost, 0 jobs run twice

"survived" means the daemon came through the fault as it must: still serving, or (for a damaged
state store) refusing to start with its one clear line and running nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness import Daemon


@dataclass
class Scenario:
    name: str
    survived: bool = False
    lost: list[str] = field(default_factory=list)
    twice: list[str] = field(default_factory=list)

    def record(self, audit) -> None:
        """Add an audit's lost and run-twice jobs to this scenario."""
        self.lost += audit.lost
        self.twice += audit.twice


_SCENARIOS: list[Scenario] = []


@pytest.fixture
def scenario(request) -> Scenario:
    """The record of this test's scenario; the test sets `survived` once the daemon came through."""
    s = Scenario(request.node.name)
    _SCENARIOS.append(s)
    return s


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


def pytest_terminal_summary(terminalreporter) -> None:
    if not _SCENARIOS:
        return
    survived = sum(s.survived for s in _SCENARIOS)
    lost = sum(len(s.lost) for s in _SCENARIOS)
    twice = sum(len(s.twice) for s in _SCENARIOS)
    terminalreporter.section("fault injection")
    for s in _SCENARIOS:
        if not s.survived or s.lost or s.twice:
            terminalreporter.write_line(f"{s.name}: survived={s.survived} lost={s.lost} run twice={s.twice}")
    terminalreporter.write_line(f"{len(_SCENARIOS)} scenarios, {survived} survived, {lost} jobs lost, "
                                f"{twice} jobs run twice")
