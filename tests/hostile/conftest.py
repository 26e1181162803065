"""tests/hostile: every test here is a hostile probe (design §9). Each gets the `hostile` marker
(`pytest -m hostile` runs them alone), and the run ends with one line, "N hostile probes, N held",
where held = passed; skipped and failed probes are named after it."""

from __future__ import annotations

from pathlib import Path

import pytest
from hostile.probe import remove_world, world
from hostile.users import hostile_users

HERE = Path(__file__).resolve().parent
_outcomes: dict[str, str] = {}


@pytest.fixture(scope="module")
def users():
    """The module's real test users (owner, victim, group), created for it and removed after."""
    with hostile_users() as u:
        yield u


@pytest.fixture
def base():
    """A fresh directory every test user can reach, holding the daemon's root and the bait."""
    b = world()
    yield b
    remove_world(b)


def _is_probe(path: Path) -> bool:
    return HERE in path.resolve().parents


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _is_probe(Path(item.path)):
            item.add_marker(pytest.mark.hostile)


def pytest_collection_finish(session: pytest.Session) -> None:
    """The probes this run will run (after -k/-m deselection)."""
    for item in session.items:
        if _is_probe(Path(item.path)):
            _outcomes.setdefault(item.nodeid, "not run")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.nodeid not in _outcomes:
        return
    if report.failed:
        _outcomes[report.nodeid] = "failed"
    elif report.skipped and _outcomes[report.nodeid] != "failed":
        _outcomes[report.nodeid] = "skipped"
    elif report.when == "call" and report.passed and _outcomes[report.nodeid] == "not run":
        _outcomes[report.nodeid] = "held"


def pytest_terminal_summary(terminalreporter) -> None:
    if not _outcomes or terminalreporter.config.option.collectonly:
        return
    held = sum(1 for o in _outcomes.values() if o == "held")
    terminalreporter.write_sep("=", f"{len(_outcomes)} hostile probes, {held} held", bold=True,
                               green=held == len(_outcomes), red=held != len(_outcomes))
    for nodeid, outcome in sorted(_outcomes.items()):
        if outcome != "held":
            terminalreporter.write_line(f"  {outcome}: {nodeid}")
