"""Hostile probes against the shared directories of host loss and the default checkpoint dirs
(real users, the daemon as root):

- a teammate's forged `.spx/lease` in a group-writable team checkpoint dir (it would keep the job
  from ever starting): the job is refused with the reason, the teammate's files are left as they are;
  where the owner's `.spx/` came first, the teammate cannot write into it and the job runs;
- a forged final `generation` in `.spx-gang/` (it would end a multi-host job on every host): refused
  with the reason, never believed;
- a squatted default checkpoint dir: another user made `checkpoints_root/NAME` first (an earlier
  version gave it to whoever used NAME first), with `.before-job-ID` links to a root-only dir: a
  later job of that name, the user's or root's, `checkpoints.resume: never`, runs in its own
  per-owner dir and never resumes from or renames through the squatter's; a squatted
  `checkpoints_root/OWNER` is refused with the reason;
- fairness: the attacker holds `flock` on 20 of their own `.spx/lease.lock` files; another owner's
  renewal is not delayed (measured).

Each asserts (a) nothing outside the user's reach changed (Bait), (b) the daemon kept answering,
(c) the victim job ran as if nothing happened, or was refused with a clear reason."""

from __future__ import annotations

import grp
import json
import os
import pwd
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
from hostile.probe import (
    PYTHON,
    Bait,
    answering,
    drop_as,
    ended_with_reason,
    job_yaml,
    start_daemon,
    user_script,
    wait_file,
)
from hostile.users import GROUP, run_as
from lease_fixtures import LiveJobsStore, running_job

from spx.daemon.core.config import DaemonConfig
from spx.daemon.run.lease_keeper import LeaseKeeper

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: real users, the daemon as root")

RAN = """
    import os
    with open(os.path.join(os.environ["SPX_CHECKPOINT_DIR"], "ran"), "a") as f:
        f.write(os.environ.get("SPX_RESUME_FROM", "") + "\\n")
"""


@pytest.fixture
def teammates(users):
    """(alice, bob): alice owns the jobs, bob is her teammate — both in the group — and the attacker."""
    alice, bob, group = users
    subprocess.run(["usermod", "-aG", group.gr_name, bob.pw_name], check=True, capture_output=True)
    try:
        yield alice, pwd.getpwnam(bob.pw_name)
    finally:
        subprocess.run(["gpasswd", "-d", bob.pw_name, group.gr_name], check=False, capture_output=True)


def team_dir(base: Path, alice: pwd.struct_passwd, name: str) -> Path:
    """alice's checkpoint dir in a team area, group-writable (setgid, 2770) for the whole group."""
    team = base / "team"
    team.mkdir(exist_ok=True)
    team.chmod(0o755)
    ckpt = team / name
    ckpt.mkdir()
    os.chown(ckpt, alice.pw_uid, grp.getgrnam(GROUP).gr_gid)
    ckpt.chmod(0o2770)
    return ckpt


def as_bob(bob: pwd.struct_passwd, code: str) -> subprocess.CompletedProcess:
    return run_as(bob, [PYTHON, "-c", code])


def snapshot(path: Path) -> list[tuple[str, int, int, int, bytes]]:
    """Every entry below `path` (links not followed): name, owner, mode, mtime, content (files)."""
    out = []
    for top, dirs, files in os.walk(path, followlinks=False):
        for name in [".", *sorted(dirs), *sorted(files)]:
            p = Path(top) / name
            st = os.lstat(p)
            data = p.read_bytes() if name in files and not p.is_symlink() else b""
            out.append((str(p), st.st_uid, st.st_mode, st.st_mtime_ns, data))
    return out


