"""What every hostile probe shares: a daemon running as root in a root every test user can reach,
job files dropped as the attacking user, the real `spx` and /metrics as a user, root-only bait files
whose every property is checked afterwards, and the three things each probe asserts:
(a) nothing outside the user's reach was created, read, changed or chowned — `Bait.untouched`;
(b) the daemon is alive and answering, and its main loop kept turning (no two watchdog pings more
    than LOOP_GAP_SECONDS apart) — `answering`;
(c) the job ends in a state with a reason — `ended_with_reason`.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

from hostile.users import run_as

from harness import BIN, Daemon, wait_for

LOOP_GAP_SECONDS = 2.0  # the bound on "the loop kept turning" (the unit's WatchdogSec is 60 s)
PYTHON = "/usr/bin/python3"  # a python every user can run (the venv's may sit under /root)
FETCH = "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())"


def world() -> Path:
    """A fresh directory under /var/tmp, 0755 (pytest's tmp_path is 0700, closed to test users)."""
    base = Path(tempfile.mkdtemp(prefix="spx-hostile-", dir="/var/tmp"))
    base.chmod(0o755)
    return base


def remove_world(base: Path) -> None:
    shutil.rmtree(base, ignore_errors=True)


def start_daemon(base: Path, log_level: str = "info") -> Daemon:
    return Daemon(base / "root", gpu_backend="none", log_level=log_level).start()


def drop_as(d: Daemon, user: pwd.struct_passwd, name: str, text: str) -> None:
    """A job file owned by `user`, renamed into the spool as `spx submit` does."""
    tmp = d.spool / f".{name[:200]}.tmp"
    tmp.write_text(text)
    os.chown(tmp, user.pw_uid, user.pw_gid)
    os.rename(tmp, d.spool / name)


def user_script(user: pwd.struct_passwd, name: str, body: str) -> Path:
    """A script in the user's home, owned by them (what an attacker's job runs)."""
    path = Path(user.pw_dir) / name
    path.write_text(textwrap.dedent(body))
    os.chown(path, user.pw_uid, user.pw_gid)
    return path


def job_yaml(name: str, script: Path, *, extra: str = "", backoff: str = "[1, 1]") -> str:
    return (f"name: {name}\nlauncher: python\npython: {PYTHON}\nscript: {script}\ngpus: 0\n"
            f"restart: {{max_restarts: 3, backoff_seconds: {backoff}}}\nstop: {{grace_seconds: 2}}\n{extra}")


@dataclass
class Bait:
    """A root-only file (and its root-only directory) that a probe tries to make root touch."""

    path: Path
    content: bytes
    before: tuple = ()

    @classmethod
    def plant(cls, base: Path, content: bytes = b'{"step": 987654321, "time": 1e12}') -> Bait:
        vault = base / "vault"
        vault.mkdir(mode=0o700)
        path = vault / "secret.json"
        path.write_bytes(content)
        path.chmod(0o600)
        bait = cls(path, content)
        bait.before = bait._snapshot()
        return bait

    def _snapshot(self) -> tuple:
        st, dst = os.lstat(self.path), os.lstat(self.path.parent)
        return (st.st_uid, st.st_gid, st.st_mode, st.st_mtime_ns, st.st_size, st.st_nlink,
                dst.st_uid, dst.st_mode, dst.st_mtime_ns, sorted(os.listdir(self.path.parent)))

    def untouched(self) -> None:
        assert self._snapshot() == self.before, "a root-only file or its directory was changed"
        assert self.path.read_bytes() == self.content


def answering(d: Daemon) -> list[dict]:
    """(b): alive, `spx ls` answers promptly, and the loop never went LOOP_GAP_SECONDS without a turn
    since the daemon started (its watchdog pings, read by the harness)."""
    assert d.alive(), f"daemon died: {d.lines[-20:]}"
    t0 = time.monotonic()
    jobs = d.ls()
    assert time.monotonic() - t0 < 10, "spx ls took more than 10 s"
    loop_kept_turning(d)
    return jobs


def loop_kept_turning(d: Daemon) -> None:
    assert d.loop is not None, "the probe's daemon was started with a NOTIFY_SOCKET of the test's own"
    gap = d.loop.max_gap(running=d.alive())
    assert gap <= LOOP_GAP_SECONDS, f"the daemon's main loop went {gap:.1f} s without a turn (watchdog pings)"


def ended_with_reason(d: Daemon, name: str, states: set[str], timeout: float = 60) -> dict:
    """(c): the job reaches one of `states`, with a reason."""
    job = d.wait_state(name, states, timeout)
    assert job["reason"], f"{name} is {job['state']} without a reason"
    return job


def wait_file(path: Path, timeout: float = 30) -> None:
    wait_for(lambda: os.path.lexists(path), timeout, f"{path}")


def _others_can_run(path: Path) -> bool:
    """`path` and the interpreter it runs are reachable by any user (not under a 0700 /root)."""
    targets = [path, Path(os.path.realpath(sys.executable))]
    return all(os.stat(p).st_mode & stat.S_IXOTH for t in targets for p in [t, *t.parents])


def real_spx_as(user: pwd.struct_passwd, d: Daemon, *args: str, check: bool = False) -> subprocess.CompletedProcess:
    """The real `spx` as `user` (as root where the venv is closed to other users); with `check`, it
    must exit 0."""
    argv = [str(BIN / "spx"), "--root", str(d.root), *args]
    if _others_can_run(BIN / "spx"):
        res = run_as(user, argv, timeout=60)
    else:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if check:
        assert res.returncode == 0, f"spx {' '.join(args)} as {user.pw_name}: {res.stderr}{res.stdout}"
    return res


def metrics_as(user: pwd.struct_passwd, d: Daemon) -> str:
    """The daemon's /metrics as `user` fetches it (any local user can): its text; the fetch must succeed."""
    res = run_as(user, [PYTHON, "-c", FETCH, f"http://127.0.0.1:{d.metrics_port}/metrics"], timeout=30)
    assert res.returncode == 0, f"/metrics failed for {user.pw_name}: {res.stderr}"
    return res.stdout
