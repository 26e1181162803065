"""A real exporter on the fake 8×H100 host, a real worker process, and a real Prometheus scraping it,
for tests/dashboards/test_dashboards_live.py.

The stack is the daemon's exporter (`build_registry` + `serve`) with a jobs callable that reports one
running job, "llama-ft", on GPUs 0 and 1, whose step and checkpoint time advance like a training
run's. Prometheus runs with dashboards/prometheus.yml's scrape config (honor_labels, job name
spx-trainer) at a 1 s scrape and rule interval, with our rules loaded; the alerting rules are
loaded with every `for:` set to 0 s, so that an alert whose condition holds fires within seconds.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

import yaml
from dashboards_testlib import DASHBOARDS, RULES

JOB = "llama-ft"
JOB_GPUS = [0, 1]
CHECKPOINT_EVERY_S = 3.0
STEPS_PER_S = 10.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


class Exporter:
    """The daemon's exporter on the fake backend, with one running job and its worker process."""

    def __init__(self) -> None:
        from spx.daemon.exporter.server import build_registry, serve
        from spx.daemon.gpu.backend import open_backend

        env = {**os.environ, "SPX_JOB": JOB, "CUDA_VISIBLE_DEVICES": ",".join(map(str, JOB_GPUS))}
        env.pop("LOCAL_RANK", None)
        # The job's worker: the fake NVML reports it as a compute process on the GPUs it can see.
        self.worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"], env=env)
        self.t0 = time.time()
        self.backend = open_backend("fake")
        # One NVML function failing on one GPU, so the NVML-error series exist as they do on a host
        # with a flaky call (the fake's own test hook; everything else stays healthy).
        self.backend.nvml.fail_function("nvmlDeviceGetPcieThroughput", index=7)
        self.server = serve(build_registry(self.backend, self.jobs, "0.0.0-dashboards-test"), "127.0.0.1:0")
        self.address = f"127.0.0.1:{self.server.port}"

    def jobs(self) -> list:
        from spx.daemon.views import JobView

        elapsed = time.time() - self.t0
        checkpoint = self.t0 + CHECKPOINT_EVERY_S * (elapsed // CHECKPOINT_EVERY_S)
        return [JobView(
            name=JOB, state="running", reason=None, owner_uid=os.getuid(), owner="test", attempts=3,
            step=int(elapsed * STEPS_PER_S), epoch=0, samples_per_second=512.0,
            last_checkpoint_step=int((checkpoint - self.t0) * STEPS_PER_S), last_checkpoint_time=checkpoint,
            gpus=list(JOB_GPUS), submitted=self.t0 - 60, restarts_by_reason={"crash": 1, "oom": 1},
            pids=[self.worker.pid],
        )]

    def scrape(self) -> str:
        with urllib.request.urlopen(self.server.url, timeout=30) as response:
            return response.read().decode()

    def stop(self) -> None:
        try:
            self.server.shutdown()
            self.backend.close()
        finally:
            self.worker.kill()
            self.worker.wait(timeout=30)


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
