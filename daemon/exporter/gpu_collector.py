"""The NVML collector: reads every GPU fresh on each scrape, one scrape at a time.

No background polling and no cache of values: what a scrape returns was read during that scrape, or
is absent. Per GPU and scrape it makes a fixed number of NVML calls whatever the link count (see
`CALLS_PER_GPU`): one `nvmlDeviceGetFieldValues` carries all NVLink counters and the device counters
(`spx.daemon.gpu.fields`), the rest are the reads that have no field id. Only capabilities are
remembered (link count, memory-info version, functions that answered NOT_SUPPORTED). Each GPU's
speed evidence (SM clock, throttle reasons, temperature, power, NVLink errors) read by a scrape is
also left on the straggler explainer's board (gpu/evidence.py), so naming a slow rank's cause costs
no NVML call of its own.

Errors: a GPU whose memory-info read fails, or that reports GPU_IS_LOST/RESET_REQUIRED on any call,
is exported as `spx_gpu_up 0` plus its identity, and nothing else.

Each GPU's scrape is also kept, summarised (gpu_reading.py), in the backend's recent readings
(gpu/recent.py): the minute before a failure that an incident shows, at no extra NVML call. Any other failed read drops that
sample and counts `spx_nvml_errors_total{function}`; the scrape always answers.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import pynvml
import structlog

from spx.daemon.exporter import gpu_reading
from spx.daemon.exporter.metrics import JOB_LABEL, Families
from spx.daemon.gpu import fields as F
from spx.daemon.gpu.backend import GpuBackend, GpuDevice
from spx.daemon.gpu.evidence import CLOCK_EVENT_REASONS, EvidenceBoard, GpuReading, reason_names
from spx.daemon.state.views import JobView

log = structlog.get_logger(__name__)

ALLOCATED_STATES = frozenset({"starting", "running", "restarting"})


# The NVML calls of one GPU in one scrape (plus fallbacks only on drivers without the power fields).
CALLS_PER_GPU = (
    "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetFieldValues", "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetTemperature", "nvmlDeviceGetClockInfo", "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetPcieThroughput", "nvmlDeviceGetPcieThroughput",
    "nvmlDeviceGetComputeRunningProcesses",
)

GPU_FAMILIES = [
    "spx_gpu_up", "spx_gpu_info", "spx_gpu_utilization_ratio", "spx_gpu_memory_utilization_ratio",
    "spx_gpu_memory_used_bytes", "spx_gpu_memory_free_bytes", "spx_gpu_memory_total_bytes",
    "spx_gpu_memory_reserved_bytes", "spx_gpu_power_watts", "spx_gpu_power_limit_watts",
    "spx_gpu_energy_joules_total", "spx_gpu_temperature_celsius", "spx_gpu_memory_temperature_celsius",
    "spx_gpu_sm_clock_hertz", "spx_gpu_memory_clock_hertz", "spx_gpu_clocks_event_active",
    "spx_gpu_pcie_transmit_bytes_per_second", "spx_gpu_pcie_receive_bytes_per_second",
    "spx_gpu_pcie_transmit_bytes_total", "spx_gpu_pcie_receive_bytes_total", "spx_gpu_ecc_errors_total",
    "spx_gpu_remapped_rows", "spx_gpu_xid_errors_total", "spx_gpu_process_memory_used_bytes",
    "spx_gpu_nvlink_up", "spx_gpu_nvlink_transmit_bytes_total", "spx_gpu_nvlink_receive_bytes_total",
    "spx_gpu_nvlink_errors_total", "spx_nvml_errors_total", "spx_xid_watch_up",
]

_LOST_CODES = (pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_RESET_REQUIRED)


class GpuLost(Exception):
    pass


class _GpuScrape:
    """The reads of one GPU in one scrape; collects samples, drops the ones whose read failed."""

    def __init__(self, collector: GpuCollector, device: GpuDevice, handle: Any) -> None:
        self.c = collector
        self.nvml = collector.nvml
        self.dev = device
        self.handle = handle
        self.samples: list[tuple[str, dict[str, str], float]] = []
        self.ok = True
        self.evidence: dict[str, object] = {}  # what a slow rank is explained with (gpu/evidence.py)

    def call(self, function: str, *args: Any) -> Any:
        """One NVML call; None if it failed (counted) or is unsupported (remembered, not counted)."""
        key = (self.dev.index, function, args[0] if args and isinstance(args[0], int) else None)
        if key in self.c.unsupported:
            return None
        try:
            return getattr(self.nvml, function)(self.handle, *args)
        except self.nvml.NVMLError as err:
            if err.value in _LOST_CODES:
                self.c.count_error(function)
                raise GpuLost(str(err)) from err
            if err.value == pynvml.NVML_ERROR_NOT_SUPPORTED:
                self.c.unsupported.add(key)
                return None
            self.c.count_error(function)
            self.ok = False
            log.warning("nvml_call_failed", gpu=self.dev.index, function=function, error=str(err))
            return None

    def add(self, name: str, labels: dict[str, str], value: float | None) -> None:
        if value is not None:
            self.samples.append((name, labels, value))

    def read(self, base: dict[str, str], pid_jobs: dict[int, str]) -> None:
        self._memory(base)
        self._fields(base)
        util = self.call("nvmlDeviceGetUtilizationRates")
        if util is not None:
            self.add("spx_gpu_utilization_ratio", base, util.gpu / 100.0)
            self.add("spx_gpu_memory_utilization_ratio", base, util.memory / 100.0)
        temperature = self.evidence["temperature_c"] = self.call("nvmlDeviceGetTemperature", pynvml.NVML_TEMPERATURE_GPU)
        self.add("spx_gpu_temperature_celsius", base, temperature)
        for name, clock in (("spx_gpu_sm_clock_hertz", pynvml.NVML_CLOCK_SM), ("spx_gpu_memory_clock_hertz", pynvml.NVML_CLOCK_MEM)):
            mhz = self.call("nvmlDeviceGetClockInfo", clock)
            self.add(name, base, None if mhz is None else mhz * 1e6)
            if clock == pynvml.NVML_CLOCK_SM:
                self.evidence["sm_mhz"] = mhz
        reasons = self.call(self.c.clock_events_function)
        if reasons is not None:
            self.evidence["reasons"] = reason_names(int(reasons))
            for reason, bit in CLOCK_EVENT_REASONS.items():
                self.add("spx_gpu_clocks_event_active", {**base, "reason": reason}, 1.0 if reasons & bit else 0.0)
        for name, counter in (
            ("spx_gpu_pcie_transmit_bytes_per_second", pynvml.NVML_PCIE_UTIL_TX_BYTES),
            ("spx_gpu_pcie_receive_bytes_per_second", pynvml.NVML_PCIE_UTIL_RX_BYTES),
        ):
            kib = self.call("nvmlDeviceGetPcieThroughput", counter)
            self.add(name, base, None if kib is None else kib * 1024.0)
        procs = self.call("nvmlDeviceGetComputeRunningProcesses")
        for proc in procs or []:
            if proc.usedGpuMemory is None:
                continue
            labels = {**base, "pid": str(proc.pid)}
            labels.pop(JOB_LABEL, None)
            if proc.pid in pid_jobs:
                labels[JOB_LABEL] = pid_jobs[proc.pid]
            self.add("spx_gpu_process_memory_used_bytes", labels, proc.usedGpuMemory)

    def _memory(self, base: dict[str, str]) -> None:
        index = self.dev.index
        mem = None
        if index not in self.c.memory_v1:
            try:
                mem = self.nvml.nvmlDeviceGetMemoryInfo(self.handle, version=pynvml.nvmlMemory_v2)
            except self.nvml.NVMLError as err:
                if err.value not in (pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
                                     pynvml.NVML_ERROR_NOT_SUPPORTED):
                    self.c.count_error("nvmlDeviceGetMemoryInfo")
                    raise GpuLost(str(err)) from err
                self.c.memory_v1.add(index)
        if mem is None:
            try:
                mem = self.nvml.nvmlDeviceGetMemoryInfo(self.handle)
            except self.nvml.NVMLError as err:
                self.c.count_error("nvmlDeviceGetMemoryInfo")
                raise GpuLost(str(err)) from err
        self.add("spx_gpu_memory_total_bytes", base, mem.total)
        self.add("spx_gpu_memory_used_bytes", base, mem.used)
        self.add("spx_gpu_memory_free_bytes", base, mem.free)
        if hasattr(mem, "reserved"):
            self.add("spx_gpu_memory_reserved_bytes", base, mem.reserved)

    def _fields(self, base: dict[str, str]) -> None:
        request = self.c.field_request(self.dev.index, self.handle, self)
        values = self.call("nvmlDeviceGetFieldValues", list(request.ids))
        got: dict[tuple[int, int], float] = {}
        never: set[tuple[int, int]] = set()
        for fv in values or []:
            if fv.nvmlReturn == pynvml.NVML_SUCCESS:
                got[(fv.fieldId, fv.scopeId)] = F.field_value(fv)
            elif fv.nvmlReturn in F.NEVER_CODES:
                never.add((fv.fieldId, fv.scopeId))
            elif fv.nvmlReturn in _LOST_CODES:
                self.c.count_error("nvmlDeviceGetFieldValues")
                raise GpuLost(f"field {fv.fieldId}: {pynvml.NVMLError(fv.nvmlReturn)}")
            elif fv.nvmlReturn not in F.ABSENT_CODES:
                self.c.count_error("nvmlDeviceGetFieldValues")
                self.ok = False
        if never:  # e.g. the ≤12-link legacy error ids on Hopper, or the power fields on old drivers
            self.c.narrow_request(self.dev.index, request.without(never))

        def dev(fid: int) -> float | None:
            return got.get((fid, 0))

        energy = dev(F.ENERGY_MJ)
        self.add("spx_gpu_energy_joules_total", base, None if energy is None else energy / 1000.0)
        power = dev(F.POWER_MW)
        if power is None and values is not None:  # drivers before the power fields
            power = self.call("nvmlDeviceGetPowerUsage")
        self.add("spx_gpu_power_watts", base, None if power is None else power / 1000.0)
        self.evidence["power_w"] = None if power is None else power / 1000.0
        limit = dev(F.POWER_LIMIT_MW)
        if limit is None and values is not None:
            limit = self.call("nvmlDeviceGetEnforcedPowerLimit")
        self.add("spx_gpu_power_limit_watts", base, None if limit is None else limit / 1000.0)
        self.evidence["power_limit_w"] = None if limit is None else limit / 1000.0
        self.add("spx_gpu_ecc_errors_total", {**base, "type": "corrected"}, dev(F.ECC_CORRECTED))
        self.add("spx_gpu_ecc_errors_total", {**base, "type": "uncorrected"}, dev(F.ECC_UNCORRECTED))
        for kind, fid in F.REMAPPED.items():
            self.add("spx_gpu_remapped_rows", {**base, "type": kind}, dev(fid))
        self.add("spx_gpu_memory_temperature_celsius", base, dev(F.MEMORY_TEMP))
        self.add("spx_gpu_pcie_transmit_bytes_total", base, dev(F.PCIE_TX_BYTES))
        self.add("spx_gpu_pcie_receive_bytes_total", base, dev(F.PCIE_RX_BYTES))
        for link in range(request.links):
            labels = {**base, "link": str(link)}
            state = got.get((F.LINK_STATE, link))
            if state is not None:
                up = state in (pynvml.NVML_NVLINK_STATE_ACTIVE, pynvml.NVML_NVLINK_STATE_SLEEP)
                self.add("spx_gpu_nvlink_up", labels, 1.0 if up else 0.0)
            tx, rx = got.get((F.LINK_TX, link)), got.get((F.LINK_RX, link))
            self.add("spx_gpu_nvlink_transmit_bytes_total", labels, None if tx is None else tx * 1024.0)
            self.add("spx_gpu_nvlink_receive_bytes_total", labels, None if rx is None else rx * 1024.0)
            for kind in ("crc_flit", "crc_data", "replay", "recovery"):
                value = got.get((F.LINK_ERRORS[kind], link)) if kind in F.LINK_ERRORS else None
                if value is None and link < F.LEGACY_MAX_LINKS:
                    value = got.get((F.LEGACY_LINK_ERRORS[kind][link], 0))
                self.add("spx_gpu_nvlink_errors_total", {**labels, "type": kind}, value)
                if value is not None:
                    self.evidence["link_errors"] = float(self.evidence.get("link_errors") or 0.0) + value  # type: ignore[arg-type]

    def reading(self, board: EvidenceBoard) -> GpuReading:
        """This scrape's speed evidence of the GPU, for the straggler explainer."""
        return GpuReading(gpu=self.dev.index, time=board.clock(), sm_max_mhz=board.max_sm_mhz(self.dev.index),
                          **self.evidence)  # type: ignore[arg-type]


