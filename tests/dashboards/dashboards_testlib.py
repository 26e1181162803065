"""What the dashboard tests share: loading dashboards and rules, and a little PromQL text handling.

The PromQL helpers work on the text, not a parse tree (promtool 2.42 has no parser command). They
only need to handle the expressions in dashboards/: strings, label matchers `{...}` and ranges
`[...]` are skipped, so an `=` or `!=` inside a matcher is never mistaken for an operator.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS = REPO / "dashboards"
RULES = DASHBOARDS / "rules"
RULE_FILES = [RULES / "spx_recording.yml", RULES / "spx_alerts.yml"]
TEST_FILES = [RULES / "spx_recording_test.yml", RULES / "spx_alerts_test.yml"]

# The exporter contract (dashboards' brief; spx.daemon.exporter.metrics is the source).
CONTRACT_METRICS = frozenset({
    "spx_gpu_up", "spx_gpu_info", "spx_gpu_utilization_ratio", "spx_gpu_memory_utilization_ratio",
    "spx_gpu_memory_used_bytes", "spx_gpu_memory_free_bytes", "spx_gpu_memory_total_bytes",
    "spx_gpu_power_watts", "spx_gpu_power_limit_watts", "spx_gpu_energy_joules_total",
    "spx_gpu_temperature_celsius", "spx_gpu_sm_clock_hertz", "spx_gpu_memory_clock_hertz",
    "spx_gpu_clocks_event_active", "spx_gpu_pcie_transmit_bytes_per_second",
    "spx_gpu_pcie_receive_bytes_per_second", "spx_gpu_ecc_errors_total", "spx_gpu_remapped_rows",
    "spx_gpu_xid_errors_total", "spx_gpu_process_memory_used_bytes", "spx_gpu_nvlink_up",
    "spx_gpu_nvlink_transmit_bytes_total", "spx_gpu_nvlink_receive_bytes_total",
    "spx_gpu_nvlink_errors_total", "spx_job_info", "spx_job_state", "spx_job_restarts_total", "spx_job_step",
    "spx_job_samples_per_second", "spx_job_last_checkpoint_timestamp_seconds", "spx_job_gpus",
    "spx_job_attempts", "spx_job_rank_step_seconds", "spx_job_straggler", "spx_scrape_duration_seconds",
    "spx_scrape_success", "spx_nvml_errors_total", "spx_build_info", "spx_job_seconds_total",
    "spx_job_unsettled_seconds", "spx_host_gpu_seconds_total", "spx_host_unsettled_gpu_seconds",
    "spx_job_standby_memory_bytes", "spx_standby_memory_bytes",
})
PROMETHEUS_METRICS = frozenset({"up"})  # written by Prometheus itself for every target
BUILTIN_VARIABLES = frozenset({"__rate_interval", "__interval", "__range", "__interval_ms", "__range_s"})


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        raise AssertionError("promtool not found: install Debian's `prometheus` package (apt-get install prometheus)")
    return path


# --- dashboards ------------------------------------------------------------------------------


def load_dashboards() -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def import_builder():
    """The `build` module of dashboards/ (the generator), imported from its folder."""
    if str(DASHBOARDS) not in sys.path:
        sys.path.insert(0, str(DASHBOARDS))  # build.py imports its package, spx_dashboards, from there
    spec = importlib.util.spec_from_file_location("spx_dashboards_build", DASHBOARDS / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def panels(dashboard: dict) -> Iterator[dict]:
    """Every panel, including those nested in collapsed rows."""
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def targets(dashboard: dict) -> Iterator[tuple[str, str]]:
    """(panel title / refId, expr) of every query of every panel."""
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            yield f"{panel['title']} / {target.get('refId')}", target["expr"]


def variable_queries(dashboard: dict) -> Iterator[tuple[str, str]]:
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            yield var["name"], var["definition"]


LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.*),\s*(?P<label>[a-zA-Z_]\w*)\)$")


def substitute(expr: str, values: dict[str, str]) -> str:
    """Replace Grafana's `$name` / `${name}` with `values[name]`; unknown variables raise KeyError."""
    def repl(m: re.Match) -> str:
        return values[m.group(1) or m.group(2)]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", repl, expr)


def variables_used(expr: str) -> set[str]:
    return {a or b for a, b in re.findall(r"\$\{(\w+)\}|\$(\w+)", expr)}


# --- rules -----------------------------------------------------------------------------------


def load_rules() -> tuple[list[dict], list[dict]]:
    """(alerting rules, recording rules) of dashboards/rules/."""
    alerts, records = [], []
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                (alerts if "alert" in rule else records).append(rule)
    return alerts, records


# --- PromQL text -----------------------------------------------------------------------------

_SKIP = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`|\{[^}]*\}|\[[^\]]*\]')
_COMPARISON = re.compile(r"(==|!=|>=|<=|>|<)(\s+bool\b)?")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"(?<![\w:.])[a-zA-Z_:][\w:]*")
_KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
                       "group_left", "group_right", "inf", "nan", "Inf", "NaN"})


def _outside(expr: str, fn) -> str:
    """Apply `fn` to the parts of `expr` that are not strings, matchers or ranges."""
    out, pos = [], 0
    for m in _SKIP.finditer(expr):
        out.append(fn(expr[pos:m.start()]))
        out.append(m.group(0))
        pos = m.end()
    out.append(fn(expr[pos:]))
    return "".join(out)


def bool_form(expr: str) -> str:
    """`expr` with every comparison made a `bool` comparison: it then returns a 0/1 sample for each
    series the comparison sees, so "no data" means a wrong metric, label or join, not "not firing"."""
    return _outside(expr, lambda s: _COMPARISON.sub(lambda m: f"{m.group(1)} bool", s))


def without_fallback(expr: str) -> str:
    """`expr` without a trailing `or vector(0)` (the "show 0, not No data" fallback of stat panels)."""
    return re.sub(r"\s+or\s+(on\s*\(\s*\)\s*)?vector\(0\)\s*$", "", expr)


def metric_names(expr: str) -> set[str]:
    """Metric names an expression reads (functions, keywords, label names and strings excluded)."""
    names: set[str] = set()

    def scan(part: str) -> str:
        part = _GROUPING.sub(" ", part)
        for m in _IDENT.finditer(part):
            is_call = part[m.end():].lstrip().startswith("(")
            if not is_call and m.group(0) not in _KEYWORDS:
                names.add(m.group(0))
        return part

    _outside(expr, scan)
    return names
