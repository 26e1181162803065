"""A new user's first minutes from a checkout, with `--root` given on each command (the README's try
section, which sets SPX_ROOT instead, runs as written in test_readme_try.py): the daemon's fixture
faults, a forgotten --root, an earlier job's logs, and cancelling a job while following its log."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from harness import BIN, Daemon, wait_for

REPO = Path(__file__).resolve().parents[2]


def test_fake_backend_says_once_that_its_faults_are_the_fixtures(tmp_path):
    d = Daemon(tmp_path / "spx-root", gpu_backend="fake").start()
    try:
        d.wait_event("gpu_xid", timeout=10)
    finally:
        d.stop()
    [said] = d.events("gpu_fake_fixture_faults")
    assert said["faults"] == ["GPU 3: NVLink link 7 down", "GPU 3: XID 79 at 0 s, then every 300 s"]
    assert all(e["level"] == "info" and e["simulated"] for e in d.events("gpu_xid"))
    assert not [e for e in d.lines if e.get("level") in ("warning", "error") and "gpu" in e.get("event", "")]


def test_forgetting_root_names_the_socket_tried_and_the_root_that_answers(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "SPX_ROOT"}
    alone = subprocess.run([str(BIN / "spx"), "ls"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert alone.returncode == 1
    assert "no answer on /run/spx/spx.sock" in alone.stderr and "--root DIR" in alone.stderr and "SPX_ROOT" in alone.stderr
    d = Daemon(tmp_path / "spx-root").start()
    try:
        found = subprocess.run([str(BIN / "spx"), "ls"], cwd=tmp_path, env=env, capture_output=True, text=True)
    finally:
        d.stop()
    assert found.returncode == 1
    assert f"one does on {tmp_path}/spx-root/run/spx.sock" in found.stderr
    assert f"spx --root {tmp_path}/spx-root" in found.stderr and f"SPX_ROOT={tmp_path}/spx-root" in found.stderr


def test_logs_of_an_earlier_job_of_a_reused_name(tmp_path):
    (tmp_path / "say.py").write_text("import os\nprint('run of job', os.environ['SPX_ATTEMPT'], open('n').read())\n")
    d = Daemon(tmp_path / "spx-root").start()
    try:
        ids = []
        for n in ("first", "second"):
            (tmp_path / "n").write_text(n)
            job = tmp_path / f"{n}.yaml"
            job.write_text(f"name: reused\nlauncher: python\nscript: say.py\nworkdir: {tmp_path}\n")
            d.spx("submit", str(job))
            ids.append(d.wait_state("reused", "succeeded", 60)["job_id"])
        assert ids[0] != ids[1]
        assert "run of job 1 second" in d.spx("logs", "reused").stdout
        assert "run of job 1 first" in d.spx("logs", "reused", "--job-id", str(ids[0]), "--attempt", "1").stdout
        missing = d.spx("logs", "reused", "--attempt", "2", check=False)
        assert missing.returncode == 1
        assert f"{d.root}/log/reused.job-{ids[0]} (1 attempt(s))" in missing.stderr
        assert "spx logs reused --job-id ID --attempt N" in missing.stderr
        unknown = d.spx("logs", "reused", "--job-id", "999", check=False)
        assert unknown.returncode == 1 and "spx ls --all" in unknown.stderr
    finally:
        d.stop()


# The commands of a first session that gives `--root` on each (what the README showed before the try
# section set SPX_ROOT): start, submit, list, status, follow attempt 2, cancel, top, doctor.
FIRST_MINUTES = [
    "spx-trainer --root ./spx-root --gpu-backend fake",
    "spx --root ./spx-root submit examples/jobs/ddp-crash-resume.yaml",
    "spx --root ./spx-root ls",
    "spx --root ./spx-root status ddp-crash-resume",
    "spx --root ./spx-root logs ddp-crash-resume --attempt 2 -f",
    "spx --root ./spx-root cancel ddp-crash-resume",
    "spx --root ./spx-root top",
    "spx doctor",
]


def as_argv(line: str) -> list[str]:
    """`spx …`/`spx-trainer …` from this venv (a fresh checkout has them in .venv/bin)."""
    argv = shlex.split(line)
    return [str(BIN / argv[0]), *argv[1:]]


@pytest.mark.slow
def test_first_minutes_with_root_on_each_command_from_a_checkout(tmp_path):
    """A new user's first minutes, in a scratch copy of the checkout: start the daemon, submit the
    example job (relative paths, as written), list it, see its crash and root cause, follow attempt
    2's log while cancelling it, look at top and doctor. The daemon's metrics listen on a free port
    (`--metrics-address 127.0.0.1:0`), so a test run never collides with a daemon on 9101."""
    checkout = tmp_path / "checkout"
    shutil.copytree(REPO / "examples", checkout / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    start, submit, ls, status, logs, cancel, top, doctor = FIRST_MINUTES
    env = {k: v for k, v in os.environ.items() if k != "SPX_ROOT"}

    def run(line: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(as_argv(line), cwd=checkout, env=env, capture_output=True, text=True, timeout=timeout)

    def job() -> dict:
        res = run(f"{status} --json")
        return json.loads(res.stdout) if res.stdout.strip() else {}

    daemon_log = (tmp_path / "daemon.log").open("w")
    daemon = subprocess.Popen([*as_argv(start), "--metrics-address", "127.0.0.1:0"], cwd=checkout, env=env,
                              stdout=daemon_log, stderr=subprocess.STDOUT)
    follower = None
    try:
        wait_for(lambda: (checkout / "spx-root" / "run" / "spx.sock").exists(), 60, "the daemon's socket")
        res = run(submit)
        assert res.returncode == 0 and res.stdout.startswith("ddp-crash-resume: "), res.stderr + res.stdout
        res = run(ls)
        assert res.returncode == 0 and "ddp-crash-resume" in res.stdout, res.stderr

        wait_for(lambda: (j := job()).get("attempts", 0) >= 2 and j["state"] == "running", 120, "attempt 2 running")
        res = run(status)
        assert res.returncode == 0, res.stderr
        assert "InjectedCrash: injected crash at step 25" in res.stdout, res.stdout  # the root cause (item 2)
        assert "resumed from step 20" in res.stdout, res.stdout

        follower = subprocess.Popen(as_argv(logs), cwd=checkout, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
        wait_for(lambda: (job().get("last_checkpoint_step") or 0) >= 30, 120, "attempt 2's checkpoint at step 30")
        res = run(cancel)
        assert res.returncode == 0 and "SIGTERM" in res.stdout, res.stderr + res.stdout
        out, err = follower.communicate(timeout=90)  # -f ends when the job does
        assert follower.returncode == 0 and "[default0]" in out and "step" in out, err
        follower = None

        wait_for(lambda: job().get("state") == "cancelled", 60, "the job cancelled")
        res = run(status)
        attempt2 = next(line for line in res.stdout.splitlines() if "attempt 2:" in line)
        assert re.search(r"cancelled by root at \d\d:\d\d:\d\d \(checkpoint at step \d+\)", attempt2), res.stdout
        assert res.stdout.count("root cause:") == 1, res.stdout  # attempt 1's crash only, not the cancel

        res = run(top)
        assert res.returncode == 0 and "8 GPUs" in res.stdout.splitlines()[0], res.stderr + res.stdout
        res = run(doctor, timeout=300)
        assert res.returncode in (0, 1) and "host" in res.stdout and "Traceback" not in res.stderr, res.stderr
    finally:
        if follower is not None:
            follower.kill()
            follower.communicate()
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=120)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        daemon_log.close()
