"""Retention and notifications with a real daemon and real jobs (issue 26): an ended job's rows and
logs go once older than `retention.finished_jobs_days` while a running job's stay; a failed job's
webhook reaches a local HTTP server with its root cause; a hook command that hangs is killed at its
deadline and retried. (A hook run as a real other user: tests/hostile/test_hostile_notify.py.)"""

from __future__ import annotations

import json
import os
import sys
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness import Daemon

SCRIPTS = Path(__file__).resolve().parent.parent / "fixtures" / "scripts"
PY = sys.executable

pytestmark = pytest.mark.slow


def metric(d: Daemon, name: str, **labels: str) -> float | None:
    text = urllib.request.urlopen(f"http://127.0.0.1:{d.metrics_port}/metrics", timeout=30).read().decode()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


def test_an_ended_jobs_rows_and_logs_go_after_the_retention_a_running_jobs_stay(tmp_path):
    d = Daemon(tmp_path / "root", config={"retention": {"finished_jobs_days": 0.0001, "check_every_seconds": 1}})
    d.start()
    try:
        d.drop("run.yaml", f"name: runner\nlauncher: python\nscript: {SCRIPTS / 'sleep_for.py'}\npython: {PY}\n"
                           "args: ['600']\nstop: {grace_seconds: 2}\n")
        d.drop("done.yaml", f"name: quick\nlauncher: python\nscript: {SCRIPTS / 'sleep_for.py'}\npython: {PY}\n"
                            "args: ['0']\n")
        d.wait_state("runner", "running", 60)
        d.wait_state("quick", "succeeded", 60)
        quick_id = d.status("quick")["job_id"]
        logs = d.root / "log"
        assert (logs / "quick").is_dir() and (logs / "runner").is_dir()
        # 0.0001 days = 8.64 s after it ended; passes every second.
        removed = d.wait_event("retention_removed", timeout=60, job="quick")
        assert removed["job_id"] == quick_id
        assert not (logs / "quick").exists()
        assert d.wait_event("retention_files_removed", job="quick")["removed"]
        listed = json.loads(d.spx("ls", "--all", "--json").stdout)
        assert [j["name"] for j in listed] == ["runner"]
        assert d.spx("status", "quick", check=False).returncode != 0  # no such job any more
        # The running job is untouched, its rows and its logs, however long it has run.
        assert d.status("runner")["state"] == "running" and (logs / "runner" / "attempt-1.log").is_file()
        assert metric(d, "spx_retention_removed_jobs_total") == 1.0
        config = d.root.parent / f"{d.root.name}-config.yaml"  # the file the daemon was started with
        footer = d.spx("--config", str(config), "ls", "--all").stdout.strip().splitlines()[-1]
        assert footer.startswith("finished jobs are kept 8.64 s after they end"), footer
        d.spx("cancel", "runner")
        d.wait_state("runner", "cancelled", 60)
    finally:
        d.stop()


class _Hooks(BaseHTTPRequestHandler):
    received: list[dict] = []
    arrived = threading.Event()

    def do_POST(self) -> None:  # noqa: N802 — http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append({"path": self.path, "type": self.headers["Content-Type"], "body": json.loads(body)})
        self.send_response(204)
        self.end_headers()
        type(self).arrived.set()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def hook_server():
    _Hooks.received = []
    _Hooks.arrived = threading.Event()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hooks)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_a_failed_jobs_webhook_reaches_the_server_with_its_root_cause(tmp_path, hook_server):
    d = Daemon(tmp_path / "root").start()
    url = f"http://127.0.0.1:{hook_server.server_address[1]}/spx/hook?token=t0"
    try:
        d.drop("c.yaml", f"name: crasher\nlauncher: python\nscript: {SCRIPTS / 'always_crash.py'}\npython: {PY}\n"
                         f"restart: {{max_restarts: 0}}\nnotify: {{webhook: '{url}', events: [failed, succeeded]}}\n")
        d.wait_state("crasher", "failed", 60)
        assert _Hooks.arrived.wait(30), f"no webhook arrived: {d.events('notify_failed')}"
        assert len(_Hooks.received) == 1
        got = _Hooks.received[0]
        assert got["path"] == "/spx/hook?token=t0" and got["type"] == "application/json"
        body = got["body"]
        assert body["event"] == "failed" and body["job"] == "crasher" and body["state"] == "failed"
        assert "ValueError: learning rate must be positive" in body["root_cause"], body
        assert body["reason"] and body["class"] and body["attempts"] == 1 and body["owner"] == "root"
        assert body["links"]["logs"] == str(d.root / "log" / "crasher")
        d.wait_event("notify_sent", job="crasher", way="webhook")
        assert metric(d, "spx_notify_sends_total", result="ok") == 1.0
    finally:
        d.stop()


def test_a_hook_that_hangs_is_killed_at_its_deadline_and_retried(tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    # The first call hangs (its pid noted); the retry finds the mark and exits 0.
    hook = (f"if [ -e {marks}/first ]; then echo again > {marks}/second; exit 0; fi; "
            f"echo $$ > {marks}/first; exec sleep 600")
    d = Daemon(tmp_path / "root").start()
    try:
        d.drop("c.yaml", f"name: hangs\nlauncher: python\nscript: {SCRIPTS / 'always_crash.py'}\npython: {PY}\n"
                         f"restart: {{max_restarts: 0}}\nnotify: {{command: {json.dumps(hook)}, timeout_seconds: 2}}\n")
        d.wait_state("hangs", "failed", 60)
        failed = d.wait_event("notify_failed", timeout=30, job="hangs")
        assert "killed at its deadline (2 s)" in failed["error"] and failed["then"] == "retried in 5 s"
        pid = int((marks / "first").read_text())
        assert not os.path.exists(f"/proc/{pid}"), "the hung hook outlived its deadline"
        sent = d.wait_event("notify_sent", timeout=30, job="hangs")
        assert sent["try"] == 2 and sent["answer"] == "exit 0" and (marks / "second").read_text() == "again\n"
        d.spx("ls")  # the daemon answered throughout
    finally:
        d.stop()
