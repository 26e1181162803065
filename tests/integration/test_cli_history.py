"""`spx` conventions against a real daemon (fake GPUs, tiny `launcher: python` jobs): `spx submit
--check`, `--parsable` and `--json` with `--root` after the command, `spx history` of a job that
restarted once (attempts, GPU-hours, and its attempts' peak memory where the daemon manages cgroups
with a memory controller), and `spx status` into a closed pipe."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from scratch_cgroup import scratch_cgroup

from harness import BIN, Daemon

PY = sys.executable
# Fails its first attempt, succeeds on the next: a job with two attempts to account for.
FLAKY_ONCE = "import os, sys, time\ntime.sleep(0.5)\nsys.exit(3 if os.environ['SPX_ATTEMPT'] == '1' else 0)\n"

pytestmark = pytest.mark.slow


def spx(*args: str, stdout=subprocess.PIPE, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "spx"), *args], stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=timeout)


def project(tmp_path: Path, name: str, gpus: int = 2) -> Path:
    """A user's project: the script next to its job file, the workdir named relative to it."""
    proj = tmp_path / "proj"
    proj.mkdir(exist_ok=True)
    (proj / "flaky.py").write_text(FLAKY_ONCE)
    job = proj / f"{name}.yaml"
    job.write_text(f"name: {name}\nlauncher: python\nworkdir: .\nscript: flaky.py\npython: {PY}\n"
                   f"gpus: {gpus}\n"
                   "restart: {max_restarts: 3, backoff_seconds: [0.5, 1]}\nstop: {grace_seconds: 2}\n")
    return job


@pytest.fixture
def daemon(tmp_path):
    d = Daemon(tmp_path / "root", gpu_backend="fake").start()
    yield d
    d.stop()


def test_submit_check_parsable_and_json_then_history_of_a_restarted_job(daemon, tmp_path):
    d, root = daemon, str(daemon.root)
    job = project(tmp_path, "flaky")

    check = spx("submit", "--check", str(job), "--root", root)
    assert check.returncode == 0, check.stderr
    recorded = yaml.safe_load(check.stdout)  # the comment lines (what it would do) are YAML comments
    assert recorded["name"] == "flaky" and recorded["script"] == "flaky.py" and recorded["workdir"] == str(job.parent)
    assert recorded["checkpoints"]["dir"] == str(d.checkpoint_dir("flaky"))
    assert f"#   run:         {PY} flaky.py" in check.stdout and "valid" in check.stderr
    as_json = json.loads(spx("submit", "--check", "--json", str(job), "--root", root).stdout)
    assert as_json["valid"] and as_json["problems"] == [] and as_json["plan"]["gpus"] == 2
    assert not [p for p in d.spool.iterdir() if p.is_file()], "--check submits nothing"

    missing = job.with_name("missing.yaml")
    missing.write_text(job.read_text().replace("flaky.py", "nowhere.py").replace("name: flaky", "name: missing"))
    refused = spx("submit", "--check", str(missing), "--root", root)
    assert refused.returncode == 1 and "the daemon would reject it: script:" in refused.stderr
    broken = job.with_name("broken.yaml")
    broken.write_text("name: broken\nlauncher: python\nscript: flaky.py\ngpus: lots\n")
    assert spx("submit", "--check", str(broken), "--root", root).returncode == 2

    parsable = spx("submit", "--parsable", str(job), "--root", root)
    assert parsable.returncode == 0, parsable.stderr
    job_id = int(parsable.stdout)  # the id alone, as sbatch --parsable
    assert d.status("flaky")["job_id"] == job_id

    second = project(tmp_path, "second", gpus=1)
    answer = json.loads(spx("--root", root, "submit", "--json", str(second)).stdout)
    assert answer["name"] == "second" and answer["job_id"] == d.status("second")["job_id"] != job_id
    assert answer["state"] in {"queued", "starting", "running"} and answer["owner"]

    for name in ("flaky", "second"):
        d.wait_state(name, "succeeded", 60)
    records = json.loads(d.spx("history", "--since", "all", "--json").stdout)
    (flaky,) = [r for r in records if r["name"] == "flaky"]
    assert (flaky["job_id"], flaky["state"], flaky["attempts"], flaky["gpus"]) == (job_id, "succeeded", 2, 2)
    first, last = flaky["history"]
    assert first["reason_class"] == "crash" and first["end"] <= last["start"]
    on_gpus = sum(a["end"] - a["start"] for a in flaky["history"]) * 2 / 3600
    assert flaky["gpu_hours"] == pytest.approx(on_gpus, abs=1e-5) and flaky["gpu_hours"] > 0
    assert flaky["start"] == first["start"] and flaky["end"] == last["end"]
    assert flaky["elapsed_seconds"] == pytest.approx(last["end"] - first["start"], abs=1e-3)  # backoff included

    only = json.loads(d.spx("history", "--since", "all", "--state", "succeeded", "--user", "no-such-user",
                            "--json").stdout)
    assert only == []
    table = d.spx("history", "--since", "all", "--attempts").stdout.splitlines()
    assert table[0].split()[:4] == ["JOB", "NAME", "STATE", "USER"]
    assert [line.split()[:3] for line in table if "attempt" in line and "flaky" not in line][:2] == [
        ["attempt", "1", "crash"], ["attempt", "2", "ok"]]


def test_status_into_a_closed_pipe_ends_quietly(daemon, tmp_path):
    daemon.spx("submit", str(project(tmp_path, "piped")))
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader left before spx wrote its first line (`spx status piped | head -0`)
    try:
        res = spx("--root", str(daemon.root), "status", "piped", stdout=write_end)
    finally:
        os.close(write_end)
    assert (res.returncode, res.stderr) == (141, "")


def test_history_shows_each_attempts_peak_memory_where_cgroups_are_managed(tmp_path):
    with scratch_cgroup() as cg:
        d = Daemon(tmp_path / "root", gpu_backend="fake", config={"cgroups": "on"}, cgroup=cg).start()
        try:
            why = d.events("cgroups")[-1]["reason"]
            d.spx("submit", str(project(tmp_path, "measured", gpus=0)))
            d.wait_state("measured", "succeeded", 60)
            (rec,) = [r for r in json.loads(d.spx("history", "--json").stdout) if r["name"] == "measured"]
        finally:
            d.stop()
    peaks = [a["memory_peak_bytes"] for a in rec["history"]]
    if "memory" in (cg.parent / "cgroup.controllers").read_text().split():
        # A Python interpreter's high-water mark: megabytes, not zero, not the host's memory.
        assert all(p is not None and 1 << 20 < p < 1 << 33 for p in peaks), peaks
        assert rec["memory_peak_bytes"] == max(peaks)
    else:  # this host's memory controller is bound elsewhere (cgroup v1): said at start, never guessed
        assert "memory.peak not measured" in why, why
        assert peaks == [None, None] and rec["memory_peak_bytes"] is None
