"""The real daemon on the fake 8×H100 host running a real training job, and a real Prometheus
scraping it, for the end-to-end tests in tests/dashboards/ (dashboards, alerts, and the exporter as
Prometheus sees it).

The stack is `spx-trainer --gpu-backend fake` (tests/harness.py) with one job, "llama-ft": a
2-worker torchrun of examples/train_ddp.py on GPUs 0 and 1 that crashes at step 5 of its first
attempt (so restarts by reason have data), is relaunched by the daemon and then trains slowly,
checkpointing every couple of seconds; its rank 1 is slow on GPU 1, in thermal slowdown (so the
straggler series have data). The fixture is the bundled one with one NVML call failing on
GPU 7, so the NVML-error series exist as on a host with a flaky call. Prometheus runs with
dashboards/prometheus.yml's scrape config (job name spx-trainer, no honor_labels) at a 1 s scrape and
rule interval, with our rules loaded; the alerting rules are loaded with every `for:` set to 0 s,
so that an alert whose condition holds fires within seconds.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import yaml
from dashboards_testlib import DASHBOARDS, RULES

from harness import EXAMPLES, Daemon, wait_for
from spx.daemon.gpu.fake import DEFAULT_FIXTURE
from spx.daemon.run.launcher import free_port

JOB = "llama-ft"
JOB_GPUS = [0, 1]
FLAKY_GPU, FLAKY_CALL = 7, "nvmlDeviceGetPcieThroughput"
STRAGGLER_GPU = 1
JOB_SPEC = {
    "name": JOB,
    "launcher": "torchrun",
    "script": str(EXAMPLES / "train_ddp.py"),
    # ~5 steps/s and a checkpoint every 2 s, lightly loaded so the rest of the stack keeps up.
    "args": ["--steps", "1000000", "--checkpoint-every", "10", "--sleep-per-step", "0.2", "--keep", "2",
             "--crash-at-step", "5", "--model-size", "tiny", "--batch_size", "4",
             "--slow-rank", "1", "--slow-rank-seconds", "0.005", "--rank-timing-every", "5"],
    "gpus": JOB_GPUS,
    "restart": {"max_restarts": 3, "backoff_seconds": [1, 5], "hang_timeout_seconds": 600},
    "stop": {"grace_seconds": 20},
}


class LiveHost:
    """`spx-trainer` on the fake host with JOB running its second attempt (see module docstring)."""

    def __init__(self, workdir: Path) -> None:
        fixture = json.loads(DEFAULT_FIXTURE.read_text())
        fixture["devices"][FLAKY_GPU]["failing_functions"] = {FLAKY_CALL: "UNKNOWN"}
        # Rank 1 is slow (`--slow-rank 1`) on a GPU in thermal slowdown: the straggler series exist.
        fixture["devices"][STRAGGLER_GPU].update(clock_event_reasons_busy=["HwThermalSlowdown"],
                                                 sm_clock_busy_mhz=1410, temperature_busy_c=87)
        (workdir / "fixture.json").write_text(json.dumps(fixture))
        self.daemon = Daemon(workdir / "root", gpu_backend="fake",
                             extra_args=["--fake-gpus", str(workdir / "fixture.json")])
        self.daemon.start()
        self.address = f"127.0.0.1:{self.daemon.metrics_port}"
        self.url = f"http://{self.address}/metrics"
        try:
            self.daemon.drop(f"{JOB}.yaml", yaml.safe_dump(JOB_SPEC))
            self.daemon.wait_event("attempt_started", job=JOB, attempt=2, timeout=180)
            # Training again, past a checkpoint of attempt 2: every job series has a value.
            wait_for(self._checkpointed, 240, f"{JOB} to checkpoint in its second attempt", interval=1)
        except BaseException:
            self.stop()
            raise

    def _checkpointed(self) -> bool:
        job = self.daemon.job(JOB)
        if job is None or job["state"] not in ("running", "restarting", "starting"):
            raise AssertionError(f"{JOB} is not running: {job}\n{self.daemon.lines[-20:]}")
        return (job["attempts"] == 2 and job["state"] == "running" and bool(job["last_checkpoint_step"])
                and bool(self.daemon.status(JOB).get("stragglers")))

    def scrape(self) -> str:
        with urllib.request.urlopen(self.url, timeout=30) as response:
            return response.read().decode()

    def stop(self) -> None:
        self.daemon.spx("cancel", JOB, check=False)
        try:
            wait_for(lambda: (self.daemon.job(JOB) or {}).get("state") == "cancelled", 60, f"{JOB} cancelled")
        finally:
            self.daemon.stop()


class Prometheus:
    """`/usr/bin/prometheus` scraping `target` every second, with dashboards/rules loaded."""

    def __init__(self, workdir: Path, target: str) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            raise AssertionError("prometheus not found: install Debian's `prometheus` package")
        config = yaml.safe_load((DASHBOARDS / "prometheus.yml").read_text())
        config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
        config.pop("alerting", None)
        (scrape,) = config["scrape_configs"]
        scrape.update(scrape_interval="1s", scrape_timeout="1s", static_configs=[{"targets": [target]}])
        config["rule_files"] = [self._rules(workdir, p) for p in config["rule_files"]]
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / "prometheus.log"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [binary, f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT,
            )
        wait_for(self._ready, 60, f"Prometheus on {self.url} to be ready")

    @staticmethod
    def _rules(workdir: Path, relative: str) -> str:
        """Copy a rule file into `workdir`, alerts with `for: 0s`; returns the copy's path."""
        doc = yaml.safe_load((RULES / Path(relative).name).read_text())
        for group in doc["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    rule["for"] = "0s"
        path = workdir / Path(relative).name
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return str(path)

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited with {self.proc.returncode}:\n{self.log_tail()}")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=5) as response:
                return response.status == 200
        except OSError:
            return False

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def _get(self, path: str, **params: str) -> dict:
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=30) as response:
                doc = json.load(response)
        except urllib.error.HTTPError as err:  # 400 for a bad query: report Prometheus' error text
            doc = json.load(err)
        return doc

    def query(self, expr: str) -> list[dict]:
        """Instant query at now; raises AssertionError with Prometheus' message if the query is invalid."""
        doc = self._get("/api/v1/query", query=expr)
        if doc.get("status") != "success":
            raise AssertionError(f"query failed: {doc.get('errorType')}: {doc.get('error')}\n  {expr}")
        return doc["data"]["result"]

    def alerts(self) -> list[dict]:
        return self._get("/api/v1/alerts")["data"]["alerts"]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)
