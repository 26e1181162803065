"""A job's owner is deleted (userdel) while the job runs: the daemon survives, the job's next launch
fails it with the reason, and another user's job is not disturbed. (tests/hostile probes what a
deleted owner's leftovers can do; this is the daemon's side.)"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from ledger import SCRIPT, CountedJob, audit, state_of

from harness import Daemon, wait_for

USER = "spxfaultowner"


@pytest.fixture
def owner() -> Iterator[pwd.struct_passwd]:
    if os.geteuid() != 0:
        pytest.skip("needs root: creates and deletes a user")
    subprocess.run(["userdel", "-r", USER], check=False, capture_output=True)
    subprocess.run(["useradd", "-m", "-s", "/bin/sh", USER], check=True)
    yield pwd.getpwnam(USER)
    subprocess.run(["userdel", "-r", USER], check=False, capture_output=True)


@pytest.fixture
def world() -> Iterator[Path]:
    """A directory the owner's job can reach, with the daemon's root (pytest's own tmp dirs are root's, 0700)."""
    base = Path(tempfile.mkdtemp(prefix="spx-fault-", dir="/var/tmp"))
    base.chmod(0o777)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def test_an_owner_deleted_mid_job_fails_the_job_with_the_reason_and_nothing_else(
        owner, world, tmp_path, daemons, scenario):
    script = world / "counted.py"
    shutil.copy(SCRIPT, script)
    # The owner's job crashes once; by then the owner is gone, so the relaunch cannot run as them.
    theirs = CountedJob("theirs", world / "theirs.ledger", seconds=2, exit_code=1, expect="failed",
                        backoff=(0.5, 0.5), script=script, python="/usr/bin/python3")
    mine = CountedJob("mine", tmp_path / "mine.ledger", seconds=4)
    d = Daemon(world / "root")  # the owner must reach its checkpoints dir under it
    daemons.append(d)
    d.start()
    spool_file = d.spool / ".theirs.yaml.tmp"  # dropped by the owner: the file is theirs
    spool_file.write_text(theirs.yaml())
    os.chown(spool_file, owner.pw_uid, owner.pw_gid)
    os.rename(spool_file, d.spool / "theirs.yaml")
    d.drop("mine.yaml", mine.yaml())
    wait_for(lambda: state_of(d.root, "theirs") == "running", 30, "the owner's job to run")
    subprocess.run(["userdel", "--force", USER], check=True, capture_output=True)  # it has processes: force
    wait_for(lambda: state_of(d.root, "theirs") in ("failed", "succeeded", "cancelled"), 60, "the owner's job to end")
    wait_for(lambda: state_of(d.root, "mine") == "succeeded", 60, "the other job to succeed")
    assert d.alive(), d.lines[-10:]
    scenario.survived = True
    status = d.status("theirs")
    assert status["state"] == "failed"
    assert "no account" in (status["reason"] or ""), status
    d.stop()
    result = audit(d.root / "state" / "spx.sqlite", [theirs, mine])
    scenario.record(result)
    assert result.clean, result
    assert len([r for r in theirs.runs() if r["event"] == "start"]) == 1
