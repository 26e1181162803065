"""Hostile probes against what one user learns of another's jobs, and against root's `spx` talking to
a socket a user controls. Real users that share one primary group (as everyone's `users` does on many
hosts), the daemon as root (see probe.py for what every probe asserts)."""

from __future__ import annotations

import grp
import io
import os
import pwd
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hostile.probe import PYTHON, answering, drop_as, ended_with_reason, job_yaml, start_daemon, user_script
from hostile.users import run_as

from harness import BIN, Daemon, wait_for
from spx.daemon.cli import main as cli_main
from spx.daemon.service import control

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: runs the daemon as root and creates users")

TOKEN = "owner-secret-7f3a"
# Enough output to rotate a log capped at 4 KiB: attempt-1.log.1 holds some of it too.
LOUD = f"""
    for i in range(200):
        print("{TOKEN} line", i, "." * 40)
"""


@pytest.fixture(scope="module")
def same_primary_group(users):
    """The module's users with one primary group (the fixture's group), restored afterwards."""
    owner, victim, group = users
    before = {u.pw_name: grp.getgrgid(u.pw_gid).gr_name for u in (owner, victim)}
    for name in before:
        subprocess.run(["usermod", "-g", group.gr_name, name], check=True, capture_output=True)
    try:
        yield pwd.getpwnam(owner.pw_name), pwd.getpwnam(victim.pw_name), grp.getgrnam(group.gr_name)
    finally:
        for name, primary in before.items():
            subprocess.run(["usermod", "-g", primary, name], check=False, capture_output=True)


def spx_as(user: pwd.struct_passwd, *args: str) -> tuple[int, str]:
    """`spx ARGS` as `user` (their groups, gid, uid), in a forked child running the CLI's own code
    (the venv's console script may sit under a /root other users cannot enter): exit code, output."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(r)
            os.setgroups(os.getgrouplist(user.pw_name, user.pw_gid))
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            out = io.TextIOWrapper(os.fdopen(w, "wb"), write_through=True)
            sys.stdout = sys.stderr = out
            code = cli_main.main(list(args))
            out.flush()
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        text = f.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), text


def _run_loud_job(d: Daemon, owner: pwd.struct_passwd, name: str) -> Path:
    drop_as(d, owner, f"{name}.yaml", job_yaml(name, user_script(owner, f"{name}.py", LOUD)))
    ended_with_reason(d, name, {"succeeded"}, 60)  # (c)
    log_dir = d.root / "log" / name
    wait_for(lambda: (log_dir / "attempt-1.exit").exists(), 30, "the exit record")
    return log_dir


def _denied(user: pwd.struct_passwd, argv: list[str]) -> bool:
    res = run_as(user, argv, timeout=30)
    return res.returncode != 0 and "Permission denied" in res.stderr and TOKEN not in res.stdout


def test_another_user_of_the_same_primary_group_reads_no_log_or_exit_record(same_primary_group, base):
    owner, victim, group = same_primary_group
    assert owner.pw_gid == victim.pw_gid == group.gr_gid
    d = start_daemon_with(base, {"log_max_bytes": 4096})
    try:
        log_dir = _run_loud_job(d, owner, "private")
        logs = [log_dir / "attempt-1.log", log_dir / "attempt-1.log.1"]
        for f in logs:
            st = os.stat(f)
            assert (st.st_uid, st.st_mode & 0o777) == (owner.pw_uid, 0o600), f
        # (a) the other user, though of the owner's primary group, reads nothing of the job's
        for f in [*logs, log_dir / "attempt-1.exit", log_dir / ".job-id"]:
            assert _denied(victim, ["cat", str(f)]), f
        assert _denied(victim, ["ls", str(log_dir / "attempt-1.ranks")])
        # the owner reads their log, with `spx logs` too; the exit record and marker are root's alone
        assert TOKEN in run_as(owner, ["cat", str(logs[0])], timeout=30).stdout
        code, out = spx_as(owner, "--root", str(d.root), "logs", "private", "--attempt", "1")
        assert code == 0 and f"{TOKEN} line 199" in out, out
        assert _denied(owner, ["cat", str(log_dir / "attempt-1.exit")])
        code, out = spx_as(victim, "--root", str(d.root), "logs", "private", "--attempt", "1")
        assert code != 0 and TOKEN not in out, out
        answering(d)  # (b)
    finally:
        d.stop()


def test_the_configured_log_group_reads_the_logs_but_not_the_exit_record(same_primary_group, base):
    owner, victim, group = same_primary_group
    d = start_daemon_with(base, {"log_max_bytes": 4096, "log_group": group.gr_name})
    try:
        log_dir = _run_loud_job(d, owner, "shared")
        logs = [log_dir / "attempt-1.log", log_dir / "attempt-1.log.1"]
        for f in logs:
            st = os.stat(f)
            assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (owner.pw_uid, group.gr_gid, 0o640), f
            assert TOKEN in run_as(victim, ["cat", str(f)], timeout=30).stdout, f
        assert run_as(victim, ["ls", str(log_dir / "attempt-1.ranks")], timeout=30).returncode == 0
        # (a) the exit record and the marker stay root's
        for f in (log_dir / "attempt-1.exit", log_dir / ".job-id"):
            assert _denied(victim, ["cat", str(f)]), f
        answering(d)  # (b)
    finally:
        d.stop()


def start_daemon_with(base: Path, config: dict) -> Daemon:
    return Daemon(base / "root", gpu_backend="none", config=config).start()


# --- root's spx and a socket a user controls ---------------------------------------------------------

# Runs as the planting user: listens on PATH, records every connection's first bytes in RECORD, and
# answers each with an endless reply that never ends its line (but a "sentinel" connection: closed).
SERVER = textwrap.dedent("""
    import socket, sys
    path, record = sys.argv[1], sys.argv[2]
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.listen(64)
    print("listening", flush=True)
    while True:
        c, _ = s.accept()
        data = c.recv(65536)
        with open(record, "a") as f:
            f.write(repr(data) + "\\n")
        if not data.startswith(b"sentinel"):
            try:
                while True:
                    c.sendall(b"x" * 65536)
            except OSError:
                pass
        c.close()
