"""`spx_gpu_quarantined`: which GPUs the health gate quarantined (gpu/health.py), and why, from the
state store's table — so an alert can page on a GPU taken out of service, and the reason is on it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from spx.daemon.exporter.metrics import Families
from spx.daemon.gpu.backend import GpuBackend

Quarantined = Mapping[int, tuple[str | None, str, float]]  # gpu → (uuid, reason, since)


class QuarantineCollector:
    """One series per GPU: 1 with its reason while quarantined, else 0 (so `increase` and absence
    alerts work from the start)."""

    def __init__(self, backend: GpuBackend, quarantined: Callable[[], Quarantined]) -> None:
        self.backend = backend
        self.quarantined = quarantined

    def collect(self) -> tuple[list[Any], bool]:
        fam = Families(["spx_gpu_quarantined"])
        q = self.quarantined()
        for d in self.backend.devices():
            entry = q.get(d.index)
            fam.add("spx_gpu_quarantined", {"gpu": str(d.index), "uuid": d.uuid, "reason": entry[1] if entry else ""},
                    1 if entry else 0)
        return fam.metrics(), True
