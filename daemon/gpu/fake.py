"""A fake NVML: the `pynvml` functions the daemon calls, with pynvml's names, return shapes and errors.

Chosen only by `--gpu-backend fake`. Driven by a fixture (default: `fixtures/h100-sxm5-8.json`, an HGX
H100 board: 8× "NVIDIA H100 80GB HBM3", 18 NVLink4 links each; GPU 3 has link 7 down and raises XID 79).
Constants, structs and `NVMLError` are pynvml's own, so field ids and error codes match a real driver.

Values are derived from the (injectable) monotonic clock: counters (energy, NVLink and PCIe bytes,
NVLink errors) integrate a rate and move between scrapes; a GPU is busy while a live process of a job
can see it (see `fake_procs`), which raises utilization, power, clocks and traffic.

Test hooks (the fake's own API, not pynvml's): `fail_gpu()` makes a GPU answer like one that fell off
the bus, `fail_function()` makes one function fail, `inject_xid()` queues an XID event; `calls` counts
every NVML call by function name.
"""

from __future__ import annotations

import collections
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml

from spx.daemon.gpu.fake_procs import ProcessFilter, ProcessScanner
from spx.daemon.gpu.fake_sim import FakeDevice, FakeEventSet

DEFAULT_FIXTURE = Path(__file__).parent / "fixtures" / "h100-sxm5-8.json"

NVMLError = pynvml.NVMLError
MIB = 1024 * 1024


