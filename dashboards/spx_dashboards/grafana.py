"""A small builder for Grafana dashboard JSON (schema version 39: Grafana 10.4 and 11 import it as is).

Why our own and not Grafana's foundation SDK: the SDK is not on PyPI for Python in a form we can pin,
and the dashboards need a dozen panel shapes, not the whole model. Every function returns plain dicts
in the exact shape Grafana exports, so the checked-in JSON reads like an export and diffs cleanly.

Contract: panels are built without `id`/`gridPos`; `dashboard()` lays them out left to right in a
24-column grid (a `row()` starts a new line) and numbers them, so ids are unique by construction.
Every panel and every query uses the `${datasource}` template variable, never a fixed datasource uid.
"""

from __future__ import annotations

from typing import Any

SCHEMA_VERSION = 39
GRID_WIDTH = 24
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

Panel = dict[str, Any]


# --- queries ---------------------------------------------------------------------------------


def query(expr: str, legend: str = "__auto", *, instant: bool = False, table: bool = False) -> dict:
    """One PromQL target. `table` makes an instant query in table format (one row per series,
    labels as columns), the shape the table transformations below expect."""
    instant = instant or table
    return {
        "datasource": DATASOURCE,
        "editorMode": "code",
        "expr": expr,
        "format": "table" if table else "time_series",
        "instant": instant,
        "range": not instant,
        "legendFormat": legend,
    }


def _with_ref_ids(targets: list[dict]) -> list[dict]:
    return [{**t, "refId": chr(ord("A") + i)} for i, t in enumerate(targets)]


# --- variables -------------------------------------------------------------------------------


def datasource_variable() -> dict:
    return {
        "name": "datasource",
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "hide": 0,
        "includeAll": False,
        "multi": False,
        "options": [],
        "refresh": 1,
        "regex": "",
    }


def query_variable(
    name: str,
    label: str,
    definition: str,
    *,
    multi: bool = False,
    include_all: bool = False,
    all_value: str | None = None,
    numeric_sort: bool = False,
) -> dict:
    """A variable filled by `label_values(...)` from Prometheus, refreshed when the time range
    changes (so a GPU that appears mid-day shows up). `all_value` None lets Grafana expand "All" to
    the current options, which is how one variable filters the next (job narrows gpu)."""
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "definition": definition,
        "query": {"query": definition, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
        "current": {},
        "hide": 0,
        "includeAll": include_all,
        "allValue": all_value,
        "multi": multi,
        "options": [],
        "refresh": 2,
        "regex": "",
        "skipUrlSync": False,
        "sort": 3 if numeric_sort else 1,
    }


# --- panels ----------------------------------------------------------------------------------


def _panel(kind: str, title: str, description: str, targets: list[dict], w: int, h: int) -> Panel:
    if not 1 <= w <= GRID_WIDTH:
        raise ValueError(f"panel {title!r}: width {w} is outside 1..{GRID_WIDTH}")
    return {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "targets": _with_ref_ids(targets),
        "_size": (w, h),
    }


def _field_config(unit: str, *, decimals: int | None = None, min_: float | None = None,
                  max_: float | None = None, mappings: list | None = None,
                  thresholds: list | None = None, no_value: str | None = None,
                  custom: dict | None = None, color_mode: str = "palette-classic") -> dict:
    defaults: dict[str, Any] = {
        "unit": unit,
        "color": {"mode": color_mode},
        "mappings": mappings or [],
        "thresholds": {"mode": "absolute", "steps": thresholds or [{"color": "green", "value": None}]},
    }
    for key, value in (("decimals", decimals), ("min", min_), ("max", max_), ("noValue", no_value)):
        if value is not None:
            defaults[key] = value
    if custom:
        defaults["custom"] = custom
    return {"defaults": defaults, "overrides": []}


