"""An incident per failure, with a real daemon on the fake 8×H100 (issue 27): XID 79 on a GPU of a
running 4-GPU job gives an incident naming the GPU and the XID, with the GPU's readings of the
minute before it (the ring buffer the exporter's scrapes feed: a scraper here scrapes /metrics
every 2 s, as Prometheus would) and the restart's phases; a hang gives one with the workers'
stacks (py-spy's dump before the kill). Both through `spx incidents`."""

from __future__ import annotations

import json
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

from harness import Daemon, wait_for
from spx.daemon.gpu.fake import DEFAULT_FIXTURE

XID_AT_SECONDS = 70.0  # a full minute of scrapes before it
SCRAPE_EVERY_SECONDS = 2.0
STALL_AT_SECONDS = 12
HANG_TIMEOUT_SECONDS = 8

# Beats every half second, its first step at its start: the next attempt's first step ends the restart.
BEATING = """import os, time
from spx.daemon.contract.worker_env import Heartbeat, write_heartbeat
start = time.time()
step = 0
while True:
    step += 1
    write_heartbeat(os.environ["SPX_HEARTBEAT_FILE"], Heartbeat(step=step, phases={"first_step": start}))
    time.sleep(0.5)
"""


def fixture_file(tmp_path: Path, edit, kernel_log: Path | None = None) -> Path:
    """The bundled fixture without its own XIDs, edited; with `kernel_log`, the fake writes each XID
    there as the driver writes it to /dev/kmsg (the daemon reads that file instead)."""
    fixture = json.loads(DEFAULT_FIXTURE.read_text())
    for dev in fixture["devices"]:
        dev["xid_schedule"] = []
    edit(fixture["devices"])
    if kernel_log is not None:
        fixture["kernel_log"] = str(kernel_log)
    path = tmp_path / "fixture.json"
    path.write_text(json.dumps(fixture))
    return path


class Scraper:
    """Scrapes the daemon's /metrics every SCRAPE_EVERY_SECONDS until closed (what Prometheus does)."""

    def __init__(self, d: Daemon) -> None:
        self.url = f"http://127.0.0.1:{d.metrics_port}/metrics"
        self.done = threading.Event()
        self.scrapes = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.is_set():
            try:
                urllib.request.urlopen(self.url, timeout=10).read()
                self.scrapes += 1
            except OSError:
                pass
            self.done.wait(SCRAPE_EVERY_SECONDS)

    def close(self) -> None:
        self.done.set()
        self.thread.join(timeout=15)


def incidents(d: Daemon, name: str) -> list[dict]:
    return json.loads(d.spx("incidents", name, "--json").stdout)


