"""The copier runs as the job's owner *with the owner's supplementary groups*: a volume the user
reads as a group member stages; one they cannot read fails naming the file. The daemon's own
interpreter may be unreadable to the user (a pyenv under /root): the copier starts as root and drops
to the user before it touches a path."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from hostile.users import hostile_users

from spx.daemon.staging.runner import start_staging

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: runs the copier as a created user")


@pytest.fixture(scope="module")
def users():
    with hostile_users() as u:
        yield u


def _run(run, timeout=60):
    deadline = time.monotonic() + timeout
    while not run.poll():
        assert time.monotonic() < deadline, "copier did not finish"
        time.sleep(0.05)
    run.poll()
    if run.proc.stdout is not None:
        run.proc.stdout.close()
    return run


def test_a_group_readable_source_stages_as_a_supplementary_member(users):
    owner, _victim, group = users
    base = Path(tempfile.mkdtemp(prefix="spx-stage-grp-", dir="/var/tmp"))
    try:
        base.chmod(0o755)
        src = base / "volume"
        src.mkdir()
        (src / "shard.bin").write_bytes(b"s" * 4096)
        (src / "private.bin").write_bytes(b"p")
        for p in (src, src / "shard.bin"):
            os.chown(p, 0, group.gr_gid)
        src.chmod(0o750)
        (src / "shard.bin").chmod(0o640)
        (src / "private.bin").chmod(0o600)
        dst = base / "nvme"
        dst.mkdir()
        os.chown(dst, owner.pw_uid, owner.pw_gid)
        logs = base / "log" / "job"
        logs.mkdir(parents=True)
        run = _run(start_staging(1, src, dst, owner.pw_uid, logs / "staging.log"))
        assert not run.succeeded and "private.bin" in run.text(), run.text()
        (src / "private.bin").unlink()
        run = _run(start_staging(1, src, dst, owner.pw_uid, logs / "staging.log"))
        assert run.succeeded, run.text()
        st = os.stat(dst / "shard.bin")
        assert st.st_uid == owner.pw_uid and (dst / "shard.bin").read_bytes() == b"s" * 4096
        lst = os.lstat(logs / "staging.log")
        assert lst.st_uid == owner.pw_uid and lst.st_mode & 0o777 == 0o600, "the owner's alone (no log_group)"
        assert "staged" in (logs / "staging.log").read_text()
    finally:
        shutil.rmtree(base, ignore_errors=True)