def timeseries(title: str, description: str, targets: list[dict], *, unit: str = "short",
               w: int = 12, h: int = 8, min_: float | None = None, max_: float | None = None,
               stack: bool = False, bars: bool = False) -> Panel:
    p = _panel("timeseries", title, description, targets, w, h)
    custom = {
        "drawStyle": "bars" if bars else "line",
        "lineWidth": 1,
        "fillOpacity": 80 if bars else 10,
        "showPoints": "never",
        "spanNulls": False,
        "stacking": {"mode": "normal" if stack else "none", "group": "A"},
        "axisPlacement": "auto",
    }
    p["fieldConfig"] = _field_config(unit, min_=min_, max_=max_, custom=custom)
    p["options"] = {
        "legend": {"displayMode": "table", "placement": "right", "showLegend": True,
                   "calcs": ["lastNotNull", "max"]},
        "tooltip": {"mode": "multi", "sort": "desc"},
    }
    return p


def stat(title: str, description: str, targets: list[dict], *, unit: str = "short", w: int = 4,
         h: int = 4, thresholds: list | None = None, mappings: list | None = None,
         decimals: int | None = None, text_mode: str = "auto") -> Panel:
    p = _panel("stat", title, description, targets, w, h)
    p["fieldConfig"] = _field_config(unit, decimals=decimals, thresholds=thresholds,
                                     mappings=mappings, color_mode="thresholds")
    p["options"] = {
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        "colorMode": "background" if thresholds else "value",
        "graphMode": "none",
        "justifyMode": "auto",
        "orientation": "auto",
        "textMode": text_mode,
    }
    return p


def bargauge(title: str, description: str, targets: list[dict], *, unit: str = "short",
             w: int = 12, h: int = 8, thresholds: list | None = None) -> Panel:
    p = _panel("bargauge", title, description, targets, w, h)
    p["fieldConfig"] = _field_config(unit, thresholds=thresholds, min_=0, color_mode="thresholds")
    p["options"] = {
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        "displayMode": "gradient",
        "orientation": "horizontal",
        "showUnfilled": True,
    }
    return p


def state_timeline(title: str, description: str, targets: list[dict], *, mappings: list,
                   w: int = 24, h: int = 8) -> Panel:
    p = _panel("state-timeline", title, description, targets, w, h)
    p["fieldConfig"] = _field_config("short", mappings=mappings, color_mode="thresholds",
                                     custom={"fillOpacity": 80, "lineWidth": 0})
    p["options"] = {
        "mergeValues": True,
        "showValue": "auto",
        "alignValue": "left",
        "rowHeight": 0.9,
        "legend": {"displayMode": "list", "placement": "bottom", "showLegend": False},
        "tooltip": {"mode": "single", "sort": "none"},
    }
    return p


def table(title: str, description: str, targets: list[dict], *, transformations: list,
          unit: str = "short", w: int = 24, h: int = 8, mappings: list | None = None,
          thresholds: list | None = None, cell: str = "auto", overrides: list | None = None,
          no_value: str | None = None) -> Panel:
    """A table of instant queries; `cell` "color-background" colours cells by mappings/thresholds
    (the link-state and throttle matrices)."""
    p = _panel("table", title, description, targets, w, h)
    fc = _field_config(unit, mappings=mappings, thresholds=thresholds, no_value=no_value,
                       color_mode="thresholds",
                       custom={"align": "auto", "cellOptions": {"type": cell}, "inspect": False})
    fc["overrides"] = overrides or []
    p["fieldConfig"] = fc
    p["options"] = {"showHeader": True, "cellHeight": "sm", "footer": {"show": False, "reducer": ["sum"]}}
    p["transformations"] = transformations
    return p


def row(title: str) -> Panel:
    return {"type": "row", "title": title, "collapsed": False, "panels": [], "_size": (GRID_WIDTH, 1)}


# --- table helpers ---------------------------------------------------------------------------


def matrix(row_field: str, column_field: str, column_order: list[str] | None = None) -> list[dict]:
    """Transformations turning one instant table query into a row × column matrix (GPU × link).
    Prometheus sorts label values as strings ("10" before "2"); `column_order` fixes that."""
    steps: list[dict] = [{
        "id": "groupingToMatrix",
        "options": {"rowField": row_field, "columnField": column_field, "valueField": "Value",
                    "emptyValue": "null"},
    }]
    if column_order:
        header = f"{row_field}\\{column_field}"
        index = {header: 0} | {name: i + 1 for i, name in enumerate(column_order)}
        steps.append({"id": "organize", "options": {"indexByName": index, "renameByName": {header: row_field.upper()},
                                                    "excludeByName": {}}})
    return steps


