"""Hostile probes against `spx adopt`: the checkpoint volume is users' trees, and root walks it.

The scanner (intake/adopt_scan.py) is driven in-process as root over real users' files: a `.spx`
that is a link, a FIFO record, a record owned by another user than its directory, one whose text
names another owner, an oversize one, one others may write, a hard-linked one, a link to another
user's tree, records too deep. Then a daemon adopts a user's job end to end: it runs as the file's
owner, and its end marker is written as that owner."""

from __future__ import annotations

import json
import os
import pwd
import threading
from pathlib import Path

import pytest
from hostile.probe import PYTHON, answering, user_script

from harness import Daemon, wait_for
from spx.daemon.core.spec import parse_spec
from spx.daemon.intake import job_record
from spx.daemon.intake.adopt_scan import MAX_DEPTH, Found, Refused, scan
from spx.daemon.state.jobs_table import JobRow
from spx.daemon.state.states import JobState

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: chowns to real users, runs the daemon as root")


def record_text(user: pwd.struct_passwd, name: str, script: Path, ckpt: Path, *, owner: str | None = None,
                uid: str = "0123456789abcdef0123456789abcdef") -> str:
    spec = parse_spec(f"name: {name}\nlauncher: python\npython: {PYTHON}\nscript: {script}\n"
                      f"checkpoints: {{dir: {ckpt}}}\nrestart: {{max_restarts: 0}}\n")
    job = JobRow(id=1, name=name, state=JobState.RUNNING, reason=None, owner_uid=user.pw_uid,
                 owner=owner or user.pw_name, spec=spec, spec_file="-", submitted=1.7e9, priority=0, gpus=[],
                 backoff_remaining=0.0, no_progress_streak=0, backoff_level=0, staging=None, uid=uid)
    return job_record.render(job, "lost-host:/var/lib/spx")


def plant(parent: Path, user: pwd.struct_passwd, name: str, text: str | None = None, **kw) -> Path:
    """A checkpoint dir `parent/name` with `.spx/job.yaml`, all owned by `user` as spx leaves them
    (dir 0750, .spx 0700, record 0600). Returns the checkpoint dir."""
    ckpt = parent / name
    ckpt.mkdir(parents=True)
    (ckpt / ".spx").mkdir(mode=0o700)
    rec = ckpt / ".spx" / "job.yaml"
    rec.write_text(text if text is not None else record_text(user, name, Path(user.pw_dir) / "x.py", ckpt, **kw))
    rec.chmod(0o600)
    for p in (ckpt, ckpt / ".spx", rec):
        os.chown(p, user.pw_uid, user.pw_gid, follow_symlinks=False)
    ckpt.chmod(0o750)
    return ckpt


def outcome(results: list, ckpt: Path) -> Found | Refused:
    (hit,) = [r for r in results if r.dir == ckpt]
    return hit


def test_a_users_record_is_found_and_its_owner_is_the_files_owner(users, base):
    owner, _victim, _group = users
    ckpt = plant(base / "vol", owner, "good")
    hit = outcome(scan(base / "vol"), ckpt)
    assert isinstance(hit, Found) and hit.owner_uid == owner.pw_uid and hit.owner == owner.pw_name
    assert hit.record.spec.name == "good" and hit.ended is None and hit.lease is None


def test_a_spx_that_is_a_symlink_is_refused_not_followed(users, base):
    owner, victim, _group = users
    real = plant(base / "victims", victim, "real")
    evil = base / "vol" / "evil"
    evil.mkdir(parents=True)
    os.symlink(real / ".spx", evil / ".spx")
    os.chown(evil, owner.pw_uid, owner.pw_gid)
    os.lchown(evil / ".spx", owner.pw_uid, owner.pw_gid)
    hit = outcome(scan(base / "vol"), evil)
    assert isinstance(hit, Refused) and "symbolic link" in hit.why


