"""The pynvml functions of the fake NVML, with pynvml's names, arguments, return shapes and errors,
in classes by subject; FakeNvml (fake.py) is all of them over one FakeNvmlState. Each call goes
through `nvml_call` (counted, nvmlInit checked, injected failures raised) and reads its device
through `_dev` (a lost GPU raises; counters advance to the clock's now).
"""

from __future__ import annotations

import time
from typing import Any

import pynvml

from spx.daemon.gpu.fake_sim import FakeEventSet
from spx.daemon.gpu.fake_state import FakeHandle, FakeNvmlState, NVMLError, nvml_call


class DeviceIdentity(FakeNvmlState):
    """nvmlInit and shutdown, the driver's versions, and which GPUs there are: count, handles, index,
    name, UUID, minor number, serial, PCI info."""

    @nvml_call
    def nvmlInit(self) -> None:
        self._init_count += 1

    @nvml_call
    def nvmlInitWithFlags(self, flags: int) -> None:
        self._init_count += 1

    @nvml_call
    def nvmlShutdown(self) -> None:
        self._init_count -= 1

    @nvml_call
    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver_version

    @nvml_call
    def nvmlSystemGetNVMLVersion(self) -> str:
        return str(self.fixture.get("nvml_version", ""))

    @nvml_call
    def nvmlDeviceGetCount(self) -> int:
        return len(self._devices)

    @nvml_call
    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        if not 0 <= index < len(self._devices):
            raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if self._devices[index].lost:
            raise NVMLError(self._devices[index].lost)
        return FakeHandle(index)

    @nvml_call
    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        return self._dev(handle).index

    @nvml_call
    def nvmlDeviceGetName(self, handle: Any) -> str:
        return str(self._dev(handle).spec["name"])

    @nvml_call
    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return str(self._dev(handle).spec["uuid"])

    @nvml_call
    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        """/dev/nvidiaN's N: the fixture's `minor`, else the index (real hosts may differ)."""
        return int(self._dev(handle).spec.get("minor", self._dev(handle).index))

    @nvml_call
    def nvmlDeviceGetSerial(self, handle: Any) -> str:
        return str(self._dev(handle).spec.get("serial", ""))

    @nvml_call
    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        dev = self._dev(handle)
        info = pynvml.nvmlPciInfo_t()
        bus_id = str(dev.spec["pci_bus_id"])
        info.busId = bus_id.encode()
        info.busIdLegacy = bus_id[4:].encode()
        domain, bus, rest = bus_id.split(":")
        info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(rest.split(".")[0], 16)
        info.pciDeviceId = 0x233010DE  # GH100 [H100 SXM5 80GB]
        info.pciSubSystemId = 0x16C110DE
        return info


