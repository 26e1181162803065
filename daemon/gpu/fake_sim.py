"""The simulated hardware behind `FakeNvml`: one `FakeDevice` per fixture GPU, and XID event sets.

Units are NVML's: mW, mJ, MHz, °C, KiB for NVLink throughput counters, KB/s for PCIe throughput.
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Callable
from typing import Any

import pynvml

from spx.daemon.gpu.kernel_log import kernel_address

MIB = 1024 * 1024
LINK_ERROR_TYPES = ("replay", "recovery", "crc_flit")

_OK = pynvml.NVML_SUCCESS
_UINT = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
_ULL = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
_NOT_SUPPORTED = (pynvml.NVML_ERROR_NOT_SUPPORTED, 0, 0)


class FakeDevice:
    """One simulated GPU. `advance(now)` integrates the counters; the rest read the current state."""

    def __init__(self, index: int, spec: dict[str, Any], t0: float) -> None:
        self.index = index
        self.spec = spec
        self.lost = pynvml.NVML_ERROR_GPU_IS_LOST if spec.get("lost") else 0
        self.busy = False
        self.links = int(spec["nvlink_links"])
        self.down = {int(link) for link in spec["nvlink_down"]}
        self._t0 = self._last = t0
        self.energy_mj = float(spec["energy_mj_at_open"])
        # NVLink counters in KiB, as NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_* reports them.
        self.tx_kib = [float((index + 1) * 7_000_000_000 + link * 13_000_000) for link in range(self.links)]
        self.rx_kib = [float((index + 1) * 6_500_000_000 + link * 11_000_000) for link in range(self.links)]
        self.pcie_bytes = [float((index + 1) * 3 * 10**12), float((index + 1) * 4 * 10**12)]
        counts = spec["nvlink_error_counts"]
        self.link_errors = [
            {t: float(counts.get(str(link), {}).get(t, 0)) for t in LINK_ERROR_TYPES} for link in range(self.links)
        ]

    # -- time ------------------------------------------------------------------------------------

    def elapsed(self) -> float:
        return self._last - self._t0

    def advance(self, now: float) -> None:
        dt = now - self._last
        if dt <= 0:
            return
        self._last = now
        self.energy_mj += self.power_mw() * dt
        busy_kib = float(self.spec["nvlink_busy_kib_per_s"]) if self.busy else 0.0
        per_hour = self.spec["nvlink_error_per_hour"]
        for link in range(self.links):
            if link in self.down:
                continue
            self.tx_kib[link] += (float(self.spec["nvlink_tx_kib_per_s"]) + busy_kib) * dt
            self.rx_kib[link] += (float(self.spec["nvlink_rx_kib_per_s"]) + busy_kib) * dt
            for t in LINK_ERROR_TYPES:
                self.link_errors[link][t] += float(per_hour.get(t, 0)) * dt / 3600.0
        for direction in (0, 1):
            self.pcie_bytes[direction] += self.pcie_kib_per_s(direction) * 1024.0 * dt

    def _wobble(self, period: float, amplitude: float) -> float:
        """A deterministic wiggle of the clock, so busy gauges are not flat lines."""
        return amplitude * math.sin(2 * math.pi * (self.elapsed() / period + self.index / 8))

    # -- gauges ----------------------------------------------------------------------------------

    def memory(self, proc_memory: dict[int, int]) -> tuple[int, int, int]:
        total = int(self.spec["memory_total_mib"]) * MIB
        reserved = int(self.spec["memory_reserved_mib"]) * MIB
        used = int(self.spec["memory_used_idle_mib"]) * MIB + sum(proc_memory.values())
        return total, reserved, min(used, total - reserved)

    def utilization(self) -> tuple[int, int]:
        if not self.busy:
            return 0, 0
        return round(94 + self._wobble(37, 5)), round(41 + self._wobble(29, 9))

    def power_mw(self) -> int:
        if not self.busy:
            return int(self.spec["power_idle_mw"])
        return int(float(self.spec["power_busy_mw"]) + self._wobble(23, 60000))

    def temperature(self) -> int:
        if not self.busy:
            return int(self.spec["temperature_idle_c"])
        return int(self.spec["temperature_busy_c"]) + self.index % 4

    def clock_mhz(self, clock_type: int) -> int:
        if clock_type in (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_GRAPHICS):
            return int(self.spec["sm_clock_busy_mhz" if self.busy else "sm_clock_idle_mhz"])
        if clock_type == pynvml.NVML_CLOCK_MEM:
            return int(self.spec["memory_clock_mhz"])
        if clock_type == pynvml.NVML_CLOCK_VIDEO:
            return 1755 if self.busy else 765
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def clock_event_reasons(self) -> int:
        """Idle when no process computes; busy, the fixture's `clock_event_reasons_busy` (pynvml's
        names without the prefix, e.g. ["HwThermalSlowdown"]: a throttled GPU, for straggler tests)."""
        if not self.busy:
            return int(pynvml.nvmlClocksEventReasonGpuIdle)
        mask = 0
        for name in self.spec.get("clock_event_reasons_busy", []):
            mask |= int(getattr(pynvml, f"nvmlClocksEventReason{name}"))
        return mask

    def max_clock_mhz(self, clock_type: int) -> int:
        if clock_type in (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_GRAPHICS):
            return int(self.spec.get("sm_clock_max_mhz", 1980))
        if clock_type == pynvml.NVML_CLOCK_MEM:
            return int(self.spec["memory_clock_mhz"])
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def pcie_kib_per_s(self, counter: int) -> int:
        if counter not in (pynvml.NVML_PCIE_UTIL_TX_BYTES, pynvml.NVML_PCIE_UTIL_RX_BYTES):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        direction = "tx" if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else "rx"
        return int(self.spec[f"pcie_{direction}_kib_per_s_{'busy' if self.busy else 'idle'}"])

    def ecc(self, error_type: int) -> int:
        if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED:
            return int(self.spec["ecc_corrected"])
        if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
            return int(self.spec["ecc_uncorrected"])
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def _check_link(self, link: int) -> None:
        if not 0 <= link < self.links:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def link_state(self, link: int) -> int:
        self._check_link(link)
        return pynvml.NVML_FEATURE_DISABLED if link in self.down else pynvml.NVML_FEATURE_ENABLED

    def link_error_counter(self, link: int, counter: int) -> int:
        self._check_link(link)
        names = {
            pynvml.NVML_NVLINK_ERROR_DL_REPLAY: "replay",
            pynvml.NVML_NVLINK_ERROR_DL_RECOVERY: "recovery",
            pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT: "crc_flit",
        }
        if counter not in names:  # Hopper reports no data-CRC counter
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(self.link_errors[link][names[counter]])

    # -- field values ----------------------------------------------------------------------------

    def field(self, fid: int, scope: int) -> tuple[int, int, float]:
        """(nvmlReturn, valueType, value) for one requested field, as the driver fills the array."""
        if fid in _DEVICE_FIELDS:
            vtype, read = _DEVICE_FIELDS[fid]
            return _OK, vtype, read(self)
        if fid not in _LINK_FIELDS:
            return _NOT_SUPPORTED
        if not 0 <= scope < self.links:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT, 0, 0
        vtype, read_link = _LINK_FIELDS[fid]
        return _OK, vtype, read_link(self, scope)


# Field id -> (valueType, reader): looked up per requested field, so a 170-field request costs what a
# driver's does relative to the other calls (the benchmark compares call patterns on this fake).
_DEVICE_FIELDS: dict[int, tuple[int, Callable[[FakeDevice], float]]] = {
    pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION: (_ULL, lambda d: d.energy_mj),
    pynvml.NVML_FI_DEV_POWER_INSTANT: (_UINT, lambda d: d.power_mw()),
    pynvml.NVML_FI_DEV_POWER_AVERAGE: (_UINT, lambda d: d.power_mw()),
    pynvml.NVML_FI_DEV_POWER_CURRENT_LIMIT: (_UINT, lambda d: d.spec["power_limit_mw"]),
    pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: (_ULL, lambda d: d.spec["ecc_corrected"]),
    pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: (_ULL, lambda d: d.spec["ecc_uncorrected"]),
    pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL: (_ULL, lambda d: d.spec["ecc_corrected"]),
    pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL: (_ULL, lambda d: d.spec["ecc_uncorrected"]),
    pynvml.NVML_FI_DEV_REMAPPED_COR: (_UINT, lambda d: d.spec["remapped_rows"]["correctable"]),
    pynvml.NVML_FI_DEV_REMAPPED_UNC: (_UINT, lambda d: d.spec["remapped_rows"]["uncorrectable"]),
    pynvml.NVML_FI_DEV_REMAPPED_PENDING: (_UINT, lambda d: d.spec["remapped_rows"]["pending"]),
    pynvml.NVML_FI_DEV_REMAPPED_FAILURE: (_UINT, lambda d: d.spec["remapped_rows"]["failure"]),
    pynvml.NVML_FI_DEV_MEMORY_TEMP: (_UINT, lambda d: d.spec["memory_temperature_idle_c"] + (12 if d.busy else 0)),
    pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT: (_UINT, lambda d: d.links),
    pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES: (_ULL, lambda d: d.pcie_bytes[0]),
    pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES: (_ULL, lambda d: d.pcie_bytes[1]),
}

_LINK_FIELDS: dict[int, tuple[int, Callable[[FakeDevice, int], float]]] = {
    pynvml.NVML_FI_DEV_NVLINK_GET_STATE: (
        _UINT, lambda d, link: pynvml.NVML_NVLINK_STATE_INACTIVE if link in d.down else pynvml.NVML_NVLINK_STATE_ACTIVE),
    pynvml.NVML_FI_DEV_NVLINK_GET_SPEED: (_UINT, lambda d, link: 0 if link in d.down else d.spec["nvlink_speed_mbps"]),
    pynvml.NVML_FI_DEV_NVLINK_GET_VERSION: (_UINT, lambda d, link: d.spec["nvlink_version"]),
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: (_ULL, lambda d, link: d.tx_kib[link]),
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: (_ULL, lambda d, link: d.rx_kib[link]),
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX: (_ULL, lambda d, link: d.tx_kib[link] * 1.07),
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX: (_ULL, lambda d, link: d.rx_kib[link] * 1.07),
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY: (_ULL, lambda d, link: d.link_errors[link]["replay"]),
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY: (_ULL, lambda d, link: d.link_errors[link]["recovery"]),
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC: (_ULL, lambda d, link: d.link_errors[link]["crc_flit"]),
}


class FakeEventSet:
    """An `nvmlEventSet_t`: the devices registered on it, and XIDs due from the fixture's schedule.
    With the fixture's `kernel_log` (a file), each XID is also written there as the driver writes it
    to the kernel log (`/dev/kmsg`'s record format), for the incidents' kernel lines."""

    def __init__(self, t0: float, kernel_log: str | None = None) -> None:
        self._t0 = t0
        self._kernel_log = kernel_log
        self._kernel_seq = 0
        self.freed = False
        self._devices: dict[int, tuple[FakeDevice, Any, int]] = {}
        self._fired: dict[tuple[int, int], int] = collections.defaultdict(int)
        self._injected: collections.deque[tuple[int, int]] = collections.deque()

    def register(self, dev: FakeDevice, handle: Any, mask: int) -> None:
        _, _, old = self._devices.get(dev.index, (dev, handle, 0))
        self._devices[dev.index] = (dev, handle, old | mask)

    def _watches_xid(self, index: int) -> bool:
        entry = self._devices.get(index)
        return entry is not None and bool(entry[2] & pynvml.nvmlEventTypeXidCriticalError)

    def inject(self, index: int, xid: int) -> None:
        if self._watches_xid(index):
            self._injected.append((index, xid))

    def _next_times(self) -> list[tuple[float, int, int, int]]:
        """(due time, device index, schedule position, xid) of each device's next scheduled XID."""
        out = []
        for index, (dev, _, _) in self._devices.items():
            if not self._watches_xid(index):
                continue
            for pos, entry in enumerate(dev.spec["xid_schedule"]):
                k = self._fired[(index, pos)]
                every = entry.get("every_seconds")
                if k > 0 and not every:
                    continue
                out.append((self._t0 + float(entry["at_seconds"]) + k * float(every or 0), index, pos, int(entry["xid"])))
        return sorted(out)

    def pop_due(self, now: float) -> Any | None:
        if self._injected:
            index, xid = self._injected.popleft()
            return self._event(index, xid)
        for due, index, pos, xid in self._next_times():
            if due <= now:
                self._fired[(index, pos)] += 1
                return self._event(index, xid)
        return None

    def seconds_to_next(self, now: float) -> float:
        if self._injected:
            return 0.0
        times = self._next_times()
        return max(0.0, times[0][0] - now) if times else math.inf

    def _event(self, index: int, xid: int) -> Any:
        dev, handle, _ = self._devices[index]
        if self._kernel_log is not None:
            self._kernel_seq += 1
            address = kernel_address(str(dev.spec["pci_bus_id"])) or "0000:00:00"
            with open(self._kernel_log, "a") as f:  # the kernel's clock: real monotonic microseconds
                f.write(f"3,{self._kernel_seq},{int(time.monotonic() * 1e6)},-;NVRM: Xid (PCI:{address}): {xid}, "
                        "pid='<unknown>', name=<unknown>, simulated by the fake fixture\n")
        return pynvml.nvmlFriendlyObject(
            {
                "device": handle,
                "eventType": pynvml.nvmlEventTypeXidCriticalError,
                "eventData": xid,
                "gpuInstanceId": 0xFFFFFFFF,
                "computeInstanceId": 0xFFFFFFFF,
            }
        )
