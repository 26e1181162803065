"""Hostile probes against the paths root writes for a job: the attempt log, spool/rejected, the
checkpoint dir. Real users, real links and renames, the daemon as root (see probe.py for what
every probe asserts)."""

from __future__ import annotations

import os
import stat
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
from hostile.users import run_as

from harness import wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: runs the daemon as root and creates users")


def test_symlink_planted_at_the_next_attempt_log_is_not_followed(users, base):
    owner, _victim, _group = users
    bait = Bait.plant(base)
    d = start_daemon(base)
    try:
        log_dir = d.root / "log" / "plant"
        script = user_script(owner, "plant.py", f"""
            import os, sys, time
            if os.environ["SPX_ATTEMPT"] != "1":
                sys.exit(0)
            target = "{log_dir}/attempt-2.log"
            try:
                os.symlink("{bait.path}", target)
                first = "planted"
            except OSError as e:
                first = e.strerror
            open(os.path.expanduser("~/plant-first.txt"), "w").write(first)
            # The old layout (log/NAME owned by the user): wait until the test hands it over.
            for _ in range(300):
                if os.access("{log_dir}", os.W_OK):
                    break
                time.sleep(0.1)
            os.symlink("{bait.path}", target)
            sys.exit(1)
        """)
        (Path(owner.pw_dir) / "plant-first.txt").unlink(missing_ok=True)  # the user's home outlives a run
        drop_as(d, owner, "plant.yaml", job_yaml("plant", script))
        first = Path(owner.pw_dir) / "plant-first.txt"
        wait_file(first)
        d.wait_state("plant", "running", 30)
        assert first.read_text() == "Permission denied", "the user cannot write into log/NAME"
        os.chown(log_dir, owner.pw_uid, owner.pw_gid)  # as the old daemon left it
        job = ended_with_reason(d, "plant", {"succeeded", "failed"}, 90)
        assert job["state"] == "succeeded" and job["attempts"] == 2, d.status("plant")
        bait.untouched()
        st = os.lstat(log_dir)
        assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o755, "log/NAME is root's again"
        log2 = os.lstat(log_dir / "attempt-2.log")
        assert stat.S_ISREG(log2.st_mode) and log2.st_uid == owner.pw_uid
        aside = [p for p in (d.root / "log").iterdir() if p.name.startswith(".plant.untrusted-")]
        assert len(aside) == 1 and (aside[0] / "attempt-2.log").is_symlink(), "the planted link was set aside"
        answering(d)
    finally:
        d.stop()


def test_dangling_error_symlink_and_a_user_made_rejected_dir(users, base):
    owner, victim, _group = users
    outside = base / "created-by-root.txt"
    spool = base / "root" / "spool"
    spool.mkdir(parents=True)
    spool.chmod(0o1733)
    planted = spool / "rejected"  # the user got there first, before the daemon ever ran
    planted.mkdir()
    os.symlink(outside, planted / "bad.yaml.error")
    os.chown(planted, owner.pw_uid, owner.pw_gid)
    planted.chmod(0o777)
    d = start_daemon(base)
    try:
        rejected = d.spool / "rejected"
        st = os.lstat(rejected)
        assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o711, "rejected/ is made fresh by root at start"
        # A dangling link dropped into the spool itself lands in rejected/ as `bad2.yaml.error`...
        assert run_as(owner, ["ln", "-s", str(outside), str(d.spool / "bad2.yaml.error")]).returncode == 0
        wait_file(rejected / "bad2.yaml.error.error")
        # ... and a job rejected later under that name must not write through it.
        secret_spec = "name: bad2\nlauncher: python\nscript: x.py\nenv: {API_TOKEN: hunter2}\nbogus_key: 1\n"
        drop_as(d, owner, "bad2.yaml", secret_spec)
        drop_as(d, owner, "bad.yaml", secret_spec.replace("bad2", "bad"))
        wait_file(rejected / "bad.yaml.error")
        wait_file(rejected / "bad2.yaml.1.error")
        assert not os.path.lexists(outside), "root created a file through a planted link"
        for spec_name in ("bad.yaml", "bad2.yaml.1"):
            sst = os.lstat(rejected / spec_name)
            assert stat.S_IMODE(sst.st_mode) == 0o600 and sst.st_uid == owner.pw_uid
            assert run_as(victim, ["cat", str(rejected / spec_name)]).returncode != 0, "another user read a spec"
        err = rejected / "bad.yaml.error"
        est = os.lstat(err)
        assert stat.S_IMODE(est.st_mode) == 0o600 and est.st_uid == owner.pw_uid
        assert "bogus_key" in run_as(owner, ["cat", str(err)]).stdout, "the submitter reads why"
        assert any(p.name.startswith(".rejected.untrusted-") for p in d.spool.iterdir())
        answering(d)
        assert d.job("bad") is None and d.job("bad2") is None  # (c): a rejection is the end, with its reason
    finally:
        d.stop()