class DeviceReadings(FakeNvmlState):
    """What a scrape reads of a GPU: memory and the processes holding it, utilization, power and
    energy, temperature, clocks and why they are held back, PCIe throughput, and field values."""

    @nvml_call
    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        dev = self._dev(handle)
        total, reserved, used = dev.memory(self._proc_memory(dev))
        if not version:
            v1 = pynvml.c_nvmlMemory_t()
            v1.total, v1.used, v1.free = total, used + reserved, total - used - reserved
            return v1
        if version != pynvml.nvmlMemory_v2:
            raise NVMLError(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        v2 = pynvml.c_nvmlMemory_v2_t()
        v2.version, v2.total, v2.reserved, v2.used = version, total, reserved, used
        v2.free = total - reserved - used
        return v2

    @nvml_call
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        dev = self._dev(handle)
        return [
            pynvml.nvmlFriendlyObject(
                {"pid": pid, "usedGpuMemory": used, "gpuInstanceId": 0xFFFFFFFF, "computeInstanceId": 0xFFFFFFFF}
            )
            for pid, used in sorted(self._proc_memory(dev).items())
        ]

    nvmlDeviceGetComputeRunningProcesses_v3 = nvmlDeviceGetComputeRunningProcesses

    @nvml_call
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        util = pynvml.c_nvmlUtilization_t()
        util.gpu, util.memory = self._dev(handle).utilization()
        return util

    @nvml_call
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._dev(handle).power_mw()

    @nvml_call
    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return int(self._dev(handle).spec["power_limit_mw"])

    nvmlDeviceGetPowerManagementLimit = nvmlDeviceGetEnforcedPowerLimit

    @nvml_call
    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        return int(self._dev(handle).energy_mj)

    @nvml_call
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._dev(handle).temperature()

    @nvml_call
    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: int) -> int:
        return self._dev(handle).clock_mhz(clock_type)

    @nvml_call
    def nvmlDeviceGetMaxClockInfo(self, handle: Any, clock_type: int) -> int:
        return self._dev(handle).max_clock_mhz(clock_type)

    @nvml_call
    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return self._dev(handle).clock_event_reasons()

    nvmlDeviceGetCurrentClocksThrottleReasons = nvmlDeviceGetCurrentClocksEventReasons

    @nvml_call
    def nvmlDeviceGetPcieThroughput(self, handle: Any, counter: int) -> int:
        return self._dev(handle).pcie_kib_per_s(counter)

    @nvml_call
    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: list[Any]) -> Any:
        """Like the driver: one array entry per requested (fieldId[, scopeId]); per-entry nvmlReturn."""
        dev = self._dev(handle)
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        now_us = int(time.time() * 1e6)
        for i, requested in enumerate(field_ids):
            fid, scope = requested if isinstance(requested, tuple) else (requested, 0)
            out = values[i]
            out.fieldId, out.scopeId, out.timestamp, out.latencyUsec = fid, scope, now_us, 0
            ret, vtype, value = dev.field(fid, scope)
            out.nvmlReturn = ret
            if ret == pynvml.NVML_SUCCESS:
                out.valueType = vtype
                if vtype == pynvml.NVML_VALUE_TYPE_DOUBLE:
                    out.value.dVal = float(value)
                elif vtype == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT:
                    out.value.uiVal = int(value)
                else:
                    out.value.ullVal = int(value)
        return values


class DeviceHealth(FakeNvmlState):
    """What says a GPU is failing: ECC error counts, remapped rows, NVLink link states and error counters."""

    @nvml_call
    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int:
        return self._dev(handle).ecc(error_type)

    @nvml_call
    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        rows = self._dev(handle).spec["remapped_rows"]
        return (rows["correctable"], rows["uncorrectable"], rows["pending"], rows["failure"])

    @nvml_call
    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        return self._dev(handle).link_state(link)

    @nvml_call
    def nvmlDeviceGetNvLinkErrorCounter(self, handle: Any, link: int, counter: int) -> int:
        return self._dev(handle).link_error_counter(link, counter)


class DeviceEvents(FakeNvmlState):
    """Event sets: XID and ECC events, due by the fixture's schedule or injected by a test."""

    @nvml_call
    def nvmlEventSetCreate(self) -> FakeEventSet:
        es = FakeEventSet(self._t0, self.kernel_log)
        self._event_sets.append(es)
        return es

    @nvml_call
    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        self._dev(handle)
        return int(pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeSingleBitEccError
                   | pynvml.nvmlEventTypeDoubleBitEccError)

    @nvml_call
    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: FakeEventSet) -> None:
        dev = self._dev(handle)
        if event_set.freed:
            raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        event_set.register(dev, handle, event_types)

    @nvml_call
    def nvmlEventSetWait_v2(self, event_set: FakeEventSet, timeout_ms: int) -> Any:
        """Block until an event is due or `timeout_ms` passes (then NVMLError(TIMEOUT), as pynvml)."""
        deadline = time.monotonic() + timeout_ms / 1000.0
        while True:
            if event_set.freed:
                raise NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
            now = self._clock()
            event = event_set.pop_due(now)
            if event is not None:
                return event
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise NVMLError(pynvml.NVML_ERROR_TIMEOUT)
            self._wake.wait(min(remaining, event_set.seconds_to_next(now)))

    nvmlEventSetWait = nvmlEventSetWait_v2

    @nvml_call
    def nvmlEventSetFree(self, event_set: FakeEventSet) -> None:
        event_set.freed = True
        if event_set in self._event_sets:
            self._event_sets.remove(event_set)
        self._wake.notify_all()
