"""Default checkpoint dirs are per owner (`checkpoints_root/OWNER/NAME`), and the upgrade keeps the
old ones: a job recorded before (its spec without `checkpoints.dir`) still runs in
`checkpoints_root/NAME` and resumes from what is there; a new job of that name gets the per-owner dir,
and `spx submit` names the old dir and how to resume from it. Real daemon, real jobs."""

from __future__ import annotations

import json
import os
import pwd
import time
import zipfile
from pathlib import Path

import pytest

from harness import Daemon
from spx.daemon.core.spec import parse_spec
from spx.daemon.state.store import Store

SCRIPT = Path(__file__).resolve().parent.parent / "fixtures" / "scripts" / "whoami_env.py"
ME = pwd.getpwuid(os.getuid()).pw_name


def job_text(name: str, out: Path) -> str:
    return (f"name: {name}\nlauncher: python\nscript: {SCRIPT}\nargs: ['{out}']\ngpus: 0\n"
            "checkpoints: {pattern: 'ckpt-*.pt'}\n")


def env_of(out: Path) -> dict:
    return json.loads(out.read_text())["env"]


@pytest.fixture
def root(tmp_path):
    return tmp_path / "root"


def test_a_job_recorded_before_per_owner_dirs_keeps_its_dir_and_a_new_one_gets_its_own(root, tmp_path):
    legacy = root / "checkpoints" / "old"
    legacy.mkdir(parents=True)
    with zipfile.ZipFile(legacy / "ckpt-7.pt", "w") as z:  # its last checkpoint, as torch.save writes one
        z.writestr("weights", "1")
    queued = tmp_path / "queued.json"
    store = Store(root / "state" / "spx.sqlite")  # as the daemon before the upgrade left it: a queued job
    store.jobs.add(parse_spec(job_text("old", queued)), os.getuid(), ME, "-", time.time())
    store.close()
    d = Daemon(root).start()
    try:
        d.wait_state("old", {"succeeded", "failed"}, 60)
        env = env_of(queued)
        assert env["SPX_CHECKPOINT_DIR"] == str(legacy), "its checkpoints stay where they are"
        assert env["SPX_RESUME_FROM"] == str(legacy / "ckpt-7.pt")

        spec = tmp_path / "old.yaml"
        fresh = tmp_path / "fresh.json"
        spec.write_text(job_text("old", fresh))
        out = d.spx("submit", str(spec)).stdout
        mine = d.checkpoint_dir("old")
        assert f"{legacy} holds checkpoints of an earlier old" in out and f"checkpoints.dir: {legacy}" in out, out
        d.wait_state("old", {"succeeded", "failed"}, 60)
        env = env_of(fresh)
        assert (env["SPX_CHECKPOINT_DIR"], env["SPX_RESUME_FROM"]) == (str(mine), "")
        stored = Store(root / "state" / "spx.sqlite", readonly=True)
        try:
            assert stored.jobs.by_name("old").spec.checkpoints.dir == mine, "the default is written into the spec"
        finally:
            stored.close()
        assert mine.parent.stat().st_uid == os.getuid() and sorted(os.listdir(legacy)) == [".spx", "ckpt-7.pt"]
    finally:
        d.stop()