class FakeHandle:
    """Stands in for `c_nvmlDevice_t`: an opaque handle; only the fake looks inside."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"<fake nvmlDevice {self.index}>"


def _api(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Count the call, check nvmlInit, and serialise on the fake's lock (NVML itself is thread-safe)."""
    name = fn.__name__

    def wrapper(self: FakeNvml, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            self.calls[name] += 1
            if name not in ("nvmlInit", "nvmlInitWithFlags") and self._init_count == 0:
                raise NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
            injected = self._fail_fn.get((name, None)) or (
                self._fail_fn.get((name, args[0].index)) if args and isinstance(args[0], FakeHandle) else None
            )
            if injected is not None:
                raise NVMLError(injected)
            return fn(self, *args, **kwargs)

    wrapper.__name__ = name
    wrapper.__doc__ = fn.__doc__
    return wrapper


class FakeNvml:
    """Module-like stand-in for `pynvml` (see module docstring)."""

    NVMLError = pynvml.NVMLError

    def __init__(
        self,
        fixture: dict[str, Any],
        clock: Callable[[], float] = time.monotonic,
        process_filter: ProcessFilter | None = None,
        source: str = "<dict>",
    ) -> None:
        self.fixture = fixture
        self.source = source
        self.driver_version: str = fixture["driver_version"]
        self.calls: collections.Counter[str] = collections.Counter()
        self._clock = clock
        self._lock = threading.RLock()
        self._wake = threading.Condition(self._lock)
        self._init_count = 0
        defaults = fixture.get("defaults", {})
        self._t0 = clock()
        self._devices = [
            FakeDevice(i, {**defaults, **spec}, self._t0) for i, spec in enumerate(fixture["devices"])
        ]
        # A fixture can describe a flaky host: {"failing_functions": {"nvmlDeviceGetPcieThroughput":
        # "UNKNOWN"}} on a device makes that call fail there with pynvml's NVML_ERROR_UNKNOWN.
        self._fail_fn: dict[tuple[str, int | None], int] = {
            (function, dev.index): getattr(pynvml, f"NVML_ERROR_{error}")
            for dev in self._devices
            for function, error in dev.spec.get("failing_functions", {}).items()
        }
        self._procs = ProcessScanner([d.spec["uuid"] for d in self._devices], process_filter)
        self._event_sets: list[FakeEventSet] = []

    @classmethod
    def from_fixture(cls, path: Path | str = DEFAULT_FIXTURE, **kwargs: Any) -> FakeNvml:
        path = Path(path)
        return cls(json.loads(path.read_text()), source=path.name, **kwargs)

    def __getattr__(self, name: str) -> Any:
        # pynvml's constants (NVML_*, nvmlClocksEventReason*, nvmlEventType*, nvmlMemory_v2, error
        # classes) so callers can use `backend.nvml.X` for either backend. Functions are never
        # forwarded: a pynvml function the fake lacks must fail loudly, not reach a real driver.
        value = getattr(pynvml, name)
        if callable(value) and not isinstance(value, type):
            raise AttributeError(f"FakeNvml does not implement {name}")
        return value

    def injected_faults(self) -> list[str]:
        """The faults the fixture carries on purpose (links down, scheduled XIDs, lost GPUs), in
        words: logged once when the fake opens, so a new user reads them as the fixture's, not theirs."""
        faults = []
        for dev in self._devices:
            if dev.spec.get("lost"):
                faults.append(f"GPU {dev.index}: fell off the bus")
            faults.extend(f"GPU {dev.index}: NVLink link {link} down" for link in sorted(dev.down))
            for entry in dev.spec["xid_schedule"]:
                every = f", then every {entry['every_seconds']:g} s" if entry.get("every_seconds") else ""
                faults.append(f"GPU {dev.index}: XID {entry['xid']} at {entry['at_seconds']:g} s{every}")
        return faults

    # -- test hooks ----------------------------------------------------------------------------

    def fail_gpu(self, index: int, code: int = pynvml.NVML_ERROR_GPU_IS_LOST) -> None:
        """From now on every call on GPU `index` raises NVMLError(code), like a GPU off the bus."""
        with self._lock:
            self._devices[index].lost = code

    def fail_function(self, name: str, index: int | None = None, code: int = pynvml.NVML_ERROR_UNKNOWN) -> None:
        """Make one pynvml function raise NVMLError(code) (for one GPU, or all when index is None)."""
        with self._lock:
            self._fail_fn[(name, index)] = code

    def restore(self, index: int | None = None) -> None:
        """Undo `fail_gpu`/`fail_function` (for one GPU, or all)."""
        with self._lock:
            for dev in self._devices:
                if index is None or dev.index == index:
                    dev.lost = pynvml.NVML_ERROR_GPU_IS_LOST if dev.spec.get("lost") else 0
            self._fail_fn = {k: v for k, v in self._fail_fn.items() if index is not None and k[1] != index}

    def inject_xid(self, index: int, xid: int) -> None:
        """Queue an XID event on GPU `index` for every event set that watches it."""
        with self._lock:
            for es in self._event_sets:
                es.inject(index, xid)
            self._wake.notify_all()

    # -- internals -----------------------------------------------------------------------------

    def _dev(self, handle: Any) -> FakeDevice:
        if not isinstance(handle, FakeHandle) or not 0 <= handle.index < len(self._devices):
            raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        dev = self._devices[handle.index]
        if dev.lost:
            raise NVMLError(dev.lost)
        now = self._clock()
        # A fixture's `stalled_from_seconds`: from then on the GPU computes nothing though its
        # processes still hold it (a hung collective, a deadlocked script), as a test of hang
        # detection without a heartbeat needs.
        stalled = dev.spec.get("stalled_from_seconds")
        dev.busy = bool(self._procs.pids(dev.index)) and not (stalled is not None and now - self._t0 >= stalled)
        dev.advance(now)
        return dev

    # -- pynvml API ----------------------------------------------------------------------------

    @_api
    def nvmlInit(self) -> None:
        self._init_count += 1

    @_api
    def nvmlInitWithFlags(self, flags: int) -> None:
        self._init_count += 1

    @_api
    def nvmlShutdown(self) -> None:
        self._init_count -= 1

    @_api
    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver_version

    @_api
    def nvmlSystemGetNVMLVersion(self) -> str:
        return str(self.fixture.get("nvml_version", ""))

    @_api
    def nvmlDeviceGetCount(self) -> int:
        return len(self._devices)

    @_api
    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        if not 0 <= index < len(self._devices):
            raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if self._devices[index].lost:
            raise NVMLError(self._devices[index].lost)
        return FakeHandle(index)

    @_api
    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        return self._dev(handle).index

    @_api
    def nvmlDeviceGetName(self, handle: Any) -> str:
        return str(self._dev(handle).spec["name"])

    @_api
    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return str(self._dev(handle).spec["uuid"])

    @_api
    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        """/dev/nvidiaN's N: the fixture's `minor`, else the index (real hosts may differ)."""
        return int(self._dev(handle).spec.get("minor", self._dev(handle).index))

    @_api
    def nvmlDeviceGetSerial(self, handle: Any) -> str:
        return str(self._dev(handle).spec.get("serial", ""))

    @_api
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

    @_api
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

    def _proc_memory(self, dev: FakeDevice) -> dict[int, int]:
        per_pid = int(dev.spec["process_memory_mib"]) * MIB
        return {pid: per_pid for pid in self._procs.pids(dev.index)}

    @_api
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        dev = self._dev(handle)
        return [
            pynvml.nvmlFriendlyObject(
                {"pid": pid, "usedGpuMemory": used, "gpuInstanceId": 0xFFFFFFFF, "computeInstanceId": 0xFFFFFFFF}
            )
            for pid, used in sorted(self._proc_memory(dev).items())
        ]

    nvmlDeviceGetComputeRunningProcesses_v3 = nvmlDeviceGetComputeRunningProcesses

    @_api
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        util = pynvml.c_nvmlUtilization_t()
        util.gpu, util.memory = self._dev(handle).utilization()
        return util

    @_api
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._dev(handle).power_mw()

    @_api
    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return int(self._dev(handle).spec["power_limit_mw"])

    nvmlDeviceGetPowerManagementLimit = nvmlDeviceGetEnforcedPowerLimit

    @_api
    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        return int(self._dev(handle).energy_mj)

    @_api
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._dev(handle).temperature()

    @_api
    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: int) -> int:
        return self._dev(handle).clock_mhz(clock_type)

    @_api
    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return self._dev(handle).clock_event_reasons()

    nvmlDeviceGetCurrentClocksThrottleReasons = nvmlDeviceGetCurrentClocksEventReasons

    @_api
    def nvmlDeviceGetPcieThroughput(self, handle: Any, counter: int) -> int:
        return self._dev(handle).pcie_kib_per_s(counter)

    @_api
    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int:
        return self._dev(handle).ecc(error_type)

    @_api
    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        rows = self._dev(handle).spec["remapped_rows"]
        return (rows["correctable"], rows["uncorrectable"], rows["pending"], rows["failure"])

    @_api
    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        return self._dev(handle).link_state(link)

    @_api
    def nvmlDeviceGetNvLinkErrorCounter(self, handle: Any, link: int, counter: int) -> int:
        return self._dev(handle).link_error_counter(link, counter)

    @_api
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

    # -- events ----------------------------------------------------------------------------------

    @_api
    def nvmlEventSetCreate(self) -> FakeEventSet:
        es = FakeEventSet(self._t0)
        self._event_sets.append(es)
        return es

    @_api
    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        self._dev(handle)
        return int(pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeSingleBitEccError
                   | pynvml.nvmlEventTypeDoubleBitEccError)

    @_api
    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: FakeEventSet) -> None:
        dev = self._dev(handle)
        if event_set.freed:
            raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        event_set.register(dev, handle, event_types)

    @_api
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

    @_api
    def nvmlEventSetFree(self, event_set: FakeEventSet) -> None:
        event_set.freed = True
        if event_set in self._event_sets:
            self._event_sets.remove(event_set)
        self._wake.notify_all()