def test_a_251_character_spool_name_is_rejected_without_crashing(users, base):
    owner, _victim, _group = users
    d = start_daemon(base)
    try:
        long_name = "j" * 246 + ".yaml"
        assert len(long_name) == 251
        drop_as(d, owner, long_name, "name: x\nnot_a_field: 1\n")
        rejected = d.spool / "rejected"
        wait_for(lambda: any(p.name.endswith(".error") for p in rejected.iterdir()), 15, "the error file")
        (err,) = [p for p in rejected.iterdir() if p.name.endswith(".error")]
        assert len(err.name) <= 255 and err.name.startswith("j" * 100)
        assert long_name in err.read_text() and "not_a_field" in err.read_text()
        assert (rejected / long_name).exists() and not (d.spool / long_name).exists()
        answering(d)
    finally:
        d.stop()


def test_checkpoint_parent_swapped_for_a_symlink_between_attempts(users, base):
    owner, _victim, _group = users
    area = base / "area"
    area.mkdir()
    os.chown(area, owner.pw_uid, owner.pw_gid)
    rootonly = base / "rootonly"
    rootonly.mkdir(mode=0o700)
    before = sorted(os.listdir(rootonly)), os.lstat(rootonly).st_mtime_ns
    ckpt = area / "p" / "ckpt"
    script = user_script(owner, "swap.py", f"""
        import os, sys
        if os.environ["SPX_ATTEMPT"] == "1":
            os.rename("{area}/p", "{area}/p.old")
            os.symlink("{rootonly}", "{area}/p")
            sys.exit(1)
        sys.exit(0)
    """)
    d = start_daemon(base)
    try:
        drop_as(d, owner, "swap.yaml", job_yaml("swap", script, extra=f"checkpoints: {{dir: {ckpt}}}\n"))
        job = ended_with_reason(d, "swap", {"failed", "succeeded", "restarting"}, 60)
        job = wait_for(lambda: (j := d.job("swap")) and j["attempts"] >= 1 and j["state"] != "running"
                       and "ckpt" in (j["reason"] or "") and j, 60, "the relaunch to fail on the checkpoint dir")
        assert job["state"] in ("failed", "restarting") and "Permission denied" in job["reason"], job
        assert (sorted(os.listdir(rootonly)), os.lstat(rootonly).st_mtime_ns) == before, "root made a dir in there"
        assert os.lstat(rootonly).st_uid == 0
        answering(d)
    finally:
        d.stop()


def test_attempt_log_swapped_for_a_link_to_a_secret_never_shows_in_status(users, base):
    owner, _victim, _group = users
    bait = Bait.plant(base, b"ValueError: TOPSECRET root-only content\n")
    d = start_daemon(base)
    try:
        log_dir = d.root / "log" / "swaplog"
        script = user_script(owner, "swaplog.py", f"""
            import os, sys, time
            log = "{log_dir}/attempt-1.log"
            for _ in range(300):  # wait until the test hands log/NAME over (the old layout)
                if os.access("{log_dir}", os.W_OK):
                    break
                time.sleep(0.1)
            os.rename(log, log + ".mine")
            os.symlink("{bait.path}", log)
            sys.exit(1)
        """)
        drop_as(d, owner, "swaplog.yaml", job_yaml("swaplog", script, extra="restart: {max_restarts: 0}\n")
                .replace("restart: {max_restarts: 3, backoff_seconds: [1, 1]}\n", ""))
        d.wait_state("swaplog", {"running", "failed"}, 30)
        os.chown(log_dir, owner.pw_uid, owner.pw_gid)
        ended_with_reason(d, "swaplog", {"failed"}, 60)
        assert (log_dir / "attempt-1.log").is_symlink(), "the probe planted its link"
        shown = d.spx("status", "swaplog", "--json", check=False).stdout + d.spx("ls", "--json").stdout
        assert "TOPSECRET" not in shown, "a root-only file leaked through the attempt log"
        bait.untouched()
        answering(d)
    finally:
        d.stop()
