"""A script that writes no heartbeat is still caught when it hangs: its GPUs stop computing (the
fake fixture's `stalled_from_seconds`: the process still holds the GPU, utilization drops to 0) and
its log stays silent for the hang timeout → stacks dumped, killed, restarted (class hang)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from harness import Daemon
from spx.daemon.gpu.fake import DEFAULT_FIXTURE

STALL_AT_SECONDS = 12
TIMEOUT_SECONDS = 8


@pytest.mark.slow
def test_a_script_without_heartbeat_whose_gpus_go_idle_and_log_goes_silent_is_a_hang(tmp_path: Path):
    fixture = json.loads(DEFAULT_FIXTURE.read_text())
    for dev in fixture["devices"]:
        dev["xid_schedule"] = []
        dev["stalled_from_seconds"] = STALL_AT_SECONDS
    gpus = tmp_path / "stalling.json"
    gpus.write_text(json.dumps(fixture))
    script = tmp_path / "quiet.py"
    script.write_text("import time\nprint('computing', flush=True)\ntime.sleep(600)\n")
    d = Daemon(tmp_path / "root", gpu_backend="fake", extra_args=["--fake-gpus", str(gpus)]).start()
    try:
        d.drop("q.yaml", f"name: quiet\nlauncher: python\nscript: {script}\npython: {sys.executable}\ngpus: 1\n"
                         f"restart: {{backoff_seconds: [1, 1], hang_timeout_seconds: {TIMEOUT_SECONDS}}}\n"
                         "stop: {grace_seconds: 5}\n")
        hang = d.wait_event("hang_detected", job="quiet", timeout=STALL_AT_SECONDS + TIMEOUT_SECONDS + 30)
        assert hang["without_heartbeat"] is True and hang["idle_seconds"] >= TIMEOUT_SECONDS, hang  # logged rounded to 0.1 s
        d.wait_event("attempt_started", job="quiet", attempt=2, timeout=60)
        first = d.status("quiet")["history"][0]
        assert first["reason"].startswith("hang"), first
        log1 = (d.root / "log" / "quiet" / "attempt-1.log").read_text()
        assert "hang detected: no heartbeat, GPUs idle and log silent" in log1
        d.spx("cancel", "quiet")
        d.wait_state("quiet", "cancelled", 60)
    finally:
        d.stop()
