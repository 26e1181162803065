"""The alerting and recording rules: promtool accepts them, their unit tests pass, and every alert
has a test where it fires and one where it does not."""

from __future__ import annotations

import subprocess

import pytest
import yaml
from dashboards_testlib import DASHBOARDS, RULE_FILES, RULES, TEST_FILES, load_rules, promtool


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=120, cwd=RULES)


def test_promtool_check_rules():
    result = _run("check", "rules", *map(str, RULE_FILES))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("test_file", TEST_FILES, ids=lambda p: p.name)
def test_promtool_test_rules(test_file):
    result = _run("test", "rules", test_file.name)
    assert result.returncode == 0, result.stdout + result.stderr


def test_sample_prometheus_config_is_valid():
    result = _run("check", "config", str(DASHBOARDS / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_sample_config_leaves_target_labels_to_prometheus():
    """The exporter names its job in `spx_job`, so the scrape needs no honor_labels (with which an
    exporter could overwrite `job` and `instance`)."""
    config = yaml.safe_load((DASHBOARDS / "prometheus.yml").read_text())
    (scrape,) = [s for s in config["scrape_configs"] if s["job_name"] == "spx-trainer"]
    assert "honor_labels" not in scrape
    assert sorted(config["rule_files"]) == sorted(f"rules/{p.name}" for p in RULE_FILES)


def _alert_tests() -> dict[str, dict[str, int]]:
    """alertname -> {"firing": n, "silent": n} over the alert test file."""
    seen: dict[str, dict[str, int]] = {}
    doc = yaml.safe_load((RULES / "spx_alerts_test.yml").read_text())
    for test in doc["tests"]:
        for case in test.get("alert_rule_test", []):
            counts = seen.setdefault(case["alertname"], {"firing": 0, "silent": 0})
            counts["firing" if case.get("exp_alerts") else "silent"] += 1
    return seen


def test_every_alert_is_tested_firing_and_not_firing():
    alerts, _ = load_rules()
    seen = _alert_tests()
    missing = {a["alert"]: seen.get(a["alert"]) for a in alerts
               if not seen.get(a["alert"], {}).get("firing") or not seen.get(a["alert"], {}).get("silent")}
    assert not missing, f"alerts without both a firing and a not-firing promtool case: {missing}"
    unknown = set(seen) - {a["alert"] for a in alerts}
    assert not unknown, f"tests for alerts that do not exist: {unknown}"


def test_every_recording_rule_is_tested():
    _, records = load_rules()
    doc = yaml.safe_load((RULES / "spx_recording_test.yml").read_text())
    tested = {case["expr"] for test in doc["tests"] for case in test.get("promql_expr_test", [])}
    assert {r["record"] for r in records} <= tested


def test_alerts_carry_severity_and_runbook():
    alerts, _ = load_rules()
    for alert in alerts:
        assert alert["labels"].get("severity"), alert["alert"]
        assert {"summary", "description", "runbook"} <= set(alert["annotations"]), alert["alert"]
        assert alert["alert"].startswith("Spx"), alert["alert"]


def test_alert_names_are_unique():
    alerts, records = load_rules()
    names = [a["alert"] for a in alerts]
    assert len(names) == len(set(names))
    assert len({r["record"] for r in records}) == len(records)
