"""A standby worker's watch of the environment until the script's first import of a module it imported
ahead (run/standby_worker.py): a variable the script set before that import sends it to a cold start,
one read only after the go (CUDA's device list, NCCL's settings) does not."""

from __future__ import annotations

import builtins
import os

import pytest

from spx.daemon.run import standby_worker

PLAN = {"RANK": "0", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin"}


def test_a_variable_set_changed_or_removed_is_named_and_one_read_after_the_go_is_not():
    now = {**PLAN, "OMP_NUM_THREADS": "4", "TORCHINDUCTOR_CACHE_DIR": "/x", "CUDA_VISIBLE_DEVICES": "1",
           "NCCL_DEBUG": "INFO"}
    del now["PATH"]
    assert standby_worker.env_changed(PLAN, now) == ["OMP_NUM_THREADS", "PATH", "TORCHINDUCTOR_CACHE_DIR"]
    assert standby_worker.env_changed(PLAN, dict(PLAN)) == []


class Execed(Exception):
    pass


@pytest.fixture
def watch(monkeypatch):
    """Starts the watch on `json` (a module this test imported ahead), the plan's environment the
    process's own at that moment (in the test's body: pytest sets a variable of its own between
    phases); an exec is recorded instead of made."""
    execs: list[tuple[str, list[str], dict[str, str]]] = []

    def execve(path, argv, env):
        execs.append((path, argv, env))
        raise Execed

    monkeypatch.setattr(os, "execve", execve)
    monkeypatch.setattr(builtins, "__import__", builtins.__import__)  # put back whatever happens

    def start() -> tuple[dict[str, str], list]:
        plan = dict(os.environ)
        standby_worker.watch_first_import({"json"}, plan, ["/usr/bin/python3", "-u", "train.py"])
        return plan, execs

    return start


def test_the_first_import_after_a_change_starts_the_command_cold_with_the_plans_environment(watch, monkeypatch):
    plan, execs = watch()
    import csv  # noqa: F401 — not imported ahead: no look yet

    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    with pytest.raises(Execed):
        import json  # noqa: F401
    assert execs == [("/usr/bin/python3", ["/usr/bin/python3", "-u", "train.py"], plan)]


def test_no_change_keeps_the_imported_modules_and_the_watch_ends_at_that_import(watch, monkeypatch):
    _, execs = watch()
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    import json.decoder  # noqa: F401

    monkeypatch.setenv("OMP_NUM_THREADS", "7")  # after the first import: torch has it already either way
    import json  # noqa: F401, F811

    assert execs == [] and builtins.__import__.__name__ == "__import__"
