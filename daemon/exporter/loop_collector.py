"""`spx_daemon_loop_turn_seconds`: the main loop's turn times (core/turn_times.py) as a Prometheus
histogram, so an operator sees the loop slowing as the host's work grows (p99 by
`histogram_quantile`) before the watchdog does."""

from __future__ import annotations

from typing import Any

from prometheus_client.core import HistogramMetricFamily

from spx.daemon.core.turn_times import BUCKETS, TurnTimes
from spx.daemon.exporter.metrics import BY_NAME

NAME = "spx_daemon_loop_turn_seconds"


class LoopCollector:
    def __init__(self, turns: TurnTimes) -> None:
        self.turns = turns

    def collect(self) -> tuple[list[Any], bool]:
        reading = self.turns.read()
        buckets = [(repr(bound), float(n)) for bound, n in zip(BUCKETS, reading.cumulative, strict=True)]
        family = HistogramMetricFamily(NAME, BY_NAME[NAME].help,
                                       buckets=[*buckets, ("+Inf", float(reading.count))], sum_value=reading.sum)
        return [family], True
