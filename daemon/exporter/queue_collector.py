"""`spx_queue_drained`: whether the host is drained (`spx drain`: no new job starts, running jobs go
on), from the state store — so a dashboard shows why the queue does not move, and an alert can
catch a drain left on after maintenance."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from spx.daemon.exporter.metrics import Families


class QueueCollector:
    """One series, always present: 1 while drained, else 0."""

    def __init__(self, drained: Callable[[], str | None]) -> None:
        self.drained = drained

    def collect(self) -> tuple[list[Any], bool]:
        fam = Families(["spx_queue_drained"])
        fam.add("spx_queue_drained", {}, 1 if self.drained() else 0)
        return fam.metrics(), True
