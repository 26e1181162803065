"""Every metric the dashboards and rules read is one the exporter contract has (or one our recording
rules make), and the PromQL text helpers the live test relies on do what they say."""

from __future__ import annotations

import pytest
from dashboards_testlib import (
    CONTRACT_METRICS,
    LABEL_VALUES,
    PROMETHEUS_METRICS,
    bool_form,
    import_builder,
    load_dashboards,
    load_rules,
    metric_names,
    targets,
    variable_queries,
    without_fallback,
)


def _recorded() -> set[str]:
    return {r["record"] for r in load_rules()[1]}


def _dashboard_metrics() -> dict[str, set[str]]:
    used: dict[str, set[str]] = {}
    for name, d in load_dashboards().items():
        for where, expr in targets(d):
            for metric in metric_names(expr):
                used.setdefault(metric, set()).add(f"{name}: {where}")
        for var, definition in variable_queries(d):
            m = LABEL_VALUES.match(definition)
            assert m, f"{name}: variable {var}: {definition}"
            for metric in metric_names(m.group("selector")):
                used.setdefault(metric, set()).add(f"{name}: variable {var}")
    return used


def _rule_metrics() -> dict[str, set[str]]:
    alerts, records = load_rules()
    used: dict[str, set[str]] = {}
    for rule in alerts + records:
        for metric in metric_names(rule["expr"]):
            used.setdefault(metric, set()).add(rule.get("alert") or rule["record"])
    return used


def test_dashboards_use_only_contract_and_recorded_metrics():
    used = _dashboard_metrics()
    unknown = {m: w for m, w in used.items() if m not in CONTRACT_METRICS | PROMETHEUS_METRICS | _recorded()}
    assert not unknown, f"metrics not in the exporter contract nor recorded: {unknown}"


def test_rules_use_only_contract_and_recorded_metrics():
    used = _rule_metrics()
    unknown = {m: w for m, w in used.items() if m not in CONTRACT_METRICS | PROMETHEUS_METRICS | _recorded()}
    assert not unknown, f"metrics not in the exporter contract nor recorded: {unknown}"


def test_dashboards_show_the_contract():
    """Nothing the exporter offers for users is left off the dashboards, directly or through a
    recording rule they read."""
    shown = set(_dashboard_metrics())
    for rule in load_rules()[1]:
        if rule["record"] in shown:
            shown |= metric_names(rule["expr"])
    assert CONTRACT_METRICS - shown == set()


def test_contract_matches_the_exporters_metric_table():
    metrics = pytest.importorskip("spx.daemon.exporter.metrics")
    exported = {spec.name for spec in metrics.SPECS}
    assert exported >= CONTRACT_METRICS, CONTRACT_METRICS - exported


def test_job_states_match_the_exporter():
    job_collector = pytest.importorskip("spx.daemon.exporter.job_collector")
    import_builder()
    from spx_dashboards.common import JOB_STATES  # on sys.path once import_builder() ran

    assert tuple(JOB_STATES) == tuple(job_collector.JOB_STATES)


# --- the helpers -----------------------------------------------------------------------------


def test_metric_names_skip_functions_labels_and_strings():
    expr = ('label_replace(0 * max by (gpu) (instance_spx_job:spx_job_state:code{gpu=~"$gpu", spx_job=""}), "spx_job",'
            ' "idle", "", "") or sum without (spx_job) (rate(spx_gpu_nvlink_errors_total[5m] offset 10m))'
            ' and on (instance, spx_job) up == 1 * on (job) group_left (owner) spx_job_info')
    assert metric_names(expr) == {"instance_spx_job:spx_job_state:code", "spx_gpu_nvlink_errors_total", "up", "spx_job_info"}


def test_bool_form_leaves_matchers_alone():
    expr = 'x{a!="1", b=~"2"} > 0 and on (job) y{state="running"} == 1 unless z >= bool 3'
    assert bool_form(expr) == 'x{a!="1", b=~"2"} > bool 0 and on (job) y{state="running"} == bool 1 unless z >= bool 3'


def test_without_fallback():
    assert without_fallback("count(x == 0) or vector(0)") == "count(x == 0)"
    assert without_fallback("sum(x)") == "sum(x)"
