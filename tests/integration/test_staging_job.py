"""`data.stage` through the daemon: staged before attempt 1, progress and result in status/log."""

from __future__ import annotations

import sys
from pathlib import Path

from harness import Daemon

SCRIPTS = Path(__file__).resolve().parent.parent / "fixtures" / "scripts"


def test_job_data_is_staged_before_its_first_attempt(tmp_path):
    src, dst = tmp_path / "volume", tmp_path / "nvme" / "data"
    (src / "shards").mkdir(parents=True)
    for i in range(20):
        (src / "shards" / f"{i:03d}.bin").write_bytes(bytes([i]) * 65536)
    d = Daemon(tmp_path / "root").start()
    try:
        d.drop("s.yaml", f"name: staged\nlauncher: python\nscript: {SCRIPTS / 'sleep_for.py'}\npython: {sys.executable}\n"
                         f"args: ['0']\ndata: {{stage: {{from: {src}, to: {dst}}}}}\n")
        d.wait_state("staged", {"succeeded", "failed"}, 60)
        st = d.status("staged")
        assert st["state"] == "succeeded", st
        assert st["staging"].startswith("staged 1.2 MiB in 20 files")
        assert sorted(p.name for p in (dst / "shards").iterdir()) == [f"{i:03d}.bin" for i in range(20)]
        assert "staged 1.2 MiB" in (d.root / "log" / "staged" / "staging.log").read_text()
    finally:
        d.stop()


def test_staging_failure_fails_the_job_with_the_reason(tmp_path):
    d = Daemon(tmp_path / "root").start()
    try:
        d.drop("s.yaml", f"name: nostage\nlauncher: python\nscript: {SCRIPTS / 'sleep_for.py'}\n"
                         f"data: {{stage: {{from: {tmp_path / 'missing'}, to: {tmp_path / 'dst'}}}}}\n")
        d.wait_state("nostage", "failed", 60)
        st = d.status("nostage")
        assert st["reason"].startswith("staging failed") and "missing" in st["reason"] and st["attempts"] == 0
    finally:
        d.stop()
