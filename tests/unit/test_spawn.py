"""launcher.spawn through the exec shim, with real processes: the attempt starts in its cgroup, as
the job's user, with exactly the planned environment; failures come back as launch errors."""

from __future__ import annotations

import errno
import os
import pwd
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from scratch_cgroup import cgroup_of, scratch_cgroup

from harness import wait_for
from spx.daemon.run import launcher
from spx.daemon.run.launcher import LaunchPlan


def proc_status(pid: int) -> dict[str, str]:
    text = Path(f"/proc/{pid}/status").read_text()
    return dict(ln.split(":\t", 1) for ln in text.splitlines() if ":\t" in ln)


def stop(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait()


@pytest.fixture
def nobody() -> pwd.struct_passwd:
    if os.geteuid() != 0:
        pytest.skip("needs root: spawns as another user")
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user 'nobody' on this machine")


def test_attempt_starts_in_its_cgroup_as_the_owner_with_exactly_the_planned_environment(tmp_path, nobody):
    # LANG=C: a Python shim that passed on its own environment would add LC_CTYPE=C.UTF-8 (PEP 538).
    env = {"PATH": launcher.SAFE_PATH, "LANG": "C", "SPX_ATTEMPT_ID": "abc", "LD_PRELOAD": ""}
    plan = LaunchPlan(argv=["sleep", "300"], env=env, cwd="/")
    with scratch_cgroup() as cg:
        proc = launcher.spawn(plan, nobody.pw_uid, tmp_path / "attempt.log", cgroup=cg)
        try:
            # spawn returns once exec is past its point of no return; comm changes a moment later
            wait_for(lambda: Path(f"/proc/{proc.pid}/comm").read_text().strip() == "sleep", 5, "the exec")
            assert cgroup_of(proc.pid) == cg
            status = proc_status(proc.pid)
            assert status["Uid"].split() == [str(nobody.pw_uid)] * 4
            assert status["Gid"].split() == [str(nobody.pw_gid)] * 4
            assert sorted(map(int, status["Groups"].split())) == sorted(set(os.getgrouplist("nobody", nobody.pw_gid)))
            assert status["Umask"] == "0022"
            ignored = int(status["SigIgn"], 16)
            assert not ignored & (1 << (signal.SIGPIPE - 1)) and not ignored & (1 << (signal.SIGXFSZ - 1))
            assert os.getsid(proc.pid) == os.getpgid(proc.pid) == proc.pid, "a new session: one process group"
            environ = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")[:-1]
            assert dict(e.decode().split("=", 1) for e in environ) == env
            assert os.readlink(f"/proc/{proc.pid}/cwd") == "/"
        finally:
            stop(proc)


def test_without_a_cgroup_the_attempt_stays_in_the_daemons_and_runs_in_its_workdir(tmp_path):
    plan = LaunchPlan(argv=[sys.executable, "-c", "import os; print(os.getcwd())"], env={"PATH": "/usr/bin"},
                      cwd=str(tmp_path))
    proc = launcher.spawn(plan, os.getuid(), tmp_path / "attempt.log")
    assert proc.wait(timeout=30) == 0
    assert (tmp_path / "attempt.log").read_text().strip() == str(tmp_path)


def test_an_argv_that_cannot_be_exec_d_is_a_launch_error_as_with_subprocess(tmp_path):
    plan = LaunchPlan(argv=["/nonexistent/python", "train.py"], env={"PATH": "/usr/bin"}, cwd="/")
    with pytest.raises(OSError) as err:
        launcher.spawn(plan, os.getuid(), tmp_path / "attempt.log")
    assert err.value.errno == errno.ENOENT
    assert str(err.value) == "[Errno 2] No such file or directory: '/nonexistent/python'"
    assert "cannot start the attempt (exec)" in (tmp_path / "attempt.log").read_text()


def test_a_cgroup_that_cannot_be_entered_is_a_launch_error_and_nothing_runs(tmp_path):
    marker = tmp_path / "ran"
    plan = LaunchPlan(argv=["touch", str(marker)], env={"PATH": "/usr/bin:/bin"}, cwd="/")
    with pytest.raises(OSError, match="cgroup: No such file or directory"):
        launcher.spawn(plan, os.getuid(), tmp_path / "attempt.log", cgroup=tmp_path / "no-such-cgroup")
    assert not marker.exists()


def test_the_shim_ignores_the_jobs_python_variables_while_it_is_root(tmp_path):
    # The job's PYTHONPATH (or its workdir) must not put code into the shim, which is root until exec.
    (tmp_path / "json.py").write_text(f"open({str(tmp_path / 'pwned')!r}, 'w').close()\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)}
    proc = launcher.spawn(LaunchPlan(argv=["true"], env=env, cwd=str(tmp_path)), os.getuid(), tmp_path / "a.log")
    assert proc.wait(timeout=30) == 0
    assert not (tmp_path / "pwned").exists()
