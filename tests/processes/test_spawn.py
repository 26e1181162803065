"""launcher.spawn through the exec shim, with real processes: the attempt starts in its cgroup, as
the job's user, with exactly the planned environment, its output through the log relay; failures come
back as launch errors."""

from __future__ import annotations

import errno
import os
import pwd
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from scratch_cgroup import cgroup_of, scratch_cgroup

from harness import wait_for
from spx.daemon.run import launcher
from spx.daemon.run.launcher import LaunchPlan


def proc_status(pid: int) -> dict[str, str]:
    text = Path(f"/proc/{pid}/status").read_text()
    return dict(ln.split(":\t", 1) for ln in text.splitlines() if ":\t" in ln)


MIB = 1024 * 1024


def spawn(plan: LaunchPlan, uid: int, log: Path, cgroup: Path | None = None,
          max_log_bytes: int = MIB) -> launcher.Spawned:
    fd = os.open(log.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return launcher.spawn(plan, uid, fd, log.name, cgroup, max_log_bytes)
    finally:
        os.close(fd)


def stop(spawned: launcher.Spawned) -> None:
    os.killpg(spawned.proc.pid, signal.SIGKILL)  # the attempt's group, as the daemon stops it
    spawned.proc.wait()
    spawned.relay.wait(timeout=30)


def attempt_pid(spawned: launcher.Spawned) -> int:
    """The launcher: the monitor's one child."""
    pid = spawned.proc.pid
    kids = wait_for(lambda: Path(f"/proc/{pid}/task/{pid}/children").read_text().split(), 5, "the monitor's child")
    assert len(kids) == 1
    return int(kids[0])


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
        spawned = spawn(plan, nobody.pw_uid, tmp_path / "attempt.log", cgroup=cg)
        monitor, pid = spawned.proc.pid, attempt_pid(spawned)
        try:
            # spawn returns once exec is past its point of no return; comm changes a moment later
            wait_for(lambda: Path(f"/proc/{pid}/comm").read_text().strip() == "sleep", 5, "the exec")
            assert cgroup_of(pid) == cg
            status = proc_status(pid)
            assert status["Uid"].split() == [str(nobody.pw_uid)] * 4
            assert status["Gid"].split() == [str(nobody.pw_gid)] * 4
            assert sorted(map(int, status["Groups"].split())) == sorted(set(os.getgrouplist("nobody", nobody.pw_gid)))
            assert status["Umask"] == "0022"
            ignored = int(status["SigIgn"], 16)
            for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                assert not ignored & (1 << (sig - 1)), f"{sig.name} ignored in the job"
            assert os.getsid(pid) == os.getpgid(pid) == monitor == os.getsid(monitor), \
                "a new session (one process group) led by the attempt's monitor"
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")[:-1]
            assert dict(e.decode().split("=", 1) for e in environ) == env
            assert os.readlink(f"/proc/{pid}/cwd") == "/"
        finally:
            stop(spawned)


def test_without_a_cgroup_the_attempt_stays_in_the_daemons_and_runs_in_its_workdir(tmp_path):
    plan = LaunchPlan(argv=[sys.executable, "-c", "import os; print(os.getcwd())"], env={"PATH": "/usr/bin"},
                      cwd=str(tmp_path))
    spawned = spawn(plan, os.getuid(), tmp_path / "attempt.log")
    assert spawned.proc.wait(timeout=30) == 0
    assert spawned.relay.wait(timeout=30) == 0, "the relay exits once the attempt's output ends"
    assert (tmp_path / "attempt.log").read_text().strip() == str(tmp_path)


def test_an_argv_that_cannot_be_exec_d_is_a_launch_error_as_with_subprocess(tmp_path):
    plan = LaunchPlan(argv=["/nonexistent/python", "train.py"], env={"PATH": "/usr/bin"}, cwd="/")
    with pytest.raises(OSError) as err:
        spawn(plan, os.getuid(), tmp_path / "attempt.log")
    assert err.value.errno == errno.ENOENT
    assert str(err.value) == "[Errno 2] No such file or directory: '/nonexistent/python'"
    assert "cannot start the attempt (exec)" in (tmp_path / "attempt.log").read_text()


def test_a_cgroup_that_cannot_be_entered_is_a_launch_error_and_nothing_runs(tmp_path):
    marker = tmp_path / "ran"
    plan = LaunchPlan(argv=["touch", str(marker)], env={"PATH": "/usr/bin:/bin"}, cwd="/")
    with pytest.raises(OSError, match="cgroup: No such file or directory"):
        spawn(plan, os.getuid(), tmp_path / "attempt.log", cgroup=tmp_path / "no-such-cgroup")
    assert not marker.exists()


def test_the_shim_ignores_the_jobs_python_variables_while_it_is_root(tmp_path):
    # The job's PYTHONPATH (or its workdir) must not put code into the shim, which is root until exec.
    (tmp_path / "json.py").write_text(f"open({str(tmp_path / 'pwned')!r}, 'w').close()\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)}
    spawned = spawn(LaunchPlan(argv=["true"], env=env, cwd=str(tmp_path)), os.getuid(), tmp_path / "a.log")
    assert spawned.proc.wait(timeout=30) == 0
    spawned.relay.wait(timeout=30)
    assert not (tmp_path / "pwned").exists()


def test_the_relay_survives_a_group_kill_of_the_attempt_and_keeps_its_last_words(tmp_path):
    # The attempt's last line is written just before the whole process group is SIGKILLed: the relay,
    # in its own session, still gets it into the log, then exits at EOF.
    script = "import os, signal, sys; print('last words', flush=True); os.killpg(0, signal.SIGKILL)"
    spawned = spawn(LaunchPlan(argv=[sys.executable, "-c", script], env={"PATH": "/usr/bin"}, cwd="/"),
                    os.getuid(), tmp_path / "attempt.log")
    assert spawned.proc.wait(timeout=30) == -signal.SIGKILL
    assert spawned.relay.wait(timeout=30) == 0
    assert (tmp_path / "attempt.log").read_text() == "last words\n"


def test_the_log_belongs_to_the_owner_and_is_capped(tmp_path, nobody):
    tmp_path.chmod(0o755)
    script = "import sys\nfor i in range(4000): sys.stdout.write(f'{i:07d} ' + 'x' * 92 + '\\n')"
    # The system's python: the test venv may not be readable by nobody.
    plan = LaunchPlan(argv=["python3", "-c", script], env={"PATH": "/usr/bin:/bin"}, cwd="/")
    spawned = spawn(plan, nobody.pw_uid, tmp_path / "attempt.log", max_log_bytes=64 * 1024)
    assert spawned.proc.wait(timeout=30) == 0
    assert spawned.relay.wait(timeout=30) == 0
    log, old = tmp_path / "attempt.log", tmp_path / "attempt.log.1"
    for f in (log, old):  # the owner's alone: not their primary group's (on many hosts, everyone's)
        st = f.stat()
        assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (nobody.pw_uid, nobody.pw_gid, 0o600)
        assert st.st_size <= 64 * 1024
    assert log.read_text().splitlines()[-1].startswith("0003999 "), "the newest output is in the log"


def script_plan(script: str, attempt_id: str = "a1") -> LaunchPlan:
    return LaunchPlan(argv=[sys.executable, "-c", script], env={"PATH": "/usr/bin", "SPX_ATTEMPT_ID": attempt_id},
                      cwd="/")


def ended_since(record: launcher.ExitRecord | None, since: float) -> launcher.ExitRecord:
    """The record, its end time checked (between `since` and now) and left out for comparison."""
    assert record is not None and record.ended is not None and since <= record.ended <= time.time()
    return replace(record, ended=None)


def test_the_monitor_records_the_exit_and_ends_as_the_launcher_did(tmp_path):
    t0 = time.time()
    spawned = spawn(script_plan("import sys; sys.exit(7)"), os.getuid(), tmp_path / "attempt-1.log")
    assert spawned.proc.wait(timeout=30) == 7
    spawned.relay.wait(timeout=30)
    record = launcher.recorded_exit(tmp_path, "attempt-1.log", "a1")
    assert ended_since(record, t0) == launcher.ExitRecord(True, 7, None, stopped=False)
    assert launcher.recorded_exit(tmp_path, "attempt-1.log", "another-attempt") is None
    assert not list(tmp_path.glob(".*tmp*")), "the record is renamed into place"
    st = (tmp_path / "attempt-1.exit").stat()
    assert (st.st_uid, st.st_mode & 0o777) == (os.getuid(), 0o600), "the record is the daemon's alone"


def test_a_stop_of_the_group_reaches_the_job_and_the_monitor_records_it(tmp_path):
    script = "import time; print('up', flush=True); time.sleep(300)"
    spawned = spawn(script_plan(script, "a2"), os.getuid(), tmp_path / "attempt-2.log")
    wait_for(lambda: (tmp_path / "attempt-2.log").exists() and (tmp_path / "attempt-2.log").read_text() == "up\n",
             10, "the job")
    # A stop that finds the attempt by its tag, not its group: each tagged pid in turn, in pid order
    # (proctree.signal_attempt), so the monitor, the older process, first. The other order raced: the
    # job could end and its monitor record that before the monitor's own signal came.
    os.kill(spawned.proc.pid, signal.SIGTERM)
    os.kill(attempt_pid(spawned), signal.SIGTERM)
    assert spawned.proc.wait(timeout=30) == -signal.SIGTERM, "the monitor ends by the job's signal"
    spawned.relay.wait(timeout=30)
    record = launcher.recorded_exit(tmp_path, "attempt-2.log", "a2")
    assert ended_since(record, 0) == launcher.ExitRecord(True, None, signal.SIGTERM, stopped=True)


def test_the_exit_is_recorded_while_no_daemon_watches(tmp_path):
    # The daemon (here: this test) is gone as far as the attempt knows: nobody waits for the monitor
    # until after the launcher has ended, and the record is what tells the next daemon how.
    spawned = spawn(script_plan("import time; time.sleep(0.5)", "a3"), os.getuid(), tmp_path / "attempt-3.log")
    wait_for(lambda: launcher.recorded_exit(tmp_path, "attempt-3.log", "a3") is not None, 30, "the exit record")
    assert ended_since(launcher.recorded_exit(tmp_path, "attempt-3.log", "a3"), 0) == launcher.ExitRecord(True, 0, None, stopped=False)
    assert spawned.proc.wait(timeout=30) == 0
    spawned.relay.wait(timeout=30)


def test_a_launch_that_failed_is_recorded_as_not_launched(tmp_path):
    plan = LaunchPlan(argv=["/nonexistent/python"], env={"PATH": "/usr/bin", "SPX_ATTEMPT_ID": "a4"}, cwd="/")
    with pytest.raises(OSError):
        spawn(plan, os.getuid(), tmp_path / "attempt-4.log")
    record = wait_for(lambda: launcher.recorded_exit(tmp_path, "attempt-4.log", "a4"), 10, "the exit record")
    assert ended_since(record, 0) == launcher.ExitRecord(False, 127, None, stopped=False), "the shim's exit is no job's"