def test_a_teammates_forged_lease_is_refused_with_the_reason_and_a_first_spx_cannot_be_forged(teammates, base):
    alice, bob = teammates
    bait = Bait.plant(base)
    forged_at = team_dir(base, alice, "forged")
    planted = as_bob(bob, f"""
import json, os
os.mkdir({str(forged_at / ".spx")!r}, 0o777)
os.chmod({str(forged_at / ".spx")!r}, 0o777)
with open({str(forged_at / ".spx" / "lease")!r}, "w") as f:
    json.dump({{"host": "nowhere:/var/lib/spx", "job": "0" * 32, "expires": 1e12, "gen": 99}}, f)
""")
    assert planted.returncode == 0, planted.stderr
    bobs = snapshot(forged_at / ".spx")
    script = user_script(alice, "ran.py", RAN)
    d = start_daemon(base)
    try:
        drop_as(d, alice, "forged.yaml", job_yaml("forged", script, extra=f"checkpoints: {{dir: {forged_at}}}\n"))
        job = ended_with_reason(d, "forged", {"failed", "succeeded", "cancelled"}, 60)
        assert job["state"] == "failed" and f".spx belongs to uid {bob.pw_uid}" in job["reason"], job
        assert "refuses to use it" in job["reason"] and not (forged_at / "ran").exists()
        assert snapshot(forged_at / ".spx") == bobs, "bob's files neither used nor 'fixed' by root"

        # Where alice's job made its .spx/ first (0700, hers), bob cannot write a lease into it.
        first = team_dir(base, alice, "first")
        drop_as(d, alice, "first.yaml", job_yaml("first", script, extra=f"checkpoints: {{dir: {first}}}\n"))
        assert ended_with_reason(d, "first", {"failed", "succeeded"}, 60)["state"] == "succeeded"
        tried = as_bob(bob, f"open({str(first / '.spx' / 'lease')!r}, 'w').write('{{}}')")
        assert tried.returncode != 0 and "Permission denied" in tried.stderr
        assert (first / "ran").read_text() == "\n", "ran once, fresh"
        bait.untouched()
        answering(d)
    finally:
        d.stop()


def test_a_forged_final_generation_in_spx_gang_is_refused_never_believed(teammates, base):
    alice, bob = teammates
    bait = Bait.plant(base)
    ckpt = team_dir(base, alice, "wide")
    planted = as_bob(bob, f"""
import json, os
g = {str(ckpt / ".spx-gang")!r}
os.mkdir(g, 0o777); os.chmod(g, 0o777); os.mkdir(g + "/hosts", 0o777)
with open(g + "/generation", "w") as f:
    json.dump({{"gen": 7, "final": "failed", "reason": "FORGED by bob", "label": "bobs-host", "time": 1.0}}, f)
""")
    assert planted.returncode == 0, planted.stderr
    bobs = snapshot(ckpt / ".spx-gang")
    script = user_script(alice, "wide.py", "import sys\nsys.exit(0)\n")
    d = start_daemon(base)
    try:
        drop_as(d, alice, "wide.yaml", f"name: wide\nlauncher: torchrun\npython: {PYTHON}\nscript: {script}\n"
                                       "gpus: 0\nnodes: {count: 2, rdzv_endpoint: '127.0.0.1:29931'}\n"
                                       f"checkpoints: {{dir: {ckpt}}}\nrestart: {{max_restarts: 0}}\n")
        job = ended_with_reason(d, "wide", {"failed", "succeeded", "cancelled"}, 90)
        assert f".spx-gang belongs to uid {bob.pw_uid}" in job["reason"], job
        assert "FORGED" not in job["reason"] and "bobs-host" not in job["reason"], "the forged generation was believed"
        assert snapshot(ckpt / ".spx-gang") == bobs
        bait.untouched()
        answering(d)
    finally:
        d.stop()


def test_a_squatted_default_checkpoint_dir_is_never_resumed_from_or_renamed_through(teammates, base):
    alice, bob = teammates
    bait = Bait.plant(base)
    d = start_daemon(base)
    try:
        # An earlier version gave checkpoints_root/NAME to whoever used NAME first: bob, with a
        # checkpoint for the next job of that name to resume from, and links where `resume: never`
        # would set files aside.
        squat = d.root / "checkpoints" / "shared"
        squat.mkdir(parents=True)
        (squat / "ckpt.pt").write_bytes(b"bob's bait checkpoint")
        for n in range(1, 6):
            os.symlink(bait.path.parent, squat / f".before-job-{n}")
        for p in (squat, squat / "ckpt.pt", *[squat / f".before-job-{n}" for n in range(1, 6)]):
            os.lchown(p, bob.pw_uid, bob.pw_gid)
        bobs = snapshot(squat)
        script = user_script(alice, "ran.py", RAN)
        extra = "checkpoints: {resume: never, pattern: 'ckpt*.pt'}\n"
        drop_as(d, alice, "shared.yaml", job_yaml("shared", script, extra=extra))
        assert ended_with_reason(d, "shared", {"failed", "succeeded"}, 60)["state"] == "succeeded"
        assert (d.checkpoint_dir("shared", alice.pw_name) / "ran").read_text() == "\n", "fresh, in her own dir"
        root_script = base / "root-ran.py"
        root_script.write_text(textwrap.dedent(RAN))
        d.drop("root-shared.yaml", job_yaml("shared", root_script, extra=extra))
        assert ended_with_reason(d, "shared", {"failed", "succeeded"}, 60)["state"] == "succeeded"
        assert (d.checkpoint_dir("shared", "root") / "ran").read_text() == "\n", "root's job: fresh, in root's dir"
        assert snapshot(squat) == bobs, "nothing resumed from, set aside into or renamed through bob's dir"
        bait.untouched()
        answering(d)
    finally:
        d.stop()