def merged(columns: dict[str, str], hidden: list[str], order: list[str]) -> list[dict]:
    """Join several instant table queries on their shared labels, rename "Value #A" style columns
    to `columns[refId]`, hide `hidden`, order by `order`. (With a single query Grafana names the
    value column plain "Value".)"""
    if len(columns) == 1:
        rename = {"Value": next(iter(columns.values()))}
    else:
        rename = {f"Value #{ref}": name for ref, name in columns.items()}
    return [
        {"id": "merge", "options": {}},
        {"id": "organize", "options": {
            "excludeByName": {name: True for name in ["Time", *hidden]},
            "renameByName": rename,
            "indexByName": {name: i for i, name in enumerate(order)},
        }},
    ]


def unit_override(column: str, unit: str, props: dict[str, Any] | None = None) -> dict:
    """Per-column settings of a table: its unit, plus Grafana property ids such as "mappings" or
    "custom.cellOptions"."""
    properties = [{"id": "unit", "value": unit}] + [{"id": k, "value": v} for k, v in (props or {}).items()]
    return {"matcher": {"id": "byName", "options": column}, "properties": properties}


def value_map(values: dict[str, tuple[str, str]]) -> list[dict]:
    """Value → (text, colour) mappings, e.g. {"1": ("up", "green")}."""
    return [{"type": "value", "options": {v: {"text": text, "color": color, "index": i}
                                          for i, (v, (text, color)) in enumerate(values.items())}}]


def steps(*pairs: tuple[str, float | None]) -> list[dict]:
    """Threshold steps from (colour, lower bound) pairs; the first bound is None (base)."""
    return [{"color": c, "value": v} for c, v in pairs]


# --- the dashboard ---------------------------------------------------------------------------


def _layout(panels: list[Panel]) -> list[Panel]:
    out, x, y, line_h = [], 0, 0, 0
    for pid, panel in enumerate(panels, start=1):
        w, h = panel["_size"]
        if panel["type"] == "row" or x + w > GRID_WIDTH:
            x, y, line_h = 0, y + line_h, 0
        laid = {"id": pid, "gridPos": {"h": h, "w": w, "x": x, "y": y}}
        laid |= {k: v for k, v in panel.items() if k != "_size"}
        out.append(laid)
        x, line_h = x + w, max(line_h, h)
        if panel["type"] == "row":
            x, y, line_h = 0, y + h, 0
    return out


def dashboard(uid: str, title: str, description: str, *, tags: list[str], variables: list[dict],
              panels: list[Panel], links: list[dict] | None = None, refresh: str = "30s") -> dict:
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": tags,
        "id": None,
        "version": 1,
        "schemaVersion": SCHEMA_VERSION,
        "editable": True,
        "graphTooltip": 1,
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "timezone": "browser",
        "weekStart": "",
        "refresh": refresh,
        "time": {"from": "now-6h", "to": "now"},
        "timepicker": {},
        "annotations": {"list": [{
            "builtIn": 1,
            "datasource": {"type": "grafana", "uid": "-- Grafana --"},
            "enable": True,
            "hide": True,
            "iconColor": "rgba(0, 211, 255, 1)",
            "name": "Annotations & Alerts",
            "type": "dashboard",
        }]},
        "links": links or [],
        "templating": {"list": variables},
        "panels": _layout(panels),
    }


def dashboard_links(tag: str) -> list[dict]:
    """A drop-down to the sibling dashboards, keeping time range and variables."""
    return [{"title": "spx-trainer", "type": "dashboards", "tags": [tag], "asDropdown": True,
             "includeVars": True, "keepTime": True, "icon": "external link", "targetBlank": False,
             "tooltip": "", "url": ""}]
