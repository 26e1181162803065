"""Hostile probes against what root reads and decides while a job lives: the workdir, the
heartbeat, the log dir's marker, an owner who disappears. Real users, FIFOs and links, the daemon as
root (see probe.py for what every probe asserts)."""

from __future__ import annotations

import json
import os
import pwd
import stat
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from hostile.probe import (
    Bait,
    answering,
    drop_as,
    ended_with_reason,
    job_yaml,
    start_daemon,
    user_script,
    wait_file,
)

from harness import wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: runs the daemon as root and creates users")


def _private_project(victim: pwd.struct_passwd, home_mode: int) -> Path:
    home = Path(victim.pw_dir)
    home.chmod(home_mode)
    proj = home / "proj"
    proj.mkdir(exist_ok=True)
    (proj / "secret.txt").write_text("victim's secret\n")
    for p in (proj, proj / "secret.txt"):
        os.chown(p, victim.pw_uid, victim.pw_gid)
    return proj


def test_workdir_in_another_users_private_home_is_refused_at_intake(users, base):
    owner, victim, _group = users
    proj = _private_project(victim, 0o700)
    script = user_script(owner, "steal.py", "print(open('secret.txt').read())\n")
    d = start_daemon(base)
    try:
        drop_as(d, owner, "steal.yaml", job_yaml("steal", script, extra=f"workdir: {proj}\n"))
        err = d.spool / "rejected" / "steal.yaml.error"
        wait_file(err)
        assert "workdir" in err.read_text() and "spx-hostile-a" in err.read_text()
        assert d.job("steal") is None
        answering(d)
    finally:
        d.stop()
        Path(victim.pw_dir).chmod(0o700)


def test_workdir_closed_before_a_relaunch_fails_the_launch_unread(users, base):
    owner, victim, _group = users
    proj = _private_project(victim, 0o755)
    atime = os.stat(proj / "secret.txt").st_atime_ns
    flag = Path(owner.pw_dir) / "go"
    flag.unlink(missing_ok=True)
    leak = Path(owner.pw_dir) / "leak.txt"
    leak.unlink(missing_ok=True)
    script = user_script(owner, "steal2.py", f"""
        import os, sys, time
        if os.environ["SPX_ATTEMPT"] == "1":
            while not os.path.exists("{flag}"):
                time.sleep(0.1)
            sys.exit(1)
        open("{leak}", "w").write(open("secret.txt").read())
    """)
    d = start_daemon(base)
    try:
        drop_as(d, owner, "steal2.yaml", job_yaml("steal2", script, extra=f"workdir: {proj}\n"))
        d.wait_state("steal2", "running", 30)
        Path(victim.pw_dir).chmod(0o700)  # the victim closes their home while attempt 1 runs
        flag.touch()
        job = wait_for(lambda: (j := d.job("steal2")) and "workdir" in (j["reason"] or "") and j, 60,
                       "the relaunch to fail on the workdir")
        assert job["state"] in ("failed", "restarting") and "Permission denied" in job["reason"], job
        assert not leak.exists(), "the workdir was entered with root's rights"
        assert os.stat(proj / "secret.txt").st_atime_ns == atime
        answering(d)
    finally:
        d.stop()
        Path(victim.pw_dir).chmod(0o700)


def _metrics(d) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{d.metrics_port}/metrics", timeout=10) as r:
        return r.read().decode()


def test_fifo_at_the_heartbeat_path_never_wedges_the_loop(users, base):
    owner, _victim, _group = users
    script = user_script(owner, "fifo.py", """
        import os, time
        hb = os.environ["SPX_HEARTBEAT_FILE"]
        if os.path.lexists(hb):
            os.unlink(hb)
        os.mkfifo(hb)
        time.sleep(120)
    """)
    d = start_daemon(base)
    try:
        drop_as(d, owner, "fifo.yaml", job_yaml("fifo", script))
        d.wait_state("fifo", "running", 30)
        hb = next((d.root / "run" / "jobs").glob("*-fifo")) / "heartbeat.json"
        wait_for(lambda: hb.exists() and stat.S_ISFIFO(os.lstat(hb).st_mode), 30, "the FIFO")
        for _ in range(3):
            t0 = time.monotonic()
            assert d.job("fifo")["step"] is None
            assert d.status("fifo")["state"] == "running"
            assert "spx_job_state" in _metrics(d)
            assert time.monotonic() - t0 < 5, "a reader waited on the FIFO"
        d.spx("cancel", "fifo")
        ended_with_reason(d, "fifo", {"cancelled"}, 30)
        answering(d)
    finally:
        d.stop()


