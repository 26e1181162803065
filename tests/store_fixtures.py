"""What the state-store tests build, with and without processes (tests/unit/test_integrity.py,
tests/processes/test_integrity_live.py): a job spec, a store on disk with N jobs, and the one-line
refusal `integrity.check_store` gives for it. Plain helpers: no process, no mount, no user.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from spx.daemon.core.spec import JobSpec
from spx.daemon.state import integrity
from spx.daemon.state.store import Store


def spec(name: str = "a", **extra: object) -> JobSpec:
    return JobSpec.model_validate({"name": name, "launcher": "python", "script": "t.py", **extra})


def state_dir(tmp_path: Path) -> Path:
    """An empty state dir (what `--root` makes of DIR/state)."""
    d = tmp_path / "state"
    d.mkdir()
    return d


def make_store(state: Path, jobs: int = 3) -> Path:
    """`state/spx.sqlite` holding jobs j0 … j{jobs-1}, closed."""
    store = Store(state / "spx.sqlite")
    for i in range(jobs):
        store.jobs.add(spec(f"j{i}"), 0, "root", f"/x/j{i}.yaml", 1.0)
    store.close()
    return state / "spx.sqlite"


def refusal(state: Path) -> integrity.StoreRefused:
    """The StoreRefused that checking `state`'s store raises (the test fails if it passes), one line."""
    with pytest.raises(integrity.StoreRefused) as err:
        integrity.check_store(state / "spx.sqlite", state / "backup")
    assert "\n" not in str(err.value), "one line"
    return err.value
