"""The goodput ledger of a real job (torchrun, gloo on CPU) that crashes once past its last
checkpoint: `spx status --json` and /metrics account for its whole wall time, and the steps the crash
lost show as recomputed time."""

from __future__ import annotations

import sys
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness import EXAMPLES, Daemon, wait_for

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
    assert ledger["unsettled_seconds"] == 0, ledger   # an ended job's every second is settled
    assert seconds["recomputed"] > 0, ledger
    assert seconds["productive"] > seconds["recomputed"], ledger
    assert seconds["restart_restore"] > 0 and seconds["restart_teardown"] >= 0, ledger
    assert seconds["unknown"] == 0 and seconds["daemon"] == 0 and seconds["hang"] == 0, ledger
    assert ledger["gpu_seconds"]["productive"] == pytest.approx(2 * seconds["productive"], abs=0.01)

    metrics = scrape(daemon)
    job = {labels: v for labels, v in metrics["spx_job_seconds"].items() if ("spx_job", "goodput") in labels}
    assert sum(job.values()) == pytest.approx(sum(seconds.values()), abs=0.01)
    host = {dict(labels)["cause"]: v for labels, v in metrics["spx_host_gpu_seconds"].items()}
    assert host["productive"] == pytest.approx(ledger["gpu_seconds"]["productive"], abs=0.01)
    assert host["idle"] > 0


def test_a_job_adopted_across_a_daemon_kill9_lost_no_steps_and_has_no_daemon_time(tmp_path):
    """A script that beats a step every 0.2 s runs on while the daemon is killed and restarted: its
    adopted attempt's progress record is carried on, so the outage is productive time, not daemon
    time, and nothing is recomputed."""
    release = tmp_path / "release"
    script = tmp_path / "beats.py"
    script.write_text(
        "import os, time\nfrom spx.daemon.contract.worker_env import Heartbeat, write_heartbeat\n"
        "step, left = 0, 5\n"
        "while left:\n"
        "    time.sleep(0.2)\n    step += 1\n"
        f"    left -= os.path.exists({str(release)!r})\n"
        "    write_heartbeat(os.environ['SPX_HEARTBEAT_FILE'], Heartbeat(step=step))\n")
    d = Daemon(tmp_path / "root").start()
    try:
        d.drop("a.yaml", f"name: adopted\nlauncher: python\nscript: {script}\npython: {PY}\n")
        wait_for(lambda: ((d.job("adopted") or {}).get("step") or 0) >= 5, 60, "steps")
        d.kill9()
        time.sleep(2)  # the outage: the job trains on with no daemon
        d.start()
        d.wait_event("adopted_after_restart", job="adopted")
        release.touch()
        d.wait_state("adopted", {"succeeded", "failed"}, 60)
        st = d.status("adopted")
    finally:
        d.stop()
    assert st["state"] == "succeeded" and len(st["history"]) == 1, st
    ledger, wall = st["ledger"], st["history"][-1]["end"] - st["submitted"]
    seconds = ledger["seconds"]
    assert abs(sum(seconds.values()) - wall) <= 0.01 * wall, (wall, ledger)
    assert seconds["daemon"] == 0 and seconds["recomputed"] == 0 and seconds["unknown"] == 0, ledger
    # Its training from the first beat (before the kill) to the last (after the restart) is kept.
    assert seconds["productive"] >= 2, ledger
    assert seconds["startup"] < seconds["productive"], ledger