class GpuCollector:
    """Per-GPU metrics from `backend`, labelled with the job that holds each GPU (from `jobs()`)."""

    def __init__(self, backend: GpuBackend, jobs: Callable[[], list[JobView]],
                 board: EvidenceBoard | None = None) -> None:
        self.backend = backend
        self.board = board  # each scrape leaves its speed evidence there (gpu/evidence.py)
        self.nvml = backend.nvml
        self.jobs = jobs
        self.errors: Counter[str] = Counter()
        self.unsupported: set[tuple[int, str, int | None]] = set()
        self.memory_v1: set[int] = set()
        self._requests: dict[int, F.FieldRequest] = {}
        self._lock = threading.Lock()
        self.clock_events_function = (
            "nvmlDeviceGetCurrentClocksEventReasons"
            if self.nvml is not None and hasattr(self.nvml, "nvmlDeviceGetCurrentClocksEventReasons")
            else "nvmlDeviceGetCurrentClocksThrottleReasons"
        )

    def count_error(self, function: str) -> None:
        self.errors[function] += 1

    def field_request(self, index: int, handle: Any, scrape: _GpuScrape) -> F.FieldRequest:
        """The field list for GPU `index`, sized by its NVLink link count: asked until the GPU
        answers it (or says it has no NVLink), then remembered."""
        if index in self._requests:
            return self._requests[index]
        values = scrape.call("nvmlDeviceGetFieldValues", [(F.LINK_COUNT, 0)])
        answer = values[0].nvmlReturn if values is not None else None
        if answer == pynvml.NVML_SUCCESS:
            request = self._requests[index] = F.FieldRequest.for_links(int(F.field_value(values[0])))
            return request
        if answer in F.NEVER_CODES:  # a PCIe GPU: no NVLink
            request = self._requests[index] = F.FieldRequest.for_links(0)
            return request
        # The read failed (counted by `call`, or in the entry): no link samples this scrape, ask again next.
        if answer is not None:
            self.count_error("nvmlDeviceGetFieldValues")
            scrape.ok = False
        return F.FieldRequest.for_links(0)

    def narrow_request(self, index: int, request: F.FieldRequest) -> None:
        self._requests[index] = request

    def collect(self) -> tuple[list[Any], bool]:
        """(metric families, success) of one scrape. Serialised: one scrape reads NVML at a time."""
        with self._lock:
            return self._collect()

    def _collect(self) -> tuple[list[Any], bool]:
        fam = Families(GPU_FAMILIES)
        ok = True
        try:
            views = self.jobs()
        except Exception:  # the job labels are lost for this scrape, the GPU readings are not
            log.exception("gpu_collector_jobs_failed")
            views, ok = [], False
        gpu_jobs = {g: v.name for v in views if v.state in ALLOCATED_STATES for g in v.gpus}
        pid_jobs = {pid: v.name for v in views for pid in v.pids}
        watcher = self.backend.xid_watcher
        xids = watcher.counts() if watcher is not None else {}
        recent = self.backend.recent
        for device in self.backend.devices():
            base = {"gpu": str(device.index), "uuid": device.uuid}
            if device.index in gpu_jobs:
                base[JOB_LABEL] = gpu_jobs[device.index]
            fam.add("spx_gpu_info", {**base, "name": device.name, "pci_bus_id": device.pci_bus_id,
                                     "driver": self.backend.driver_version}, 1)
            # XID counts are the daemon's own event counts, not a read of the GPU: kept when it is down
            # (XID 79 is how a GPU falls off the bus).
            for (index, xid), count in sorted(xids.items()):
                if index == device.index:
                    fam.add("spx_gpu_xid_errors_total", {**base, "xid": str(xid)}, count)
            scrape = _GpuScrape(self, device, self.backend.handle(device.index))
            try:
                scrape.read(base, pid_jobs)
            except GpuLost as err:
                log.warning("gpu_down", gpu=device.index, error=str(err))
                recent.record(device.index, gpu_reading.LOST)
                fam.add("spx_gpu_up", base, 0)
                ok = False
                continue
            ok = ok and scrape.ok
            recent.record(device.index, gpu_reading.summary(scrape.samples))  # for incidents: no NVML call
            if self.board is not None:
                self.board.record(scrape.reading(self.board))
            fam.add("spx_gpu_up", base, 1)
            for name, labels, value in scrape.samples:
                fam.add(name, labels, value)
        for function, count in sorted(self._error_counts()):
            fam.add("spx_nvml_errors_total", {"function": function}, count)
        if self.nvml is not None:
            fam.add("spx_xid_watch_up", {}, 1 if watcher is not None and watcher.running else 0)
        return fam.metrics(), ok

    def _error_counts(self) -> Iterable[tuple[str, int]]:
        counts = Counter(self.errors)
        watcher = self.backend.xid_watcher
        if watcher is not None:
            counts.update(watcher.errors())
        return counts.items()