def test_heartbeat_symlinked_to_a_root_only_file_never_shows(users, base):
    owner, _victim, _group = users
    bait = Bait.plant(base)
    script = user_script(owner, "hblink.py", f"""
        import os, time
        hb = os.environ["SPX_HEARTBEAT_FILE"]
        if os.path.lexists(hb):
            os.unlink(hb)
        os.symlink("{bait.path}", hb)
        time.sleep(120)
    """)
    d = start_daemon(base, log_level="debug")  # debug: wait_turns
    try:
        drop_as(d, owner, "hblink.yaml", job_yaml("hblink", script))
        d.wait_state("hblink", "running", 30)
        hb = next((d.root / "run" / "jobs").glob("*-hblink")) / "heartbeat.json"
        wait_for(lambda: hb.is_symlink(), 30, "the link")
        d.wait_turns(3)  # main-loop turns that read it
        shown = json.dumps(d.status("hblink")) + json.dumps(d.ls()) + _metrics(d)
        assert "987654321" not in shown, "a root-only file leaked into status or metrics"
        d.spx("cancel", "hblink")
        ended_with_reason(d, "hblink", {"cancelled"}, 30)
        bait.untouched()
        answering(d)
    finally:
        d.stop()


@pytest.mark.parametrize("marker", ["fifo", "huge", "garbage", "symlink"])
def test_odd_job_id_marker_of_a_reused_name(users, base, marker):
    owner, _victim, _group = users
    bait = Bait.plant(base, b"12\n")
    script = user_script(owner, "ok.py", "print('fine')\n")
    d = start_daemon(base)
    try:
        drop_as(d, owner, "m1.yaml", job_yaml("m", script))
        ended_with_reason(d, "m", {"succeeded"}, 60)
        log_dir = d.root / "log" / "m"
        os.chown(log_dir, owner.pw_uid, owner.pw_gid)  # the old daemon's layout: the user's own dir
        marker_path = log_dir / ".job-id"
        marker_path.unlink()
        make = {
            "fifo": lambda: os.mkfifo(marker_path),
            "huge": lambda: marker_path.write_bytes(b"7" * 10_000_000),
            "garbage": lambda: marker_path.write_bytes(b"\xff\x00../../etc\n"),
            "symlink": lambda: os.symlink(bait.path, marker_path),
        }
        make[marker]()
        if marker != "symlink":
            os.lchown(marker_path, owner.pw_uid, owner.pw_gid)
        drop_as(d, owner, "m2.yaml", job_yaml("m", script))
        wait_for(lambda: (j := d.job("m")) and j["attempts"] == 1 and j["state"] == "succeeded"
                 and len(d.events("job_queued", job="m")) == 2 and j, 60, "the second job m to succeed")
        st = os.lstat(log_dir)
        assert st.st_uid == 0 and (log_dir / ".job-id").read_text().strip().isdigit()
        bait.untouched()
        answering(d)
    finally:
        d.stop()


def test_owner_deleted_while_the_job_waits_to_restart(base):
    name = "spx-hostile-c"
    subprocess.run(["userdel", "-r", name], capture_output=True)
    subprocess.run(["useradd", "-m", "-s", "/bin/sh", name], check=True, capture_output=True)
    try:
        user = pwd.getpwnam(name)
        script = user_script(user, "crash.py", "import sys; sys.exit(3)\n")
        d = start_daemon(base)
        try:
            drop_as(d, user, "gone.yaml", job_yaml("gone", script, backoff="[4, 4]"))
            wait_for(lambda: (j := d.job("gone")) and j["state"] == "restarting" and j, 60, "the first exit")
            subprocess.run(["userdel", "-r", name], check=True, capture_output=True)
            job = ended_with_reason(d, "gone", {"failed"}, 60)
            assert "no account" in job["reason"], job
            answering(d)
        finally:
            d.stop()
    finally:
        subprocess.run(["userdel", "-r", name], capture_output=True)
