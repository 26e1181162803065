"""What an installed host gets from the package itself: the daemon's runtime needs are dependencies
(not extras), and the type information it declares is there."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[2]

PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() for r in requirements}


def test_py_spy_is_a_dependency_of_the_daemon_not_of_the_tests():
    """A hang's stack dump (run/postmortem.py) needs py-spy on every installed host."""
    assert "py-spy" in _names(PROJECT["project"]["dependencies"])
    assert "py-spy" not in _names(PROJECT["project"]["optional-dependencies"]["test"])


def test_py_typed_is_declared_and_present():
    assert "py.typed" in PROJECT["tool"]["setuptools"]["package-data"]["spx.daemon"]
    assert (REPO / "daemon" / "py.typed").is_file()