def test_a_fifo_record_is_refused_without_blocking(users, base):
    owner, _victim, _group = users
    ckpt = plant(base / "vol", owner, "fifo", text="")
    rec = ckpt / ".spx" / "job.yaml"
    rec.unlink()
    os.mkfifo(rec, 0o600)
    os.chown(rec, owner.pw_uid, owner.pw_gid)
    results: list = []
    t = threading.Thread(target=lambda: results.extend(scan(base / "vol")), daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "a FIFO record blocked the scan"
    hit = outcome(results, ckpt)
    assert isinstance(hit, Refused) and ("FIFO" in hit.why or "not a regular file" in hit.why)


def test_a_record_owned_by_another_user_than_its_directory_is_refused(users, base):
    owner, victim, _group = users
    ckpt = plant(base / "vol", victim, "theirs")
    os.chown(ckpt / ".spx" / "job.yaml", owner.pw_uid, owner.pw_gid)  # the owner's record in the victim's dir
    hit = outcome(scan(base / "vol"), ckpt)
    assert isinstance(hit, Refused) and "belongs to uid" in hit.why


def test_a_record_naming_another_owner_is_refused(users, base):
    owner, _victim, _group = users
    ckpt = plant(base / "vol", owner, "forged", owner="root")
    hit = outcome(scan(base / "vol"), ckpt)
    assert isinstance(hit, Refused) and "the owner is the file's owner" in hit.why


def test_an_oversize_record_is_refused(users, base):
    owner, _victim, _group = users
    big = record_text(owner, "big", Path("/x.py"), base / "vol" / "big") + "#" * (65 * 1024) + "\n"
    ckpt = plant(base / "vol", owner, "big", text=big)
    hit = outcome(scan(base / "vol"), ckpt)
    assert isinstance(hit, Refused) and "larger than" in hit.why


def test_a_record_others_may_write_is_refused(users, base):
    owner, _victim, _group = users
    ckpt = plant(base / "vol", owner, "shared")
    (ckpt / ".spx" / "job.yaml").chmod(0o620)
    hit = outcome(scan(base / "vol"), ckpt)
    assert isinstance(hit, Refused) and "writable by others" in hit.why


def test_a_hard_linked_record_is_refused(users, base):
    owner, _victim, _group = users
    ckpt = plant(base / "vol", owner, "linked")
    os.link(ckpt / ".spx" / "job.yaml", ckpt / "alias.yaml")
    hit = outcome(scan(base / "vol"), ckpt)
    assert isinstance(hit, Refused) and "hard links" in hit.why


def test_a_link_into_another_users_tree_and_a_record_too_deep_are_not_found(users, base):
    owner, victim, _group = users
    theirs = plant(base / "elsewhere", victim, "private")
    vol = base / "vol"
    vol.mkdir()
    os.symlink(theirs.parent, vol / "shortcut")
    deep = vol.joinpath(*[f"d{i}" for i in range(MAX_DEPTH)])
    plant(deep, owner, "deep")
    results = scan(vol)
    assert not [r for r in results if isinstance(r, Found)], results
    assert all("private" not in str(r.dir) for r in results)


def test_a_users_job_is_adopted_runs_as_the_files_owner_and_ends_once(users, base):
    owner, _victim, _group = users
    vol = base / "vol"
    vol.mkdir()
    script = user_script(owner, "adopted.py", """
        import os
        d = os.environ["SPX_CHECKPOINT_DIR"]
        with open(os.path.join(d, "ran-as"), "a") as f:
            f.write(f"{os.getuid()}\\n")
    """)
    ckpt = vol / "mine"
    plant(vol, owner, "mine", text=record_text(owner, "mine", script, ckpt))
    forged = vol / "forged"
    plant(vol, owner, "forged", text=record_text(owner, "forged", script, forged, owner="root",
                                                 uid="fedcba9876543210fedcba9876543210"))
    d = Daemon(base / "root", gpu_backend="none", config={"adopt_lease_seconds": 6}).start()
    try:
        res = d.spx("adopt", str(vol), "--json", check=False)
        got = {Path(r["dir"]).name: r for r in json.loads(res.stdout)}
        assert res.returncode == 1 and got["forged"]["result"] == "refused", got
        assert got["mine"]["result"] == "queued", got
        d.wait_state("mine", {"succeeded", "failed"}, 60)
        assert d.status("mine")["state"] == "succeeded" and d.status("mine")["owner"] == owner.pw_name
        assert (ckpt / "ran-as").read_text() == f"{owner.pw_uid}\n", "ran once, as the file's owner"
        state = ckpt / ".spx" / "state"
        wait_for(state.exists, 30, "the end marker")
        assert state.stat().st_uid == owner.pw_uid, "written as the owner, not by root"
        assert json.loads(state.read_text())["state"] == "succeeded"
        assert d.job("forged") is None
        again = json.loads(d.spx("adopt", str(vol), "--json", check=False).stdout)
        assert {Path(r["dir"]).name: r["result"] for r in again} == {"forged": "refused", "mine": "known"}
        answering(d)
    finally:
        d.stop()
