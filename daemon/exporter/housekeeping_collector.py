"""`spx_retention_*` and `spx_notify_sends_total`: what the daemon's housekeeping did since it
started — finished jobs removed by retention (run/retention.py), the disk their logs use, and
notifications sent, failed or dropped (run/notify.py) — so an operator sees that nothing grows
forever and that failures reach their owners."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from spx.daemon.exporter.metrics import Families

Samples = Callable[[], list[tuple[str, dict[str, str], float]]]
NAMES = ["spx_retention_removed_jobs_total", "spx_retention_removed_logs_total",
         "spx_retention_removed_rejected_total", "spx_retention_finished_logs_bytes", "spx_notify_sends_total"]


class HousekeepingCollector:
    """The samples each housekeeping part keeps (counters of its own, read on the scrape's thread)."""

    def __init__(self, parts: list[Samples]) -> None:
        self.parts = parts

    def collect(self) -> tuple[list[Any], bool]:
        fam = Families(NAMES)
        for part in self.parts:
            for name, labels, value in part():
                fam.add(name, labels, value)
        return fam.metrics(), True