""")


def _plant(owner: pwd.struct_passwd, base: Path, name: str) -> tuple[subprocess.Popen, Path, Path]:
    """`base/NAME/run/spx.sock`, the owner's: a real listening socket in directories the owner made."""
    run = base / name / "run"
    run.mkdir(parents=True)
    for p in (run.parent, run):
        os.chown(p, owner.pw_uid, owner.pw_gid)
    script, record = base / f"{name}-server.py", base / f"{name}-record" / "connections"
    script.write_text(SERVER)
    script.chmod(0o644)
    record.parent.mkdir()
    os.chown(record.parent, owner.pw_uid, owner.pw_gid)
    sock = run / "spx.sock"
    server = subprocess.Popen([PYTHON, str(script), str(sock), str(record)], user=owner.pw_uid, group=owner.pw_gid,
                              extra_groups=os.getgrouplist(owner.pw_name, owner.pw_gid), cwd="/",
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert server.stdout is not None and server.stdout.readline().strip() == "listening"
    return server, sock, record


def _connections(sock: Path, record: Path) -> list[str]:
    """What the planted server recorded, once a sentinel connection made after everything else has
    been recorded (the server accepts in order)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(sock))
        s.sendall(b"sentinel\n")
    wait_for(lambda: record.exists() and "sentinel" in record.read_text(), 10, "the sentinel")
    return [ln for ln in record.read_text().splitlines() if "sentinel" not in ln]


def _stop(server: subprocess.Popen) -> None:
    server.kill()
    server.communicate(timeout=10)


def test_roots_spx_never_connects_to_a_socket_a_user_planted_under_its_cwd(users, base):
    owner, _victim, _group = users
    d = start_daemon(base)
    server, sock, record = _plant(owner, base, "x")
    try:
        # Root, in a directory holding the real daemon's root and the planted socket, forgot --root.
        res = subprocess.run([str(BIN / "spx"), "--root", str(base / "none"), "ls"], cwd=base, capture_output=True,
                             text=True, timeout=60)
        assert res.returncode == 1, res
        assert f"one does on {d.root}/run/spx.sock" in res.stderr, res.stderr  # the trusted one is suggested
        assert f"not asked: {sock}" in res.stderr and "not root's" in res.stderr, res.stderr
        assert _connections(sock, record) == [], "root's spx connected to the user's socket"  # (a)
        answering(d)  # (b)
    finally:
        _stop(server)
        d.stop()


# spx's own peak memory: a small process forks it and reads its rusage. (Measured on a child of the
# test's own process, a fork of a big pytest worker counts that worker's pages as its peak.)
OWN_PEAK = ("import os, sys\npid = os.fork()\nif pid == 0:\n    os.execv(sys.argv[1], sys.argv[1:])\n"
            "_pid, status, usage = os.wait4(pid, 0)\nprint(f'peak_kib={usage.ru_maxrss}', flush=True)\n"
            "sys.exit(os.waitstatus_to_exitcode(status))\n")


def test_an_endless_reply_on_the_configured_socket_is_cut_off_with_an_error(users, base):
    owner, _victim, _group = users
    server, sock, record = _plant(owner, base, "impostor")
    d = start_daemon(base)
    try:
        # Root named that socket itself (--root); whatever answers there is still read with a cap.
        t0 = time.monotonic()
        res = subprocess.run([PYTHON, "-c", OWN_PEAK, str(BIN / "spx"), "--root", str(base / "impostor"), "ls"],
                             cwd="/", capture_output=True, text=True, timeout=60)
        peak_kib = int(res.stdout.split("peak_kib=")[-1])
        assert res.returncode == 1, res.stderr
        assert f"the reply on {sock} is larger than {control.MAX_REPLY >> 20} MiB" in res.stderr, res.stderr
        assert time.monotonic() - t0 < 30
        assert peak_kib < 3 * control.MAX_REPLY // 1024, f"spx grew to {peak_kib} KiB"
        assert len(_connections(sock, record)) == 1  # (a): one request, to the socket root named
        answering(d)  # (b)
    finally:
        _stop(server)
        d.stop()
