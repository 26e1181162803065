"""The GPUs the daemon uses, as `spx top` shows them: answered by the daemon (control op "gpus")
from its own backend and its allocation, so `spx top` shows what the daemon sees (the fake fixture
under `--gpu-backend fake`, the GPUs a job holds) instead of opening a backend of its own.

Values are read fresh from NVML on each call; a value NVML will not give is None (a blank cell),
never a stale one. `spx gpus` lists the same rows with each GPU's health and quarantine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from spx.daemon.gpu import fields as F
from spx.daemon.state.views import JobView

ACTIVE_STATES = ("starting", "running", "restarting")


@dataclass(frozen=True)
class GpuRow:
    """One GPU as `spx top` shows it. None = NVML would not say (the cell is left blank)."""

    index: int
    name: str
    utilization: int | None  # percent
    memory_used: int | None  # bytes
    memory_total: int | None  # bytes
    power_watts: float | None
    job: str | None
    uuid: str | None = None
    health: str = "ok"  # "ok"; "lost" when NVML does not answer for it; "NVLink link N down" for a link that is
    quarantine: str | None = None  # why the health gate quarantined it (`spx gpu release N` clears it)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> GpuRow:
        return cls(int(doc["index"]), str(doc["name"]), doc.get("utilization"), doc.get("memory_used"),
                   doc.get("memory_total"), doc.get("power_watts"), doc.get("job"), doc.get("uuid"),
                   str(doc.get("health", "ok")), doc.get("quarantine"))


def gpu_rows(backend: Any, jobs: Sequence[JobView],
             quarantined: Mapping[int, tuple[str | None, str, float]] | None = None) -> list[GpuRow]:
    """Fresh utilization, memory and power of every GPU, with the live job each is allocated to and
    its quarantine (`quarantined`: the store's {gpu: (uuid, reason, since)})."""
    if backend is None or backend.nvml is None:
        return []
    nvml = backend.nvml
    quarantined = quarantined or {}

    def why(g: int) -> str | None:
        entry = quarantined.get(g)
        return entry[1] if entry else None

    owner = {i: j.name for j in jobs if j.state in ACTIVE_STATES for i in j.gpus}
    rows = []
    for d in backend.devices():
        util = used = total = None
        power = None
        try:
            h = nvml.nvmlDeviceGetHandleByIndex(d.index)
        except nvml.NVMLError:
            rows.append(GpuRow(d.index, d.name, None, None, None, None, owner.get(d.index), d.uuid, "lost",
                               why(d.index)))
            continue
        try:
            util = int(nvml.nvmlDeviceGetUtilizationRates(h).gpu)
        except nvml.NVMLError:
            pass
        health = "ok"
        try:
            mem = nvml.nvmlDeviceGetMemoryInfo(h)
            used, total = int(mem.used), int(mem.total)
        except nvml.NVMLError:
            health = "lost"
        try:
            power = nvml.nvmlDeviceGetPowerUsage(h) / 1000.0
        except nvml.NVMLError:
            pass
        down = links_down(nvml, h) if health == "ok" else []
        if down:
            health = f"NVLink link{'s' if len(down) > 1 else ''} {', '.join(map(str, down))} down"
        rows.append(GpuRow(d.index, d.name, util, used, total, power, owner.get(d.index), d.uuid, health,
                           why(d.index)))
    return rows


def links_down(nvml: Any, handle: Any) -> list[int]:
    """The GPU's NVLink links that are not active, in two field-values calls (the link count, then
    every link's state); [] for a GPU without NVLink or where NVML cannot say."""
    try:
        count = int(F.field_value(nvml.nvmlDeviceGetFieldValues(handle, [F.LINK_COUNT])[0]))
        if count <= 0:
            return []
        states = nvml.nvmlDeviceGetFieldValues(handle, [(F.LINK_STATE, link) for link in range(count)])
    except (nvml.NVMLError, IndexError, ValueError):
        return []
    up = (nvml.NVML_NVLINK_STATE_ACTIVE, nvml.NVML_NVLINK_STATE_SLEEP)  # as the exporter's spx_gpu_nvlink_up
    return [link for link, fv in enumerate(states)
            if fv.nvmlReturn == nvml.NVML_SUCCESS and int(F.field_value(fv)) not in up]
