"""`spx report` against a real daemon: a `launcher: python` job whose script beats steps 1..8 into its
heartbeat, crashes once (attempt 1 exits 3) and succeeds on the next attempt. `spx report NAME -o
x.svg` writes an SVG with the step polyline (from attempt 1's first step to attempt 2's last, through
the drop at the failure) and exactly one failure marker; `--json` accounts for the whole wall time."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness import Daemon

PY = sys.executable
NS = "{http://www.w3.org/2000/svg}"
STEPS = 8
# A heartbeat writer without spx.trainer: steps 1..STEPS a quarter second apart, then attempt 1 fails.
BEATING_CRASH_ONCE = f"""\
import json, os, sys, time
path = os.environ["SPX_HEARTBEAT_FILE"]
for step in range(1, {STEPS} + 1):
    time.sleep(0.25)
    with open(path + ".tmp", "w") as f:
        json.dump({{"step": step, "time": time.time(), "status": "running"}}, f)
    os.replace(path + ".tmp", path)
time.sleep(0.5)  # the daemon reads the last beat before the exit
sys.exit(3 if os.environ["SPX_ATTEMPT"] == "1" else 0)
"""

pytestmark = pytest.mark.slow


@pytest.fixture
def daemon(tmp_path):
    d = Daemon(tmp_path / "root", gpu_backend="fake").start()
    yield d
    d.stop()


def test_report_of_a_job_that_crashed_once_draws_its_steps_and_one_failure(daemon, tmp_path):
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "beats.py").write_text(BEATING_CRASH_ONCE)
    job = proj / "crashy.yaml"
    job.write_text(f"name: crashy\nlauncher: python\nworkdir: .\nscript: beats.py\npython: {PY}\ngpus: 1\n"
                   "restart: {max_restarts: 3, backoff_seconds: [0.5, 1]}\nstop: {grace_seconds: 2}\n")
    daemon.spx("submit", str(job))
    doc = daemon.wait_state("crashy", "succeeded", timeout=90)
    assert [a["reason_class"] for a in daemon.status("crashy")["history"]] == ["crash", None], doc

    out = tmp_path / "x.svg"
    report = daemon.spx("report", "crashy", "-o", str(out), "--json")
    answer = json.loads(report.stdout)
    root = ET.fromstring(out.read_text())
    [line] = [e for e in root.iter(f"{NS}polyline") if e.get("class") == "series step"]
    points = [tuple(float(v) for v in p.split(",")) for p in line.get("points", "").split()]
    assert len(points) == len(answer["steps"]) >= 4
    assert [s for _, s in answer["steps"]][-1] == STEPS and max(s for _, s in answer["steps"]) == STEPS
    assert [x for x, _ in points] == sorted(x for x, _ in points)  # time runs forward
    markers = [g for g in root.iter(f"{NS}g") if g.get("class") == "marker failure"]
    assert len(markers) == 1 and len(answer["failures"]) == 1
    assert answer["failures"][0]["attempt"] == 1 and answer["failures"][0]["step"] == STEPS
    assert len([r for r in root.iter(f"{NS}rect") if r.get("class") == "span recovery"]) == 1
    account = answer["account"]
    assert sum(account["seconds"].values()) == pytest.approx(account["wall_seconds"], rel=0.01)
    assert account["seconds"]["productive"] > 0

    text = daemon.spx("report", "crashy", "-o", str(tmp_path / "again.svg")).stdout
    assert "failures: 1" in text and "crash: exit code 3" in text
    assert Path(tmp_path / "again.svg").read_text().count('class="marker failure"') == 1
