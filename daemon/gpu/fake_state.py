"""The fake NVML's state and test hooks: its devices (from the fixture), the clock their counters
integrate over, the lock every call holds, the injected failures and event sets; `nvml_call`, the
wrapper every pynvml function of the fake goes through (counted, nvmlInit checked, failures
injected). The pynvml functions themselves are fake_api's, composed into FakeNvml in fake.py.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from typing import Any

import pynvml

from spx.daemon.gpu.fake_procs import ProcessFilter, ProcessScanner
from spx.daemon.gpu.fake_sim import FakeDevice, FakeEventSet

NVMLError = pynvml.NVMLError
MIB = 1024 * 1024


class FakeHandle:
    """Stands in for `c_nvmlDevice_t`: an opaque handle; only the fake looks inside."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"<fake nvmlDevice {self.index}>"


def nvml_call(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Count the call, check nvmlInit, and serialise on the fake's lock (NVML itself is thread-safe)."""
    name = fn.__name__

    def wrapper(self: FakeNvmlState, *args: Any, **kwargs: Any) -> Any:
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


class FakeNvmlState:
    """What every part of the fake reads: the fixture's devices and their faults (see fake.py)."""

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
        # Where the fake's XIDs are written as the kernel's lines (None: nowhere; the fake has no kernel log).
        self.kernel_log: str | None = fixture.get("kernel_log")
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

    def _proc_memory(self, dev: FakeDevice) -> dict[int, int]:
        """The GPU memory each live process on `dev` holds (the fixture's amount per process)."""
        per_pid = int(dev.spec["process_memory_mib"]) * MIB
        return {pid: per_pid for pid in self._procs.pids(dev.index)}