@pytest.mark.slow
def test_xid_79_under_a_4_gpu_job_gives_an_incident_with_the_gpu_the_xid_its_last_minute_and_the_restart(tmp_path):
    def xid_on_gpu_2(devices):
        devices[2]["xid_schedule"] = [{"xid": 79, "at_seconds": XID_AT_SECONDS}]

    script = tmp_path / "beating.py"
    script.write_text(BEATING)
    kmsg = tmp_path / "kmsg"
    d = Daemon(tmp_path / "root", gpu_backend="fake",
               extra_args=["--fake-gpus", str(fixture_file(tmp_path, xid_on_gpu_2, kmsg))]).start()
    scraper = Scraper(d)
    try:
        told = tmp_path / "told.json"  # the restart's notification, as its command hook read it on stdin
        d.drop("j.yaml", f"name: four\nlauncher: python\nscript: {script}\npython: {sys.executable}\ngpus: 4\n"
                         "restart: {backoff_seconds: [1, 1]}\nstop: {grace_seconds: 5}\n"
                         f"notify: {{command: 'cat > {told}', events: [restarted]}}\n")
        assert d.wait_state("four", "running", 30)["gpus"] == [0, 1, 2, 3]
        d.wait_event("gpu_quarantined", timeout=XID_AT_SECONDS + 30, gpu=2)
        d.wait_event("incident_recorded", timeout=60, job="four", attempt=1)

        def restarted():
            found = incidents(d, "four")
            return found if found and found[0]["restart_seconds"] is not None else None

        (incident,) = wait_for(restarted, 60, "attempt 2's first step after the incident")
        assert incident["attempt"] == 1 and incident["class"] == "gpu-fault" and incident["stop_cause"] == "gpu-fault"
        assert incident["reason"].startswith("gpu-fault: XID 79 on GPU 2 (GPU fell off the bus)"), incident["reason"]
        assert [g["index"] for g in incident["gpus"]] == [0, 1, 2, 3]
        gpu2 = incident["gpus"][2]
        assert [x["xid"] for x in gpu2["xids"]] == [79] and gpu2["uuid"].startswith("GPU-")
        assert gpu2["kernel"] == ["NVRM: Xid (PCI:0000:3a:00): 79, pid='<unknown>', name=<unknown>, simulated by the "
                                  "fake fixture"], gpu2["kernel"]
        assert all(g["kernel"] == [] for g in incident["gpus"] if g["index"] != 2)
        failed = incident["failed_at"]
        assert 0 <= failed - gpu2["xids"][0]["time"] < 5  # the stop began right after the XID
        # The minute before, from the ring buffer: a reading every scrape (2 s), from its start to the failure.
        readings = gpu2["readings"]
        assert len(readings) >= 60 / SCRAPE_EVERY_SECONDS - 5, len(readings)
        assert all(failed - 60 <= r["time"] <= failed for r in readings)
        assert readings[0]["time"] - (failed - 60) < 2 * SCRAPE_EVERY_SECONDS
        assert failed - readings[-1]["time"] < 2 * SCRAPE_EVERY_SECONDS
        assert {"utilization", "memory_used_bytes", "power_watts", "temperature_celsius", "sm_clock_hertz",
                "ecc_uncorrected"} <= set(readings[-1]), readings[-1]
        assert all(len(g["readings"]) == len(readings) for g in incident["gpus"])  # every GPU the job held
        # The restart: the failure's phases, then the next attempt's, up to its first step.
        phases = [(p["attempt"], p["phase"]) for p in incident["recovery"]]
        for expected in [(1, "failure_seen"), (1, "group_dead"), (1, "end_recorded"), (2, "placed"), (2, "spawn"),
                         (2, "first_step")]:
            assert expected in phases, phases
        assert 0 < incident["restart_seconds"] < 60 and incident["restart_seconds_from"] == "phases"
        text = d.spx("incidents", "four").stdout
        assert "four  attempt 1  gpu-fault" in text and "XID 79 on GPU 2 (GPU fell off the bus) at" in text, text
        assert "kernel: NVRM: Xid (PCI:0000:3a:00): 79" in text, text
        assert "readings in the 60 s before" in text and "restart:" in text, text
        assert [i["job"] for i in json.loads(d.spx("incidents", "--json").stdout)] == ["four"]
        # The notification of the restart carries the incident (docs/notify.md).
        d.wait_event("notify_sent", timeout=60, job="four", on="restarted")
        body = json.loads(told.read_text())
        assert body["event"] == "restarted" and body["class"] == "gpu-fault", body
        assert body["incident"]["attempt"] == 1 and body["incident"]["failed_at"] == failed
        assert [x["xid"] for x in body["incident"]["gpus"][2]["xids"]] == [79] and body["incident"]["gpus"][2]["readings"]
        d.spx("cancel", "four")
        d.wait_state("four", "cancelled", 60)
        assert len(incidents(d, "four")) == 1  # a cancel is no failure
    finally:
        scraper.close()
        d.stop()


@pytest.mark.slow
def test_a_hang_gives_an_incident_with_the_workers_stacks(tmp_path):
    def stall(devices):
        for dev in devices:
            dev["stalled_from_seconds"] = STALL_AT_SECONDS

    script = tmp_path / "quiet.py"
    script.write_text("import time\nprint('computing', flush=True)\ntime.sleep(600)\n")
    d = Daemon(tmp_path / "root", gpu_backend="fake", extra_args=["--fake-gpus", str(fixture_file(tmp_path, stall))]).start()
    try:
        d.drop("q.yaml", f"name: quiet\nlauncher: python\nscript: {script}\npython: {sys.executable}\ngpus: 1\n"
                         f"restart: {{backoff_seconds: [1, 1], hang_timeout_seconds: {HANG_TIMEOUT_SECONDS}}}\n"
                         "stop: {grace_seconds: 5}\n")
        d.wait_event("hang_detected", job="quiet", timeout=STALL_AT_SECONDS + HANG_TIMEOUT_SECONDS + 30)
        d.wait_event("incident_recorded", timeout=60, job="quiet", attempt=1)
        (incident,) = incidents(d, "quiet")
        assert incident["class"] == "hang" and incident["stop_cause"] == "hang"
        assert incident["kernel_log"]["unavailable"] == "this GPU backend has no kernel log"  # a fake without one
        assert "hang detected; stack of pid" in incident["stacks"] and "quiet.py" in incident["stacks"], incident["stacks"]
        assert "stacks:" in d.spx("incidents", "quiet").stdout
        d.spx("cancel", "quiet")
        d.wait_state("quiet", "cancelled", 60)
    finally:
        d.stop()
