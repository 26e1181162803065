"""The two lines a test run ends with, computed from the test reports:

    N hostile probes, N held                                      (every test under tests/hostile/)
    N scenarios, N survived, 0 jobs lost, 0 jobs run twice        (fault injection, tests/faults/)

They are fed from `pytest_runtest_logreport` in tests/conftest.py. That hook also runs in the
controller of a parallel run (pytest-xdist forwards every worker's reports to it, user properties
included), so the lines count every worker's tests: a probe's outcome is read from its reports, and a
fault scenario's record travels as the user property `fault_scenario` of its teardown report.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

HOSTILE_PREFIX = "tests/hostile/"
SCENARIO_PROPERTY = "fault_scenario"


@dataclass
class Scenario:
    """What one fault-injection test saw (its `scenario` fixture fills it in)."""

    name: str
    survived: bool = False
    lost: list[str] = field(default_factory=list)
    twice: list[str] = field(default_factory=list)

    def record(self, audit) -> None:
        """Add an audit's lost and run-twice jobs to this scenario."""
        self.lost += audit.lost
        self.twice += audit.twice


_probes: dict[str, str] = {}
_scenarios: list[Scenario] = []


def record(report: pytest.TestReport) -> None:
    if report.nodeid.startswith(HOSTILE_PREFIX):
        outcome = _probes.setdefault(report.nodeid, "not run")
        if report.failed:
            _probes[report.nodeid] = "failed"
        elif report.skipped and outcome != "failed":
            _probes[report.nodeid] = "skipped"
        elif report.when == "call" and report.passed and outcome == "not run":
            _probes[report.nodeid] = "held"
    for name, value in report.user_properties:
        if name == SCENARIO_PROPERTY:
            _scenarios.append(Scenario(**value))


def write(terminalreporter) -> None:
    if terminalreporter.config.option.collectonly:
        return
    if _probes:
        held = sum(1 for o in _probes.values() if o == "held")
        terminalreporter.write_sep("=", f"{len(_probes)} hostile probes, {held} held", bold=True,
                                   green=held == len(_probes), red=held != len(_probes))
        for nodeid, outcome in sorted(_probes.items()):
            if outcome != "held":
                terminalreporter.write_line(f"  {outcome}: {nodeid}")
    if _scenarios:
        survived = sum(s.survived for s in _scenarios)
        lost = sum(len(s.lost) for s in _scenarios)
        twice = sum(len(s.twice) for s in _scenarios)
        terminalreporter.section("fault injection")
        for s in _scenarios:
            if not s.survived or s.lost or s.twice:
                terminalreporter.write_line(f"{s.name}: survived={s.survived} lost={s.lost} run twice={s.twice}")
        terminalreporter.write_line(f"{len(_scenarios)} scenarios, {survived} survived, {lost} jobs lost, "
                                    f"{twice} jobs run twice")
