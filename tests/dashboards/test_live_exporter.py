"""The exporter as Prometheus sees it: the real daemon on the fake 8×H100 host (18 NVLink links per
GPU) with a real torchrun job on GPUs 0 and 1, scraped by a real Prometheus (the stack of
dashboards_live.py), and the scrape checked by `promtool check metrics`.
"""

from __future__ import annotations

import json
import subprocess

from dashboards_live import JOB, JOB_GPUS
from dashboards_testlib import promtool

from spx.daemon.gpu.fake import DEFAULT_FIXTURE

GPUS = {str(i) for i in range(8)}


def _values(prom, expr: str) -> dict[str, float]:
    """{gpu: value} of an instant query whose series each carry a distinct `gpu` label."""
    series = prom.query(expr)
    out = {s["metric"]["gpu"]: float(s["value"][1]) for s in series}
    assert len(out) == len(series), f"{expr}: more than one series per GPU: {series}"
    return out


def test_promtool_finds_no_problem_in_a_scrape_of_the_daemon(stack):
    host, _ = stack
    text = host.scrape()
    assert 'spx_gpu_nvlink_up{' in text and f'job="{JOB}"' in text
    res = subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and not res.stdout.strip() and not res.stderr.strip(), res.stdout + res.stderr


def test_prometheus_sees_every_nvlink_link_of_the_8_gpus(stack):
    _, prom = stack
    (count,) = prom.query("count(spx_gpu_nvlink_up)")
    assert float(count["value"][1]) == 144
    per_gpu = _values(prom, "count by (gpu) (spx_gpu_nvlink_up)")
    assert per_gpu == {g: 18.0 for g in GPUS}
    # The fixture's one faulty link, and traffic counters for every link.
    assert [(s["metric"]["gpu"], s["metric"]["link"]) for s in prom.query("spx_gpu_nvlink_up == 0")] == [("3", "7")]
    (tx,) = prom.query("count(spx_gpu_nvlink_transmit_bytes_total)")
    assert float(tx["value"][1]) == 144


def test_prometheus_has_memory_and_utilization_for_the_8_gpus(stack):
    _, prom = stack
    total = _values(prom, "spx_gpu_memory_total_bytes")
    used = _values(prom, "spx_gpu_memory_used_bytes")
    free = _values(prom, "spx_gpu_memory_free_bytes")
    util = _values(prom, "spx_gpu_utilization_ratio")
    assert set(total) == set(used) == set(free) == set(util) == GPUS
    fixture_mib = json.loads(DEFAULT_FIXTURE.read_text())["defaults"]["memory_total_mib"]  # 81559: an H100 80GB
    for g in GPUS:
        assert total[g] == fixture_mib * 1024**2 and 0 < used[g] < total[g] and free[g] <= total[g] - used[g]
        assert 0 <= util[g] <= 1
    # The job's GPUs are the busy ones (the fake reports a GPU busy while a worker can see it).
    assert all(util[str(g)] > util["4"] for g in JOB_GPUS)


def test_the_gpus_of_the_running_job_carry_its_label(stack):
    host, prom = stack
    labelled = {s["metric"]["gpu"] for s in prom.query(f'spx_gpu_up{{job="{JOB}"}}')}
    assert labelled == {str(g) for g in JOB_GPUS}
    # Per-process GPU memory: one torchrun worker per GPU, attributed to the job and its live pids.
    procs = prom.query(f'spx_gpu_process_memory_used_bytes{{job="{JOB}"}}')
    assert {s["metric"]["gpu"] for s in procs} == {str(g) for g in JOB_GPUS}
    job_pids = set(host.daemon.status(JOB)["pids"])
    assert {int(s["metric"]["pid"]) for s in procs} <= job_pids, (procs, job_pids)
