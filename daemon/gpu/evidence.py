"""What a GPU's own counters say about its speed: the evidence a slow rank is explained with.

    board = EvidenceBoard(backend)
    board.record(reading)           # the collector, with what its scrape read anyway
    board.latest(gpu, now)          # the straggler explainer: that reading, or a fresh one

The exporter's collector already reads every GPU's SM clock, clocks-event (throttle) reasons,
temperature, power and NVLink/PCIe counters on each scrape; it leaves a copy here, so explaining a
slow rank costs no NVML call of its own while Prometheus scrapes. Only when no scrape read the GPU
in the last `max_age` seconds does the board read the few values itself (five calls, at most once
per `max_age` per GPU). The maximum SM clock is read once per GPU: it does not change.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import pynvml

from spx.daemon.gpu.backend import GpuBackend

CLOCK_EVENT_REASONS = {
    "gpu_idle": pynvml.nvmlClocksEventReasonGpuIdle,
    "applications_clocks_setting": pynvml.nvmlClocksEventReasonApplicationsClocksSetting,
    "sw_power_cap": pynvml.nvmlClocksEventReasonSwPowerCap,
    "hw_slowdown": pynvml.nvmlClocksEventReasonHwSlowdown,
    "sync_boost": pynvml.nvmlClocksEventReasonSyncBoost,
    "sw_thermal_slowdown": pynvml.nvmlClocksEventReasonSwThermalSlowdown,
    "hw_thermal_slowdown": pynvml.nvmlClocksEventReasonHwThermalSlowdown,
    "hw_power_brake": pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown,
    "display_clock_setting": pynvml.nvmlClocksEventReasonDisplayClockSetting,
}

MAX_AGE_SECONDS = 30.0
# A reading of an idle GPU (before the job's workers started computing, say) tells nothing about its
# speed under load: it is read again once this old.
IDLE_MAX_AGE = 2.0


@dataclass(frozen=True)
class GpuReading:
    """One GPU's speed-related values at `time` (monotonic seconds); None where NVML did not say.
    `link_errors`: NVLink CRC, replay and recovery errors, all links (a counter since boot)."""

    gpu: int
    time: float
    sm_mhz: float | None = None
    sm_max_mhz: float | None = None
    reasons: frozenset[str] = frozenset()
    temperature_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    link_errors: float | None = None


def reason_names(mask: int) -> frozenset[str]:
    """The clocks-event reasons set in NVML's bit mask, by the names the metrics use."""
    return frozenset(name for name, bit in CLOCK_EVENT_REASONS.items() if mask & bit)


class EvidenceBoard:
    """The newest reading of each GPU (and the one before it, for counters that moved). Thread-safe:
    the collector's scrape thread writes, the answering side reads."""

    def __init__(self, backend: GpuBackend, max_age: float = MAX_AGE_SECONDS,
                 clock: Any = time.monotonic) -> None:
        self.backend = backend
        self.max_age = max_age
        self.clock = clock
        self._lock = threading.Lock()
        self._latest: dict[int, GpuReading] = {}
        self._before: dict[int, GpuReading] = {}
        self._max_mhz: dict[int, float | None] = {}

    def max_sm_mhz(self, gpu: int) -> float | None:
        """The GPU's maximum SM clock (read once)."""
        if gpu not in self._max_mhz:
            self._max_mhz[gpu] = self._call("nvmlDeviceGetMaxClockInfo", gpu, pynvml.NVML_CLOCK_SM)
        return self._max_mhz[gpu]

    def record(self, reading: GpuReading) -> None:
        with self._lock:
            previous = self._latest.get(reading.gpu)
            if previous is not None:
                self._before[reading.gpu] = previous
            self._latest[reading.gpu] = reading

    def latest(self, gpu: int) -> tuple[GpuReading | None, GpuReading | None]:
        """(newest reading of `gpu`, the one before it), reading it now if the newest is older than
        `max_age` (no scrape lately; IDLE_MAX_AGE for a reading of an idle GPU); (None, None) without NVML or for a GPU that does not answer."""
        with self._lock:
            found, before = self._latest.get(gpu), self._before.get(gpu)
        if found is not None and self.clock() - found.time <= (IDLE_MAX_AGE if "gpu_idle" in found.reasons else self.max_age):
            return found, before
        fresh = self.read(gpu)
        if fresh is None:
            return None, None
        self.record(fresh)
        return fresh, found

    def read(self, gpu: int) -> GpuReading | None:
        """The values a slow rank is explained with, read now (None if the GPU does not answer)."""
        if self.backend.nvml is None or not 0 <= gpu < len(self.backend.devices()):
            return None
        sm = self._call("nvmlDeviceGetClockInfo", gpu, pynvml.NVML_CLOCK_SM)
        if sm is None:
            return None
        events = ("nvmlDeviceGetCurrentClocksEventReasons"
                  if hasattr(self.backend.nvml, "nvmlDeviceGetCurrentClocksEventReasons")
                  else "nvmlDeviceGetCurrentClocksThrottleReasons")  # older pynvml
        mask = self._call(events, gpu)
        temp = self._call("nvmlDeviceGetTemperature", gpu, pynvml.NVML_TEMPERATURE_GPU)
        power = self._call("nvmlDeviceGetPowerUsage", gpu)
        limit = self._call("nvmlDeviceGetEnforcedPowerLimit", gpu)
        return GpuReading(gpu=gpu, time=self.clock(), sm_mhz=sm, sm_max_mhz=self.max_sm_mhz(gpu),
                          reasons=reason_names(int(mask)) if mask is not None else frozenset(),
                          temperature_c=temp, power_w=None if power is None else power / 1000.0,
                          power_limit_w=None if limit is None else limit / 1000.0)

    def _call(self, function: str, gpu: int, *args: Any) -> float | None:
        nvml = self.backend.nvml
        if nvml is None:
            return None
        try:
            return float(getattr(nvml, function)(self.backend.handle(gpu), *args))
        except (nvml.NVMLError, IndexError, AttributeError):
            return None
