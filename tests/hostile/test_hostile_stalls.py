"""A user who stalls the work the daemon does on their behalf stalls only their own jobs (issue 25):
every helper the daemon runs as them (checkpoint discovery, the attempt's files) is theirs to
SIGSTOP, and this one does, for eight jobs at once. Another owner's job still starts at once, and the
main loop answers every request within 2 s throughout: the work runs in the owner's own lane
(core.lanes), never on the loop, never in another owner's slots."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from datetime import datetime
from pathlib import Path

from hostile import probe

from harness import Daemon, wait_for
from spx.daemon.core.config import load_config
from spx.daemon.service import control

FREEZER = """
    import os, signal, time
    me = os.getuid()
    while True:
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                if os.stat(f"/proc/{pid}").st_uid != me:
                    continue
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read()
            except OSError:
                continue
            if b"user_actions" in cmd:
                try:
                    os.kill(int(pid), signal.SIGSTOP)
                except OSError:
                    pass
        time.sleep(0.002)
"""


def helpers_of(uid: int) -> list[int]:
    """The daemon's as-user helpers now running as `uid` (the processes the freezer stops)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{pid}").st_uid == uid and b"user_actions" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            continue
    return found


def loop_answers_within(d, seconds: float) -> float:
    """How long the main loop took to answer a request on the control socket (a cancel of a job
    nobody has), as `spx` asks it; the time is the daemon's, not a CLI's start-up."""
    t0 = time.monotonic()
    reply = control.request(load_config(None, d.root).socket_path, "cancel", "spx-loop-probe", timeout=60)
    took = time.monotonic() - t0
    assert "no job named" in reply.get("error", ""), reply
    assert took < seconds, f"the main loop answered only after {took:.1f} s"
    return took


