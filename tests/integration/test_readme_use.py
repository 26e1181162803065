"""The README's "Use" section, as a new user meets it: each command as written, from the checkout."""

from __future__ import annotations

import os
import subprocess

from harness import BIN, Daemon


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
