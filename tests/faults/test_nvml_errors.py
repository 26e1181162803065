"""NVML raising in the middle of a scrape and of the scheduler's free-GPU check (the fake backend's
fixture-described failing calls): every scrape still answers, the daemon keeps scheduling on the GPUs
that answer, and a job runs exactly once."""

from __future__ import annotations

import json
import urllib.request

from ledger import CountedJob, audit, state_of

from harness import Daemon, wait_for
from spx.daemon.gpu.fake import DEFAULT_FIXTURE

# GPU index → the calls that fail there (pynvml error names); the scrape meets them one after another.
FAILING = {
    0: {"nvmlDeviceGetComputeRunningProcesses": "UNKNOWN"},  # the scheduler cannot tell if it is free
    2: {"nvmlDeviceGetPowerUsage": "UNKNOWN", "nvmlDeviceGetUtilizationRates": "GPU_IS_LOST"},
    5: {"nvmlDeviceGetFieldValues": "UNKNOWN", "nvmlDeviceGetTemperature": "TIMEOUT"},
    6: {"nvmlDeviceGetMemoryInfo": "GPU_IS_LOST"},  # unhealthy from the start: listed, never allocated
}


def test_nvml_errors_mid_scrape_break_neither_the_scrape_nor_the_scheduling(tmp_path, daemons, scenario):
    fixture = json.loads(DEFAULT_FIXTURE.read_text())
    for gpu, calls in FAILING.items():
        fixture["devices"][gpu]["failing_functions"] = calls
    path = tmp_path / "flaky.json"
    path.write_text(json.dumps(fixture))
    job = CountedJob("on-gpus", tmp_path / "on-gpus.ledger", seconds=3, gpus=4)
    d = Daemon(tmp_path / "root", gpu_backend="fake", extra_args=["--fake-gpus", str(path)])
    daemons.append(d)
    d.start()
    d.drop("on-gpus.yaml", job.yaml())
    url = f"http://127.0.0.1:{d.metrics_port}/metrics"
    scrapes = []

    def ended_scraping_meanwhile() -> bool:
        if state_of(d.root, "on-gpus") in ("succeeded", "failed"):
            return True
        with urllib.request.urlopen(url, timeout=30) as resp:
            scrapes.append((resp.status, resp.read().decode()))
        assert d.alive(), d.lines[-10:]
        return False

    wait_for(ended_scraping_meanwhile, 120, "the job on the flaky GPUs to end (scraped every second)", interval=1)
    assert len(scrapes) >= 3 and all(status == 200 for status, _ in scrapes)
    text = scrapes[-1][1]
    assert 'spx_gpu_up{gpu="6"' in text and 'spx_gpu_up{gpu="1"' in text
    assert d.job("on-gpus")["state"] == "succeeded"
    given = {int(g) for r in job.runs() if r["event"] == "start" for g in r["gpus"].split(",")}
    assert len(given) == 4 and not given & {0, 6}, f"placed on {given}: GPU 0 cannot say it is free, 6 is lost"
    assert d.ls()
    scenario.survived = d.alive()
    d.stop()
    result = audit(d.root / "state" / "spx.sqlite", [job])
    scenario.record(result)
    assert result.clean, result
