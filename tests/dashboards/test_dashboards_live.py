"""End to end: every panel query, variable query, recording rule and alert expression of dashboards/
evaluated by a real Prometheus scraping the real daemon on the fake 8×H100 host (18 NVLink links per
GPU) with a real training job running on GPUs 0 and 1 (see dashboards_live.py for the stack); and the
exporter as Prometheus sees it, with the scrape checked by `promtool check metrics`.

"Returns data" is checked twice for a panel: as written (what Grafana shows), and with its
`or vector(0)` fallback removed and every comparison made `bool` (so a stat that counts down GPUs
still proves its selector matches). Alert expressions are checked in the `bool` form, which returns
a sample per series the alert watches, firing or not: a wrong metric, label or join gives no data.
The fixture's faulty GPU 3 (NVLink 7 down, XID 79) must fire SpxGpuXidError and SpxNvlinkDown.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from dashboards_live import JOB, JOB_GPUS, STRAGGLER_GPU, Prometheus
from dashboards_testlib import (
    LABEL_VALUES,
    PROMETHEUS_METRICS,
    bool_form,
    load_dashboards,
    load_rules,
    metric_names,
    promtool,
    substitute,
    targets,
    variable_queries,
    without_fallback,
)
from prometheus_client.parser import text_string_to_metric_families

from harness import wait_for
from spx.daemon.gpu.fake import DEFAULT_FIXTURE

# Template variables as Grafana would fill them: everything, then one job and its GPUs.
ALL = {"gpu": ".*", "spx_job": ".*", "link": ".*"}
# The second set proves each panel filters on the right label names (".*" matches a missing label).
ONE_JOB = {"gpu": "(0|1)", "spx_job": JOB, "link": "(0|7)"}
RANGES = {"__rate_interval": "30s", "__interval": "5s", "__range": "5m", "datasource": "prometheus"}


def _no_data(prom: Prometheus, queries: dict[str, str], retry_s: float = 30) -> dict[str, str]:
    """The queries that return no samples; ones that do not are retried for `retry_s` (a scrape may
    be late), so a failure means "never returned data", not "was unlucky once"."""
    pending = dict(queries)
    deadline = time.monotonic() + retry_s
    while True:
        pending = {where: q for where, q in pending.items() if not prom.query(q)}
        if not pending or time.monotonic() > deadline:
            return pending
        time.sleep(1)


def _panel_queries(instance: str, variables: dict[str, str]) -> dict[str, str]:
    values = {"instance": instance, **variables, **RANGES}
    out = {}
    for name, dashboard in load_dashboards().items():
        for where, expr in targets(dashboard):
            query = substitute(expr, values)
            out[f"{name}: {where}"] = query
            strict = bool_form(without_fallback(query))
            if strict != query:
                out[f"{name}: {where} (strict)"] = strict
    return out


@pytest.mark.parametrize("variables", [ALL, ONE_JOB], ids=["all", "one-job"])
def test_every_panel_query_returns_data(stack, variables):
    host, prom = stack
    missing = _no_data(prom, _panel_queries(host.address, variables))
    assert not missing, "panel queries without data:\n" + "\n".join(f"  {w}:\n    {q}" for w, q in missing.items())


def test_every_variable_query_returns_values(stack):
    host, prom = stack
    values = {"instance": host.address, **ALL}
    for name, dashboard in load_dashboards().items():
        for var, definition in variable_queries(dashboard):
            m = LABEL_VALUES.match(definition)
            assert m, f"{name}: {var}: {definition}"
            series = prom.query(substitute(m.group("selector"), values))
            found = {s["metric"].get(m.group("label")) for s in series} - {None}
            assert found, f"{name}: variable {var} has no values: {definition}"
            if var == "spx_job":
                assert found == {JOB}, f"the job variable must list spx jobs only: {found}"
            if var == "gpu":
                assert found == {str(i) for i in range(8)}


def test_every_recording_rule_returns_data(stack):
    _, prom = stack
    _, records = load_rules()
    missing = _no_data(prom, {r["record"]: r["record"] for r in records})
    assert not missing, f"recording rules without data: {sorted(missing)}"


def test_every_alert_expression_returns_data(stack):
    _, prom = stack
    alerts, _ = load_rules()
    missing = _no_data(prom, {a["alert"]: bool_form(a["expr"]) for a in alerts})
    assert not missing, "alert expressions without data:\n" + "\n".join(f"  {w}: {q}" for w, q in missing.items())


def _firing(prom: Prometheus, alertname: str) -> list[dict]:
    return [a["labels"] for a in prom.alerts() if a["labels"]["alertname"] == alertname and a["state"] == "firing"]


def test_xid_alert_fires_on_the_faulty_gpu(stack):
    _, prom = stack
    alert = next(a for a in load_rules()[0] if a["alert"] == "SpxGpuXidError")
    assert any(s["metric"]["gpu"] == "3" for s in prom.query(alert["expr"]))
    firing = wait_for(lambda: _firing(prom, "SpxGpuXidError"), 60, "SpxGpuXidError to fire")
    assert {(a["gpu"], a["xid"], a["severity"]) for a in firing} == {("3", "79", "critical")}


def test_nvlink_down_alert_fires_on_the_faulty_link(stack):
    _, prom = stack
    alert = next(a for a in load_rules()[0] if a["alert"] == "SpxNvlinkDown")
    assert {(s["metric"]["gpu"], s["metric"]["link"]) for s in prom.query(alert["expr"])} == {("3", "7")}
    firing = wait_for(lambda: _firing(prom, "SpxNvlinkDown"), 60, "SpxNvlinkDown to fire")
    assert {(a["gpu"], a["link"]) for a in firing} == {("3", "7")}


def test_healthy_fixture_fires_no_gpu_or_job_alert(stack):
    """Everything else on the fixture is healthy: no other GPU, NVLink or job alert fires (with
    `for: 0s`, so a threshold that is wrong by orders of magnitude would show here)."""
    _, prom = stack
    # SpxCollectorFailing is expected: the stack injects one failing NVML call; and the straggler on a
    # thermally throttled GPU (see dashboards_live).
    expected = {"SpxGpuXidError", "SpxNvlinkDown", "SpxCollectorFailing", "SpxJobStraggler", "SpxGpuThermalThrottling"}
    alerts = [a["labels"] for a in prom.alerts() if a["state"] == "firing"]
    assert {a["alertname"] for a in alerts} - expected == set()
    # the straggler's alerts name its GPU alone (its rank, and the thermal cause)
    slow = [a for a in alerts if a["alertname"] in ("SpxJobStraggler", "SpxGpuThermalThrottling")]
    assert {a["gpu"] for a in slow} <= {str(STRAGGLER_GPU)}, slow
    assert all(a.get("cause", "thermal") == "thermal" for a in slow), slow


def test_the_scrape_config_without_honor_labels_keeps_target_and_job_labels_apart(stack):
    """Prometheus' own `job` and `instance` are on every series as it set them (nothing renamed to
    exported_*); the spx job is in `spx_job`, on the GPUs it holds only; its owner on spx_job_info."""
    host, prom = stack
    assert [float(s["value"][1]) for s in prom.query('up{job="spx-trainer"}')] == [1.0]
    series = prom.query('{__name__=~"spx_.+"}')
    assert {(s["metric"]["job"], s["metric"]["instance"]) for s in series} == {("spx-trainer", host.address)}
    assert not prom.query('{exported_job=~".+"} or {exported_instance=~".+"}')
    jobs = {s["metric"]["gpu"]: s["metric"].get("spx_job") for s in prom.query("spx_gpu_info")}
    assert jobs == {str(i): (JOB if i in JOB_GPUS else None) for i in range(8)}
    (info,) = prom.query("spx_job_info")
    assert (info["metric"]["spx_job"], info["metric"]["owner"]) == (JOB, host.daemon.status(JOB)["owner"])


def test_every_metric_name_in_dashboards_exists_in_a_real_scrape(stack):
    host, _ = stack
    scraped = {s.name for family in text_string_to_metric_families(host.scrape()) for s in family.samples}
    alerts, records = load_rules()
    recorded = {r["record"] for r in records}
    used = set()
    for dashboard in load_dashboards().values():
        for _, expr in targets(dashboard):
            used |= metric_names(expr)
        for _, definition in variable_queries(dashboard):
            used |= metric_names(LABEL_VALUES.match(definition).group("selector"))
    for rule in alerts + records:
        used |= metric_names(rule["expr"])
    missing = used - recorded - PROMETHEUS_METRICS - scraped
    assert not missing, f"used in dashboards/ but not in a real scrape: {sorted(missing)}"


# --- the exporter as Prometheus sees it ---------------------------------------------------------

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
    assert 'spx_gpu_nvlink_up{' in text and f'spx_job="{JOB}"' in text
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
    labelled = {s["metric"]["gpu"] for s in prom.query(f'spx_gpu_up{{spx_job="{JOB}"}}')}
    assert labelled == {str(g) for g in JOB_GPUS}
    # Per-process GPU memory: one torchrun worker per GPU, attributed to the job and its live pids.
    procs = prom.query(f'spx_gpu_process_memory_used_bytes{{spx_job="{JOB}"}}')
    assert {s["metric"]["gpu"] for s in procs} == {str(g) for g in JOB_GPUS}
    job_pids = set(host.daemon.status(JOB)["pids"])
    assert {int(s["metric"]["pid"]) for s in procs} <= job_pids, (procs, job_pids)
