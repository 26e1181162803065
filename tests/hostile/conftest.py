"""tests/hostile: every test here is a hostile probe (docs/security.md, "Threats tested"). Each gets the
`hostile` marker (`pytest -m hostile` runs them alone), and the run ends with one line, "N hostile
probes, N held", where held = passed; skipped and failed probes are named after it
(tests/run_summaries.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hostile.probe import remove_world, world
from hostile.users import hostile_users

HERE = Path(__file__).resolve().parent


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