def test_a_squatted_owner_dir_below_the_checkpoints_root_is_refused_with_the_reason(teammates, base):
    alice, bob = teammates
    bait = Bait.plant(base)
    d = start_daemon(base)
    try:
        squat = d.root / "checkpoints" / alice.pw_name  # bob's job named like alice, from an earlier version
        squat.mkdir(parents=True)
        os.chown(squat, bob.pw_uid, bob.pw_gid)
        bobs = snapshot(squat)
        script = user_script(alice, "ran.py", RAN)
        drop_as(d, alice, "mine.yaml", job_yaml("mine", script))
        error = d.spool / "rejected" / "mine.yaml.error"
        wait_file(error)
        assert f"{squat} exists and belongs to uid {bob.pw_uid}" in error.read_text(), "refused at submit, with why"
        assert d.job("mine") is None and snapshot(squat) == bobs
        bait.untouched()
        answering(d)
    finally:
        d.stop()


def test_one_owner_holding_20_of_their_lease_locks_does_not_delay_another_owners_renewal(teammates, base):
    alice, bob = teammates  # bob, the attacker, holds his own lock files; alice's renewal is measured
    dirs = {}
    for owner, names in ((bob, [f"b{i}" for i in range(20)]), (alice, ["a0"])):
        for i, name in enumerate(names):
            ckpt = base / "vol" / name
            (ckpt / ".spx").mkdir(parents=True, mode=0o700)
            uid = f"{owner.pw_uid:08x}{i:024x}"
            (ckpt / ".spx" / "job.yaml").write_text(f'uid: "{uid}"\n')
            (ckpt / ".spx" / "lease.lock").write_text("")
            for p in (ckpt, ckpt / ".spx", ckpt / ".spx" / "job.yaml", ckpt / ".spx" / "lease.lock"):
                os.chown(p, owner.pw_uid, owner.pw_gid)
            dirs[name] = (owner, uid, ckpt)
    (base / "vol").chmod(0o755)
    holder = subprocess.Popen(
        [PYTHON, "-c", "import fcntl, sys\nfds = [open(p) for p in sys.argv[1:]]\n"
                       "[fcntl.flock(f, fcntl.LOCK_EX) for f in fds]\nprint('held', flush=True)\nsys.stdin.read()\n",
         *[str(c / ".spx" / "lease.lock") for n, (_o, _u, c) in dirs.items() if n.startswith("b")]],
        user=bob.pw_uid, group=bob.pw_gid, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    jobs = [running_job(i, owner.pw_uid, owner.pw_name, uid, ckpt)
            for i, (owner, uid, ckpt) in enumerate(dirs.values(), start=1)]
    keeper = LeaseKeeper(DaemonConfig(state_dir=base / "state", adopt_lease_seconds=120), LiveJobsStore(jobs))
    for owner, uid, ckpt in dirs.values():  # each job's lease, as its preparation took it on this host
        lease = ckpt / ".spx" / "lease"
        lease.write_text(json.dumps({"host": keeper.host, "job": uid, "expires": time.time() + 60, "gen": 1}))
        os.chown(lease, owner.pw_uid, owner.pw_gid)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        keeper.turn()
        while alice.pw_uid in keeper._renewing:
            assert time.monotonic() - started < 10, "alice's renewal waited behind bob's locks"
            keeper._woken.wait(0.05)
            keeper.lanes.deliver()
        waited = time.monotonic() - started
        lease = json.loads((dirs["a0"][2] / ".spx" / "lease").read_text())
        assert lease["job"] == dirs["a0"][1] and lease["expires"] > time.time() + 100, "renewed for 120 s"
        assert bob.pw_uid in keeper._renewing, "bob's renewals still wait on his own locks"
        print(f"fairness: alice's renewal answered in {waited:.2f} s while bob held 20 of his lease locks")
        assert waited < 2.0
    finally:
        holder.communicate("", timeout=10)
        keeper.lanes.close(wait=60)
