"""The goodput ledger of a real job (torchrun, gloo on CPU) that crashes once past its last
checkpoint: `spx status --json` and /metrics account for its whole wall time, and the steps the crash
lost show as recomputed time."""

from __future__ import annotations

import sys
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness import EXAMPLES, Daemon

PY = sys.executable


@pytest.fixture
def daemon(tmp_path):
    d = Daemon(tmp_path / "root", gpu_backend="fake").start()
    yield d
    d.stop()


def scrape(d: Daemon) -> dict[str, dict[tuple, float]]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{d.metrics_port}/metrics", timeout=30).read().decode()
    return {fam.name: {tuple(sorted(s.labels.items())): s.value for s in fam.samples}
            for fam in text_string_to_metric_families(text)}


@pytest.mark.slow
def test_a_job_that_crashed_once_has_a_ledger_summing_to_its_wall_time_with_recomputed_steps(daemon):
    # 0.2 s a step, a checkpoint every 10 steps, a crash at step 29: steps 21-29 (1.8 s, past the
    # heartbeat's 1 s interval) are lost and trained again from step 20.
    argv = ", ".join(f'"{a}"' for a in ("--batch_size", "4", "--model-size", "tiny", "--seed", "7", "--steps", "40",
                                        "--checkpoint-every", "10", "--crash-at-step", "29", "--sleep-per-step", "0.2"))
    daemon.drop("g.yaml", f"name: goodput\nlauncher: torchrun\nscript: {EXAMPLES / 'train_ddp.py'}\npython: {PY}\n"
                          f"args: [{argv}]\ngpus: 2\nprocs: 2\nrestart: {{max_restarts: 3, backoff_seconds: [1, 10]}}\n")
    daemon.wait_state("goodput", {"succeeded", "failed"}, 300)
    st = daemon.status("goodput")
    assert st["state"] == "succeeded", st
    assert [a["resumed_from_step"] for a in st["history"]] == [None, 20]
    ledger = st["ledger"]
    wall = st["history"][-1]["end"] - st["submitted"]
    seconds = ledger["seconds"]
    assert abs(sum(seconds.values()) - wall) <= 0.01 * wall, (wall, ledger)
    assert abs(ledger["wall_seconds"] - wall) <= 0.01 * wall, (wall, ledger)
    assert seconds["recomputed"] > 0, ledger
    assert seconds["productive"] > seconds["recomputed"], ledger
    assert seconds["restart_restore"] > 0 and seconds["restart_teardown"] >= 0, ledger
    assert seconds["unknown"] == 0 and seconds["daemon"] == 0 and seconds["hang"] == 0, ledger
    assert ledger["gpu_seconds"]["productive"] == pytest.approx(2 * seconds["productive"], abs=0.01)

    metrics = scrape(daemon)
    job = {labels: v for labels, v in metrics["spx_job_seconds"].items() if ("job", "goodput") in labels}
    assert sum(job.values()) == pytest.approx(sum(seconds.values()), abs=0.01)
    host = {dict(labels)["cause"]: v for labels, v in metrics["spx_host_gpu_seconds"].items()}
    assert host["productive"] == pytest.approx(ledger["gpu_seconds"]["productive"], abs=0.01)
    assert host["idle"] > 0
