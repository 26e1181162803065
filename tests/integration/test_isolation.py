"""Multi-user basics (docs/security.md): workers run as the file's owner with a clean
environment, and a user sees and cancels only their own jobs."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from harness import Daemon, as_user, wait_for
from spx.daemon.service import control

USER = "spx-test-alice"
SCRIPTS = Path(__file__).resolve().parent.parent / "fixtures" / "scripts"

pytestmark = pytest.mark.skipif(os.getuid() != 0, reason="needs root: creates a user and runs jobs as them")


@pytest.fixture(scope="module")
def alice():
    created = False
    try:
        pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "-m", "-s", "/bin/sh", USER], check=True)
        created = True
    yield pwd.getpwnam(USER)
    if created:
        subprocess.run(["userdel", "-r", USER], check=False, capture_output=True)


@pytest.fixture
def world_root():
    """A daemon root outside /tmp/pytest-of-root (0700), so the test user can reach the socket."""
    base = Path(tempfile.mkdtemp(prefix="spx-iso-", dir="/var/tmp"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def drop_as(d: Daemon, user: pwd.struct_passwd, name: str, text: str) -> None:
    tmp = d.spool / f".{name}.tmp"
    tmp.write_text(text)
    os.chown(tmp, user.pw_uid, user.pw_gid)
    os.rename(tmp, d.spool / name)


def test_worker_runs_as_owner_with_clean_env_and_sees_only_own_jobs(alice, world_root):
    d = Daemon(world_root / "root", env={"SPX_DAEMON_SECRET_TEST": "hunter2", "AWS_SECRET_ACCESS_KEY": "x"}).start()
    try:
        script = Path(alice.pw_dir) / "whoami_env.py"
        shutil.copy(SCRIPTS / "whoami_env.py", script)
        out = Path(alice.pw_dir) / "whoami.json"
        drop_as(d, alice, "alice.yaml", f"name: alice-job\nlauncher: python\nscript: {script}\n"
                                        f"python: /usr/bin/python3\nargs: ['{out}']\n")
        d.wait_state("alice-job", {"succeeded", "failed"}, 60)
        assert d.job("alice-job")["state"] == "succeeded", d.status("alice-job")
        seen = json.loads(out.read_text())
        assert (seen["uid"], seen["gid"]) == (alice.pw_uid, alice.pw_gid)
        env = seen["env"]
        assert "SPX_DAEMON_SECRET_TEST" not in env and "AWS_SECRET_ACCESS_KEY" not in env
        assert env["HOME"] == alice.pw_dir and env["USER"] == USER
        assert env["SPX_JOB"] == "alice-job" and env["PATH"].endswith("/usr/bin:/sbin:/bin")
        ckpt = d.checkpoint_dir("alice-job", USER)
        assert ckpt.stat().st_uid == alice.pw_uid, "the job's checkpoint dir belongs to its owner"

        d.drop("roots.yaml", f"name: roots-job\nlauncher: python\nscript: {SCRIPTS / 'sleep_for.py'}\nargs: ['60']\n")
        d.wait_state("roots-job", "running", 30)
        sock = d.root / "run" / "spx.sock"
        listed = as_user(alice, lambda: [j["name"] for j in control.request(sock, "ls")["result"]])
        assert listed == ["alice-job"], "a user sees only their own jobs"
        refused = as_user(alice, lambda: control.request(sock, "cancel", "roots-job"))
        assert refused["ok"] is False and d.job("roots-job")["state"] == "running"
        assert {j["name"] for j in d.ls()} == {"alice-job", "roots-job"}, "root sees all"
        d.spx("cancel", "roots-job")
        d.wait_state("roots-job", "cancelled", 30)
    finally:
        d.stop()


def test_reused_name_cannot_pick_up_another_users_checkpoints(alice, world_root):
    d = Daemon(world_root / "root").start()
    try:
        roots = d.root / "checkpoints" / "shared-name"  # root's job of that name left these
        roots.mkdir(parents=True)
        (roots / "ckpt.pt").write_bytes(b"root's")
        script = Path(alice.pw_dir) / "whoami_env.py"
        shutil.copy(SCRIPTS / "whoami_env.py", script)
        out = Path(alice.pw_dir) / "shared.json"
        drop_as(d, alice, "a.yaml", f"name: shared-name\nlauncher: python\nscript: {script}\n"
                                    f"python: /usr/bin/python3\nargs: ['{out}']\n")
        d.wait_state("shared-name", {"succeeded", "failed"}, 60)
        env = json.loads(out.read_text())["env"]
        assert env["SPX_CHECKPOINT_DIR"] == str(d.checkpoint_dir("shared-name", USER)), "her own dir, per owner"
        assert env["SPX_RESUME_FROM"] == "" and sorted(os.listdir(roots)) == ["ckpt.pt"]
        # Naming root's dir itself is refused: it exists and is not hers.
        drop_as(d, alice, "b.yaml", f"name: named\nlauncher: python\nscript: {script}\n"
                                    f"checkpoints: {{dir: {roots}}}\n")
        err = d.spool / "rejected" / "b.yaml.error"
        wait_for(err.exists, 10, "rejection")
        assert "belongs to uid 0" in err.read_text()
        assert err.stat().st_uid == alice.pw_uid, "the submitter can read why"
    finally:
        d.stop()
