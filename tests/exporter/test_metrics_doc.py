"""docs/metrics.md documents exactly the metrics the exporter serves, with their types and labels."""

from __future__ import annotations

import re
from pathlib import Path

from spx.daemon.exporter.metrics import SPECS

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
ROW = re.compile(r"^\| `(?P<name>spx_\w+)` \| (?P<type>\w+) \| (?P<labels>[^|]*) \| .+ \|$")


def test_every_metric_is_documented_with_its_type_and_labels():
    rows = [m for m in map(ROW.match, DOC.read_text().splitlines()) if m]
    documented = {m["name"]: (m["type"], tuple(re.findall(r"`(\w+)`", m["labels"]))) for m in rows}
    assert len(documented) == len(rows), "a metric is documented twice"
    assert documented == {s.name: (s.type, s.labels) for s in SPECS}