def test_a_user_who_freezes_their_own_helpers_delays_only_their_own_jobs(users, base):
    owner, victim, _group = users
    bait = probe.Bait.plant(base)
    theirs = probe.user_script(owner, "quick.py", "print('never got this far')\n")
    mine = probe.user_script(victim, "quick.py", "import time\ntime.sleep(1)\nprint('done')\n")
    d = probe.start_daemon(base)
    freezer = None
    try:
        # Their jobs accepted first (intake's own checks as the user are not what this probes), held
        # by a drain until the freezer runs; then they all start at once.
        d.spx("drain")
        for i in range(8):
            probe.drop_as(d, owner, f"stalled-{i}.yaml", probe.job_yaml(f"stalled-{i}", theirs))
        wait_for(lambda: len([j for j in d.ls() if j["state"] == "queued"]) == 8, 60, "their 8 jobs queued")
        freezer = subprocess.Popen([probe.PYTHON, str(probe.user_script(owner, "freeze.py", FREEZER))], user=owner.pw_uid,
                                   group=owner.pw_gid, cwd="/", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        d.spx("undrain")
        wait_for(lambda: len([p for p in helpers_of(owner.pw_uid) if _stopped(p)]) >= 4, 60,
                 "four of the owner's helpers frozen (all of their lane's slots)")
        dropped = time.monotonic()
        probe.drop_as(d, victim, "other.yaml", probe.job_yaml("another-owners", mine))
        while not d.events("attempt_started", job="another-owners"):  # the daemon's log, read as it comes
            loop_answers_within(d, 2.0)
            assert time.monotonic() - dropped < 6, f"another owner's job waited: {d.job('another-owners')}"
            time.sleep(0.2)
        assert probe.ended_with_reason(d, "another-owners", {"succeeded"}, 60)
        loop_answers_within(d, 2.0)
        probe.answering(d)
        bait.untouched()
    finally:
        _thaw(freezer, owner.pw_uid)
        d.stop()


def _thaw(freezer: subprocess.Popen | None, uid: int) -> None:
    """Stop the freezer, and end the owner's helpers the daemon has not killed yet (its timeout does)."""
    if freezer is not None:
        freezer.kill()
        freezer.wait()
    for pid in helpers_of(uid):
        for sig in (signal.SIGKILL, signal.SIGCONT):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


def _stopped(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


HOLD_LOCKS = ("import fcntl, sys\nfds = [open(p, 'a') for p in sys.argv[1:]]\n"
              "for f in fds:\n    fcntl.flock(f, fcntl.LOCK_EX)\nprint('held', flush=True)\nsys.stdin.read()\n")


def _locked_checkpoint_dirs(owner, count: int) -> list[Path]:
    """`count` checkpoint dirs of the owner's, each with the `.spx/lease.lock` their jobs' leases are
    taken under (userfs/cas.py): the owner's own files, which the owner may hold."""
    dirs = []
    for i in range(count):
        ck = Path(owner.pw_dir) / "ck" / f"j{i}"
        (ck / ".spx").mkdir(parents=True, exist_ok=True)
        (ck / ".spx" / "lease.lock").touch()
        for p in (ck.parent, ck, ck / ".spx", ck / ".spx" / "lease.lock"):
            os.chown(p, owner.pw_uid, owner.pw_gid)
        (ck / ".spx").chmod(0o700)
        (ck / ".spx" / "lease.lock").chmod(0o600)
        dirs.append(ck)
    return dirs


def _at(event: dict) -> float:
    return datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()


def test_300_spool_files_and_20_held_lease_locks_of_one_owner_never_delay_another_owners_job(users, base):
    """The fairness the issue asks for: one owner holds `flock` on 20 of their own lease locks (their
    jobs' attempts cannot take their leases), freezes every helper the daemon runs as them, and drops
    300 spool files; another owner's job is queued within 1 s of its drop and running within 10 s
    (GPUs are free: the first owner's jobs are CPU jobs), succeeds, and the loop answers within 2 s
    throughout."""
    owner, victim, _group = users
    bait = probe.Bait.plant(base)
    theirs = probe.user_script(owner, "quick.py", "print('never got this far')\n")
    mine = probe.user_script(victim, "quick.py", "import time\ntime.sleep(1)\nprint('done')\n")
    d = Daemon(base / "root", gpu_backend="fake").start()
    holder = freezer = None
    try:
        locks = [str(ck / ".spx" / "lease.lock") for ck in _locked_checkpoint_dirs(owner, 20)]
        holder = subprocess.Popen([probe.PYTHON, "-c", HOLD_LOCKS, *locks], user=owner.pw_uid, group=owner.pw_gid,
                                  cwd="/", stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        d.spx("drain")  # their 20 jobs accepted first, then started at once, each into a held lock
        for i, lock in enumerate(locks):
            probe.drop_as(d, owner, f"locked-{i}.yaml", probe.job_yaml(
                f"locked-{i}", theirs, extra=f"checkpoints: {{dir: {Path(lock).parent.parent}}}\n"))
        wait_for(lambda: len([j for j in d.ls() if j["state"] == "queued"]) == 20, 60, "their 20 jobs queued")
        freezer = subprocess.Popen([probe.PYTHON, str(probe.user_script(owner, "freeze.py", FREEZER))], user=owner.pw_uid,
                                   group=owner.pw_gid, cwd="/", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        d.spx("undrain")
        for i in range(300):  # each names a job never submitted: parsed and checked as them, then refused
            probe.drop_as(d, owner, f"spam-{i}.yaml", probe.job_yaml(f"spam-{i}", theirs, extra="after: [never-submitted]\n"))
        wait_for(lambda: len([p for p in helpers_of(owner.pw_uid) if _stopped(p)]) >= 4, 60,
                 "four of the owner's helpers frozen (all of their lane's slots)")
        dropped = time.time()
        probe.drop_as(d, victim, "other.yaml", probe.job_yaml("another-owners", mine).replace("gpus: 0", "gpus: 1"))
        while not d.events("attempt_started", job="another-owners"):  # the daemon's log, read as it comes
            loop_answers_within(d, 2.0)
            assert time.time() - dropped < 10, f"another owner's job waited: {d.job('another-owners')}"
            time.sleep(0.2)
        queued = _at(d.events("job_queued", job="another-owners")[0]) - dropped
        started = _at(d.events("attempt_started", job="another-owners")[0]) - dropped
        assert queued <= 1.0, f"queued {queued:.2f} s after its drop"
        assert started <= 10.0, f"running {started:.2f} s after its drop"
        assert probe.ended_with_reason(d, "another-owners", {"succeeded"}, 60)
        loop_answers_within(d, 2.0)
        probe.answering(d)
        bait.untouched()
    finally:
        _thaw(freezer, owner.pw_uid)
        if holder is not None:
            holder.kill()
            holder.wait()
        d.stop()
