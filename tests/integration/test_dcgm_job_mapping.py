"""dcgm-exporter's job mapping with a real daemon on the fake 8×H100: with `metrics: {dcgm_job_mapping_dir:
DIR}` the daemon keeps one file per GPU a job holds in DIR, named by the GPU's index and holding the
job's name, as dcgm-exporter's `--hpc-job-mapping-dir` reads them; a job that leaves its GPUs loses its
files; a daemon killed with its jobs running leaves them (the jobs still run) and the next start keeps
them; a stop removes them all. The directory is read the way dcgm-exporter reads it, and its names agree
with the `spx_job` label of the daemon's own /metrics. A directory above it that others can write is
refused by `spx-trainer --check` and at start."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from harness import BIN, Daemon, wait_for

SLEEP = Path(__file__).resolve().parent.parent / "fixtures" / "scripts" / "sleep_for.py"


def read_like_dcgm_exporter(directory: Path) -> dict[str, list[str]]:
    """GPU id → job ids: every regular file whose name is an integer, one job id a line."""
    seen = {}
    for entry in os.scandir(directory):
        if entry.name.isdigit() and entry.is_file():
            seen[entry.name] = Path(entry.path).read_text().splitlines()
    return seen


def gpu_jobs_in_metrics(d: Daemon) -> dict[str, list[str]]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{d.metrics_port}/metrics", timeout=30).read().decode()
    return {s.labels["gpu"]: [s.labels["spx_job"]] for fam in text_string_to_metric_families(text)
            if fam.name == "spx_gpu_info" for s in fam.samples if "spx_job" in s.labels}


def job(name: str, gpus: int) -> str:
    return (f"name: {name}\nlauncher: python\nscript: {SLEEP}\nargs: ['600']\ngpus: {gpus}\n"
            "stop: {grace_seconds: 5}\n")


def test_the_mapping_follows_the_gpus_each_job_holds(tmp_path):
    mapping_dir = tmp_path / "dcgm-job-map"
    mapping_dir.mkdir(mode=0o755)
    (mapping_dir / "7").write_text("a-job-of-a-daemon-before\n")
    d = Daemon(tmp_path / "root", gpu_backend="fake", config={"metrics": {"dcgm_job_mapping_dir": str(mapping_dir)}},
               log_level="debug")  # each write of the mapping is logged at debug
    d.start()
    try:
        wait_for(lambda: read_like_dcgm_exporter(mapping_dir) == {}, 30, "the stale file gone after the start")
        d.drop("two.yaml", job("two", 2))
        d.drop("three.yaml", job("three", 3))
        two = d.wait_state("two", "running", 60)["gpus"]
        three = d.wait_state("three", "running", 60)["gpus"]
        held = {**{str(g): ["two"] for g in two}, **{str(g): ["three"] for g in three}}
        assert len(held) == 5, (two, three)
        wait_for(lambda: read_like_dcgm_exporter(mapping_dir) == held, 30, f"the mapping {held}")
        assert gpu_jobs_in_metrics(d) == held, "hpc_job in dcgm-exporter's series = spx_job in the daemon's"
        assert sorted(os.listdir(mapping_dir)) == sorted(held), "nothing else in the directory"

        d.spx("cancel", "two")
        d.wait_state("two", "cancelled", 60)
        only_three = {str(g): ["three"] for g in three}
        wait_for(lambda: read_like_dcgm_exporter(mapping_dir) == only_three, 30, "two's GPUs gone from the mapping")

        d.kill9()  # a crash: the job runs on, so its GPUs stay mapped ...
        assert read_like_dcgm_exporter(mapping_dir) == only_three
        d.start()  # ... and the next start, which adopts it, keeps them: its first write is the same mapping
        d.wait_event("adopted_after_restart", job="three")
        d.wait_event("dcgm_job_mapping_written")
        first_write = d.events("dcgm_job_mapping_written")[0]
        assert first_write["gpus"] == only_three, first_write
        d.drop("one.yaml", job("one", 1))
        one = d.wait_state("one", "running", 60)["gpus"]
        with_one = {**only_three, **{str(g): ["one"] for g in one}}
        wait_for(lambda: read_like_dcgm_exporter(mapping_dir) == with_one, 30, "the mapping after the restart")
    finally:
        d.stop()
    assert read_like_dcgm_exporter(mapping_dir) == {}, "a stop ends every job: no GPU is held"


def test_a_directory_a_user_could_swap_is_refused_by_check_and_at_start(tmp_path):
    open_parent = tmp_path / "shared"
    open_parent.mkdir()
    open_parent.chmod(0o777)  # anyone may rename what is in it
    config = tmp_path / "config.yaml"
    config.write_text(f"metrics: {{dcgm_job_mapping_dir: {open_parent / 'job-map'}}}\n")
    for mode in (["--check"], ["--gpu-backend", "fake"]):
        res = subprocess.run([str(BIN / "spx-trainer"), "--root", str(tmp_path / "root"), "--config", str(config),
                              *mode], capture_output=True, text=True, timeout=60)
        assert res.returncode == 2, (mode, res.stdout, res.stderr)
        (line,) = [json.loads(x) for x in res.stdout.splitlines() if '"cannot_start"' in x]
        assert f"{open_parent} is owned by uid 0 with mode 777" in line["error"], line
    assert not (open_parent / "job-map").exists() and not (tmp_path / "root" / "state").exists(), "nothing was made"
