"""The queue features on the real daemon (fake 8-GPU backend, tiny `launcher: python` jobs):
dependencies, hold/release, drain (across a restart, in STATUS, `spx top` and /metrics), priority,
and per-user GPU limits with two real users."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from harness import Daemon, as_user, wait_for
from spx.daemon.service import control

SCRIPTS = Path(__file__).resolve().parent.parent / "fixtures" / "scripts"
PY = sys.executable
# Fails its first attempt after a moment, succeeds on the next: a running job that relaunches.
FLAKY_ONCE = "import os, sys, time\ntime.sleep(1.5)\nsys.exit(3 if os.environ['SPX_ATTEMPT'] == '1' else 0)\n"

pytestmark = pytest.mark.slow


def sleeper(name: str, seconds: float, gpus: int = 0, extra: str = "", python: str = PY,
            script: Path = SCRIPTS / "sleep_for.py") -> str:
    return (f"name: {name}\nlauncher: python\nscript: {script}\npython: {python}\nargs: ['{seconds}']\n"
            f"gpus: {gpus}\nstop: {{grace_seconds: 2}}\n{extra}")


@pytest.fixture
def daemon(tmp_path):
    d = Daemon(tmp_path / "root", gpu_backend="fake", log_level="debug").start()  # debug: wait_turns
    yield d
    d.stop()


def queued(d: Daemon, name: str, text: str) -> dict:
    d.drop(f"{name}.yaml", text)
    return wait_for(lambda: d.job(name), 30, f"{name} accepted")


def reason_of(d: Daemon, name: str, contains: str) -> str:
    return wait_for(lambda: (j := d.job(name)) and contains in (j["reason"] or "") and j["reason"], 30,
                    f"{name}'s reason to say {contains!r} (now: {d.job(name)})")


def test_dependencies_start_after_success_and_a_failed_one_fails_its_dependents(daemon):
    d = daemon
    gate = d.root / "prep-may-end"  # prep runs until the test has seen train wait for it
    queued(d, "prep", f"name: prep\nlauncher: python\nscript: {SCRIPTS / 'wait_for_file.py'}\npython: {PY}\n"
                      f"args: ['{gate}']\n")
    d.wait_state("prep", "running", 30)
    queued(d, "train", sleeper("train", 0.1, extra="after: [prep]\n"))
    assert reason_of(d, "train", "waiting for dependency") == "waiting for dependency prep (running)"
    gate.touch()
    queued(d, "broken", f"name: broken\nlauncher: python\nscript: {SCRIPTS / 'always_crash.py'}\npython: {PY}\n"
                        "restart: {max_restarts: 0, on_failure: {user-code: counted}}\n")
    queued(d, "eval", sleeper("eval", 0.1, extra="after: [train, broken]\n"))
    d.wait_state("train", "succeeded", 60)
    prep, train = d.status("prep"), d.status("train")
    assert train["history"][0]["start"] >= prep["history"][0]["end"], "train started only after prep ended"
    d.wait_state("eval", "failed", 60)
    broken = d.status("broken")
    assert d.status("eval")["reason"] == f"dependency broken failed: {broken['reason']}"
    assert d.status("eval")["history"] == [], "a job whose dependency failed never starts"
    # An unknown name is refused at intake, next to the file, as sbatch refuses an unknown job id.
    d.drop("typo.yaml", sleeper("typo", 0.1, extra="after: [nope]\n"))
    error = wait_for(lambda: (p := d.spool / "rejected" / "typo.yaml.error").exists() and p.read_text(), 30,
                     "the rejection")
    assert "after: no job named 'nope'" in error and d.job("typo") is None
    # Through `spx submit`, the rejection is said of the user's file, not of the spool's copy.
    job_file = d.root / "typo2.yaml"
    job_file.write_text(sleeper("typo2", 0.1, extra="after: [nope]\n"))
    refused = d.spx("submit", str(job_file), check=False)
    assert refused.returncode == 1 and refused.stderr.startswith(f"{job_file}: rejected "), refused.stderr
    assert "after: no job named 'nope'" in refused.stderr, refused.stderr


def test_a_held_job_does_not_start_until_released(daemon):
    d = daemon
    queued(d, "first", sleeper("first", 60, gpus=8))
    d.wait_state("first", "running", 30)
    queued(d, "second", sleeper("second", 0.1, gpus=1))
    assert "held" in d.spx("hold", "second").stdout
    d.spx("cancel", "first")
    d.wait_state("first", "cancelled", 30)
    d.wait_turns()  # the GPUs are free: a whole turn of the scheduler since would start a job not held
    assert d.job("second")["state"] == "queued"
    assert reason_of(d, "second", "held by") == "held by root (spx release second)"
    assert "held by root" in d.spx("top", "--once").stdout
    refused = d.spx("hold", "first", check=False)
    assert refused.returncode == 1 and "only a queued job can be held" in refused.stderr
    d.spx("release", "second")
    d.wait_state("second", "succeeded", 60)
    assert d.spx("release", "second", check=False).returncode == 1


def _status_lines(sock: socket.socket, seconds: float = 3.0) -> list[str]:
    """The STATUS lines the daemon sends within `seconds` (it sends one every 2 s) after those queued."""
    out: list[str] = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            data = sock.recv(4096)
        except TimeoutError:
            break
        fields = dict(line.split("=", 1) for line in data.decode().split("\n") if "=" in line)
        if "STATUS" in fields:
            out.append(fields["STATUS"])
    return out


def _metrics(d: Daemon) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{d.metrics_port}/metrics", timeout=10).read().decode()


def test_drain_keeps_new_jobs_queued_lets_running_ones_relaunch_and_survives_a_restart(tmp_path):
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    flaky = tmp_path / "flaky_once.py"
    flaky.write_text(FLAKY_ONCE)
    d = Daemon(tmp_path / "root", gpu_backend="fake", env={"NOTIFY_SOCKET": str(tmp_path / "notify")}).start()
    try:
        d.drop("flaky.yaml", f"name: flaky\nlauncher: python\nscript: {flaky}\npython: {PY}\ngpus: 2\n"
                             "restart: {max_restarts: 2, backoff_seconds: [0.5, 1], on_failure: {user-code: counted}}\n")
        d.wait_state("flaky", "running", 30)
        assert "drained" in d.spx("drain").stdout
        queued(d, "later", sleeper("later", 0.1))
        d.wait_state("flaky", "succeeded", 60)
        assert d.job("flaky")["attempts"] == 2, "the running job relaunched after its failure during the drain"
        assert "the host is drained (by root" in reason_of(d, "later", "drained")
        assert _status_lines(notify)[-1].startswith("DRAINED (by root")
        assert "spx_queue_drained 1.0" in _metrics(d)
        assert "! DRAINED (by root" in d.spx("top", "--once").stdout
        d.stop()
        d.start()
        assert d.job("later")["state"] == "queued" and "spx_queue_drained 1.0" in _metrics(d)
        assert "already drained" in d.spx("drain").stdout
        d.spx("undrain")
        d.wait_state("later", "succeeded", 60)
        assert "spx_queue_drained 0.0" in _metrics(d)
        assert not _status_lines(notify)[-1].startswith("DRAINED")
    finally:
        d.stop()
        notify.close()


def test_priority_reorders_the_queue(daemon):
    d = daemon
    queued(d, "blocker", sleeper("blocker", 60, gpus=8))
    d.wait_state("blocker", "running", 30)
    queued(d, "low", sleeper("low", 1, gpus=8))
    queued(d, "urgent", sleeper("urgent", 1, gpus=8))
    assert reason_of(d, "urgent", "waiting behind") == "waiting behind an earlier job that waits for GPUs (no backfill)"
    assert "priority 0 -> 10" in d.spx("priority", "urgent", "10").stdout
    d.spx("cancel", "blocker")
    d.wait_state("low", "succeeded", 90)
    assert d.status("urgent")["history"][0]["start"] < d.status("low")["history"][0]["start"]


# --- two real users -------------------------------------------------------------------------------------

USERS = ("spx-test-qa", "spx-test-qb")


@pytest.fixture(scope="module")
def users():
    if os.getuid() != 0:
        pytest.skip("needs root: creates users and runs jobs as them")
    created = []
    for name in USERS:
        try:
            pwd.getpwnam(name)
        except KeyError:
            subprocess.run(["useradd", "-m", "-s", "/bin/sh", name], check=True)
            created.append(name)
    yield [pwd.getpwnam(n) for n in USERS]
    for name in created:
        subprocess.run(["userdel", "-r", name], check=False, capture_output=True)


def test_per_user_gpu_limit_makes_a_users_second_job_wait_while_another_user_starts(users):
    alice, bob = users
    base = Path(tempfile.mkdtemp(prefix="spx-queue-", dir="/var/tmp"))
    base.chmod(0o755)
    d = Daemon(base / "root", gpu_backend="fake", config={"limits": {"gpus_per_user": 4}}).start()
    sock = d.root / "run" / "spx.sock"
    try:
        def drop_as(user: pwd.struct_passwd, name: str, seconds: float, gpus: int) -> None:
            script = Path(user.pw_dir) / "sleep_for.py"
            shutil.copy(SCRIPTS / "sleep_for.py", script)
            tmp = d.spool / f".{name}.tmp"
            tmp.write_text(sleeper(name, seconds, gpus, python="/usr/bin/python3", script=script))
            os.chown(tmp, user.pw_uid, user.pw_gid)
            os.rename(tmp, d.spool / name)
            wait_for(lambda: d.job(name), 30, f"{name} accepted")

        drop_as(alice, "a-first", 600, 4)  # holds alice's 4 GPUs until it is cancelled below
        d.wait_state("a-first", "running", 30)
        drop_as(alice, "a-second", 0.1, 2)
        drop_as(alice, "a-huge", 0.1, 6)
        drop_as(bob, "b-first", 0.1, 2)
        d.wait_state("b-first", "succeeded", 60)
        assert d.job("a-second")["state"] == "queued"
        assert d.job("a-second")["reason"] == "waiting: spx-test-qa's GPU limit (4, default): 4 in use, this job asks 2"
        assert reason_of(d, "a-huge", "more than") == ("waiting: asks 6 GPUs, more than spx-test-qa's limit of 4 "
                                                        "(default); it starts only once the limit is raised")
        # The owner holds and releases their own job; another user cannot touch it; priority is root's.
        assert as_user(alice, lambda: control.request(sock, "hold", "a-second"))["ok"] is True
        assert as_user(bob, lambda: control.request(sock, "release", "a-second"))["error"] == "no job named 'a-second'"
        assert as_user(alice, lambda: control.request(sock, "release", "a-second"))["ok"] is True
        refused = as_user(alice, lambda: control.request(sock, "priority", "a-second", arg="5"))
        assert refused["ok"] is False and "needs root or the admin group" in refused["error"]
        assert as_user(alice, lambda: control.request(sock, "drain"))["error"] == "drain needs root or the admin group"
        d.spx("cancel", "a-first")
        d.wait_state("a-second", "succeeded", 60)  # once a-first ended and freed alice's 4 GPUs
        assert d.job("a-huge")["state"] == "queued", "over its limit alone: it waits, never fails"
        d.spx("cancel", "a-huge")
    finally:
        d.stop()
        shutil.rmtree(base, ignore_errors=True)
