"""`spx submit -- torchrun …` against a real daemon: the command line a user already runs becomes a
job, runs under supervision to success, and is exactly the job file `--dry-run` showed."""

from __future__ import annotations

import os
import subprocess

import pytest
import yaml

from harness import BIN, REPO, Daemon

TORCHRUN = ["torchrun", "--nproc_per_node=2", "--nnodes=1", "examples/train_ddp.py", "--batch_size", "4",
            "--steps", "20", "--checkpoint-every", "10", "--model-size", "tiny", "--gradient_checkpointing"]


@pytest.mark.slow
def test_the_seed_command_line_runs_supervised_and_is_the_job_dry_run_shows(tmp_path):
    d = Daemon(tmp_path / "root", gpu_backend="fake").start()
    env = {**{k: v for k, v in os.environ.items() if k != "SPX_ROOT"}, "PATH": f"{BIN}:/usr/bin:/bin"}

    def spx(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / "spx"), "--root", str(d.root), *args], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=60)

    try:
        shown = spx("submit", "--dry-run", "--name", "seed-ddp", "--", *TORCHRUN)
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.startswith(f"# spx submit -- {' '.join(TORCHRUN)}\n"), shown.stdout
        assert "gpus: 2, one per worker: the daemon has 8 GPUs" in shown.stdout, shown.stdout
        assert yaml.safe_load(shown.stdout) == {
            "name": "seed-ddp", "launcher": "torchrun", "workdir": str(REPO), "script": "examples/train_ddp.py",
            "args": TORCHRUN[4:], "gpus": 2}
        assert not d.ls(), "a dry run submits nothing"

        res = spx("submit", "--name", "seed-ddp", "--", *TORCHRUN)
        assert res.returncode == 0 and res.stdout.startswith("seed-ddp: "), res.stderr + res.stdout
        assert "spx submit: gpus: 2, one per worker" in res.stderr, res.stderr
        st = d.wait_state("seed-ddp", {"succeeded", "failed"}, 120)
        assert st["state"] == "succeeded", d.status("seed-ddp")
        [accepted] = (d.root / "state" / "jobs").glob("seed-ddp.*.yaml")
        assert accepted.read_text() == shown.stdout, "the job submitted is the one the dry run showed"
        log = (d.root / "log" / "seed-ddp" / "attempt-1.log").read_text()
        assert "DDP on 2 rank(s)" in log and "final_state_sha256=" in log, log[-2000:]
        assert st["last_checkpoint_step"] == 20, st

        refused = spx("submit", "--", "torchrun", "--nproc_per_node=2", "--max_restarts=3", "examples/train_ddp.py")
        assert refused.returncode == 2 and "set restart.max_restarts in a job file" in refused.stderr, refused.stderr
    finally:
        d.stop()

