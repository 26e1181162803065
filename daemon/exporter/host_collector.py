"""`spx_host_gpu_seconds_total`: where the host's GPU time went since the daemon started — the jobs'
goodput ledgers times their GPUs, quarantined GPUs, idle ones (state/ledger_view.py `HostAccount`) —
and `spx_host_unsettled_gpu_seconds`, the live jobs' time not settled yet; `spx_standby_memory_bytes`,
what the jobs' standbys hold (their views' figures summed: no job named, so also without job labels)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from spx.daemon.exporter.metrics import Families
from spx.daemon.gpu.backend import GpuBackend
from spx.daemon.state.goodput import Ledger
from spx.daemon.state.ledger_view import HostAccount
from spx.daemon.state.views import JobView


class HostCollector:
    """One series per cause (every cause, 0 where none), so a ratio of two never lacks a side."""

    def __init__(self, backend: GpuBackend, account: HostAccount, jobs: Callable[[], list[JobView]],
                 wall: Callable[[], float] = time.time,
                 live: Callable[[], tuple[float, dict[int, Ledger]]] | None = None) -> None:
        self.backend = backend
        self.account = account
        self.wall = wall
        self.live = live  # the scrape's `now` and live ledgers, read once for its job views (scrape_jobs.py)
        self.jobs = jobs  # the scrape's job views (their standbys' memory)

    def collect(self) -> tuple[list[Any], bool]:
        fam = Families(["spx_host_gpu_seconds_total", "spx_host_unsettled_gpu_seconds", "spx_standby_memory_bytes"])
        gpus = len(self.backend.devices())
        if self.live is not None:
            now, ledgers = self.live()
            host = self.account.gpu_seconds(gpus, now, ledgers)
        else:
            host = self.account.gpu_seconds(gpus, self.wall())
        for cause, seconds in host.settled.items():
            fam.add("spx_host_gpu_seconds_total", {"cause": cause}, seconds)
        fam.add("spx_host_unsettled_gpu_seconds", {}, host.unsettled)
        fam.add("spx_standby_memory_bytes", {}, sum(v.standby_memory_bytes or 0 for v in self.jobs()))
        return fam.metrics(), True
