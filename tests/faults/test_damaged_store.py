"""A state store truncated, overwritten with garbage, or held by another process: the daemon refuses to
start with one line (what, where, how to restore) and runs nothing; the restore it names works, and
after it no job runs again that had already run."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from ledger import CountedJob, audit

from harness import BIN, Daemon, sqlite3_holding, wait_for

CONFIG = {"backup_every_seconds": 0.5, "backup_keep": 3}


def start(root: Path, daemons: list[Daemon]) -> Daemon:
    d = Daemon(root, config=CONFIG, log_level="debug")  # debug: its loop's turns (wait_turns)
    daemons.append(d)
    return d.start()


def refuse(root: Path) -> tuple[int, dict]:
    """Start a daemon that must refuse: its exit status and its one output line."""
    res = subprocess.run([str(BIN / "spx-trainer"), "--root", str(root), "--gpu-backend", "none",
                          "--metrics-address", "127.0.0.1:0"], capture_output=True, text=True, timeout=60)
    lines = res.stdout.splitlines() + res.stderr.splitlines()
    assert len(lines) == 1, f"one line, not: {lines}"
    line = json.loads(lines[0])
    assert line["event"] == "state_store_refused" and line["level"] == "error", line
    return res.returncode, line


def run_jobs_then_stop(root: Path, tmp_path: Path, daemons: list[Daemon], kill: bool) -> list[CountedJob]:
    """One job that succeeds and one still running, then a backup after both are recorded."""
    done = CountedJob("finished", tmp_path / "finished.ledger", seconds=0.2)
    running = CountedJob("running", tmp_path / "running.ledger", seconds=600, expect="cancelled")
    d = start(root, daemons)
    d.drop("finished.yaml", done.yaml())
    d.drop("running.yaml", running.yaml())
    d.wait_state("finished", "succeeded", 60)
    d.wait_state("running", "running", 60)
    backed_up = len(d.events("state_backed_up"))
    wait_for(lambda: len(d.events("state_backed_up")) > backed_up, 30, "a backup after the jobs were recorded")
    if kill:
        d.kill9()
    else:
        d.stop()
    return [done, running]


def restore_as_told(line: dict) -> None:
    """Run the restore command the refusal line names (the operator's copy-paste)."""
    hint = line["error"].split("restore the newest backup: ", 1)[1].split(";", 1)[0]
    subprocess.run(hint, shell=True, check=True)


def recover_and_audit(root: Path, jobs: list[CountedJob], daemons: list[Daemon], scenario) -> None:
    d = start(root, daemons)
    d.wait_state("running", "running", 60)
    d.spx("cancel", "running")
    d.wait_state("running", "cancelled", 60)
    # Whole turns of the loop on the restored store (its scheduler's too): had it taken the succeeded
    # "finished" for one to run, the audit finds it started again, or no longer succeeded.
    d.wait_turns()
    d.stop()
    result = audit(root / "state" / "spx.sqlite", jobs)
    scenario.record(result)
    assert result.clean, result
    assert len([r for r in jobs[0].runs() if r["event"] == "start"]) == 1


@pytest.mark.parametrize("damage", ["truncated-to-zero", "truncated-mid-file", "garbage"])
def test_a_damaged_store_is_refused_with_one_line_and_the_named_backup_restores_it(
        damage, root, tmp_path, daemons, scenario):
    jobs = run_jobs_then_stop(root, tmp_path, daemons, kill=damage != "truncated-to-zero")
    store = root / "state" / "spx.sqlite"
    if damage == "truncated-to-zero":
        os.truncate(store, 0)
    elif damage == "truncated-mid-file":
        subprocess.run(["sqlite3", str(store), "PRAGMA wal_checkpoint(TRUNCATE);"], check=True, capture_output=True)
        os.truncate(store, store.stat().st_size // 2)
    else:
        store.write_bytes(os.urandom(store.stat().st_size))
    ledgers = {j.name: j.ledger.read_bytes() for j in jobs}
    code, line = refuse(root)
    assert code == 2
    what = "is empty (0 bytes)" if damage == "truncated-to-zero" else "is damaged ("
    assert f"state store {store} {what}" in line["error"]
    assert f"restore the newest backup: rm -f {store}-wal {store}-shm && cp {root / 'state' / 'backup'}/spx-" in line["error"]
    assert {j.name: j.ledger.read_bytes() for j in jobs} == ledgers, "nothing ran"
    scenario.survived = True
    restore_as_told(line)
    recover_and_audit(root, jobs, daemons, scenario)


def test_a_store_locked_by_the_sqlite3_shell_is_refused_and_starts_once_released(root, tmp_path, daemons, scenario):
    jobs = run_jobs_then_stop(root, tmp_path, daemons, kill=True)
    store = root / "state" / "spx.sqlite"
    with sqlite3_holding(store) as shell:
        code, line = refuse(root)
        assert code == 3
        assert f"state store {store} is locked by sqlite3 (pid {shell.pid})" in line["error"]
        scenario.survived = True
    recover_and_audit(root, jobs, daemons, scenario)


def test_a_second_daemon_on_the_same_root_refuses_and_the_first_keeps_serving(root, tmp_path, daemons, scenario):
    first = start(root, daemons)
    job = CountedJob("running", tmp_path / "running.ledger", seconds=600, expect="cancelled")
    first.drop("running.yaml", job.yaml())
    first.wait_state("running", "running", 60)
    code, line = refuse(root)
    assert code == 3
    assert f"another spx-trainer (pid {first.proc.pid}) is running on {root / 'state'}" in line["error"]
    assert first.alive() and first.job("running")["state"] == "running"
    scenario.survived = True
    first.spx("cancel", "running")
    first.wait_state("running", "cancelled", 60)
    first.stop()
    result = audit(root / "state" / "spx.sqlite", [job])
    scenario.record(result)
    assert result.clean, result
