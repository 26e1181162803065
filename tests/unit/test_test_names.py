"""Every test module's file name is unique across tests/: the folders have no `__init__.py`, so pytest
imports each module by its bare name, and a second file of the same name fails collection ("import
file mismatch") only when both are collected together — in CI, not in a run of one folder."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_modules_share_a_file_name():
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert not [n for n, count in names.items() if count > 1], sorted(
        str(p.relative_to(TESTS)) for p in TESTS.rglob("test_*.py") if names[p.name] > 1)
