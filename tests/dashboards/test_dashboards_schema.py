"""The dashboards' JSON: generated from dashboards/spx_dashboards/, and shaped the way Grafana 10.4 / 11
imports it (schema version 39, a `datasource` variable, panels on the 24-column grid, ...).

This is our schema test: Grafana's own schema is CUE inside Grafana, not a file we can load here, so
these are the properties whose absence makes an import fail or a panel show "No data".
"""

from __future__ import annotations

import json

import pytest
from dashboards_testlib import (
    BUILTIN_VARIABLES,
    DASHBOARDS,
    import_builder,
    load_dashboards,
    load_rules,
    panels,
    variables_used,
)

DASHBOARD_FILES = ["spx-host-gpus.json", "spx-nvlink.json", "spx-jobs.json"]
PANEL_TYPES = {"row", "stat", "timeseries", "table", "state-timeline", "bargauge"}
TRANSFORMATIONS = {"merge", "organize", "groupingToMatrix"}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


@pytest.fixture(scope="module")
def dashboards() -> dict[str, dict]:
    return load_dashboards()


def test_checked_in_json_is_what_the_builder_generates(tmp_path):
    build = import_builder()
    assert build.main(["--out", str(tmp_path)]) == 0
    for name in DASHBOARD_FILES:
        assert (tmp_path / name).read_text() == (DASHBOARDS / name).read_text(), (
            f"{name} differs from the builder's output; run: python dashboards/build.py")
    assert build.main(["--check"]) == 0


def test_the_three_dashboards_exist(dashboards):
    assert sorted(dashboards) == sorted(DASHBOARD_FILES)


@pytest.mark.parametrize("name", DASHBOARD_FILES)
def test_dashboard_top_level(dashboards, name):
    d = dashboards[name]
    assert d["schemaVersion"] >= 39
    assert d["uid"] and len(d["uid"]) <= 40 and d["uid"].replace("-", "").isalnum()
    assert d["title"].startswith("spx-trainer / ")
    assert d["id"] is None, "an exported dashboard must not carry a database id"
    assert "spx-trainer" in d["tags"]
    assert d["time"]["from"] and d["time"]["to"]
    assert isinstance(d["annotations"]["list"], list)
    json.dumps(d, allow_nan=False)


def test_uids_and_titles_are_unique(dashboards):
    assert len({d["uid"] for d in dashboards.values()}) == len(dashboards)
    assert len({d["title"] for d in dashboards.values()}) == len(dashboards)


@pytest.mark.parametrize("name", DASHBOARD_FILES)
def test_template_variables(dashboards, name):
    variables = dashboards[name]["templating"]["list"]
    by_name = {v["name"]: v for v in variables}
    assert len(by_name) == len(variables), "duplicate variable names"
    assert {"datasource", "instance", "gpu", "spx_job"} <= set(by_name)
    ds = by_name["datasource"]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"
    defined = set()
    for var in variables:
        if var["type"] == "query":
            assert var["datasource"] == DATASOURCE, var["name"]
            assert var["definition"].startswith("label_values(")
            assert var["query"]["query"] == var["definition"]
            # A variable may only use variables defined before it (Grafana resolves them in order).
            assert variables_used(var["definition"]) <= defined, var["name"]
            if var["includeAll"]:
                assert var["multi"], var["name"]
        defined.add(var["name"])


@pytest.mark.parametrize("name", DASHBOARD_FILES)
def test_panels(dashboards, name):
    d = dashboards[name]
    variables = {v["name"] for v in d["templating"]["list"]} | BUILTIN_VARIABLES
    ids = [p["id"] for p in panels(d)]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    assert all(isinstance(i, int) and i > 0 for i in ids)
    for panel in panels(d):
        where = f"{name}: {panel.get('title')!r}"
        assert panel["type"] in PANEL_TYPES, where
        assert panel["title"], where
        pos = panel["gridPos"]
        assert set(pos) == {"h", "w", "x", "y"} and all(isinstance(v, int) and v >= 0 for v in pos.values()), where
        assert pos["w"] >= 1 and pos["h"] >= 1 and pos["x"] + pos["w"] <= 24, where
        if panel["type"] == "row":
            assert pos["w"] == 24 and "targets" not in panel, where
            continue
        assert panel["datasource"] == DATASOURCE, where
        assert panel.get("description"), f"{where}: every panel says what it shows"
        assert "fieldConfig" in panel and "defaults" in panel["fieldConfig"], where
        targets = panel["targets"]
        assert targets, where
        ref_ids = [t["refId"] for t in targets]
        assert len(ref_ids) == len(set(ref_ids)), where
        for t in targets:
            assert t["datasource"] == DATASOURCE, where
            assert t["expr"].strip(), where
            assert t["expr"].count("(") == t["expr"].count(")"), f"{where}: unbalanced parentheses"
            assert variables_used(t["expr"]) <= variables, f"{where}: undefined variable in {t['expr']}"
            if panel["type"] == "table":
                assert t["format"] == "table" and t["instant"], where
        for step in panel.get("transformations", []):
            assert step["id"] in TRANSFORMATIONS, where


@pytest.mark.parametrize("name", DASHBOARD_FILES)
def test_panels_do_not_overlap(dashboards, name):
    taken: dict[tuple[int, int], str] = {}
    for panel in dashboards[name]["panels"]:
        pos = panel["gridPos"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in taken, f"{panel['title']!r} overlaps {taken[(x, y)]!r}"
                taken[(x, y)] = panel["title"]


def test_no_fixed_datasource_anywhere(dashboards):
    def walk(node, path):
        if isinstance(node, dict):
            ds = node.get("datasource")
            if isinstance(ds, dict) and ds.get("type") == "prometheus":
                assert ds["uid"] == "${datasource}", path
            for key, value in node.items():
                walk(value, f"{path}.{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{path}[{i}]")

    for name, d in dashboards.items():
        walk(d, name)


def test_required_panels_exist(dashboards):
    """The issue's list: what each dashboard must show."""
    def titles(name):
        return " | ".join(p["title"].lower() for p in panels(dashboards[name]))

    host = titles("spx-host-gpus.json")
    for word in ("utilization", "memory", "power", "temperature", "clock", "throttle", "job on each gpu",
                 "xid", "ecc", "nvlink", "host goodput", "host badput by cause"):
        assert word in host, word
    nvlink = titles("spx-nvlink.json")
    for word in ("link state (gpu × link)", "transmit per gpu", "receive per gpu", "transmit per link",
                 "receive per link", "error rate"):
        assert word in nvlink, word
    jobs = titles("spx-jobs.json")
    for word in ("state", "restarts by reason", "step", "samples per second", "time since last checkpoint",
                 "gpus held", "goodput", "badput by cause"):
        assert word in jobs, word


def test_job_state_codes_match_the_recording_rule():
    import_builder()
    from spx_dashboards.common import JOB_STATES  # on sys.path once import_builder() ran

    _, records = load_rules()
    (rule,) = [r for r in records if r["record"] == "instance_spx_job:spx_job_state:code"]
    for code, state in enumerate(JOB_STATES, start=1):
        assert f'spx_job_state{{state="{state}"}} * {code}' in rule["expr"]
