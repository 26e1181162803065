"""The GPU backend: which NVML the daemon talks to, and the few questions the scheduler asks it.

`open_backend("nvml")` wraps the real `pynvml` module; `open_backend("fake")` wraps `FakeNvml`, a
module-like object with the same function names, return shapes and `NVMLError` codes, driven by a
fixture of an 8×H100 SXM5 host. Everything above this file (scheduler, exporter) calls
`backend.nvml.<pynvml function>` and cannot tell the two apart, so the code that runs against the fake
in CI is the code that runs on a real host. `none` means "no GPUs": CPU jobs only.

The backend also owns the XID event thread (`start_xid_watch()`), because XID events are a stream from
the same NVML session; `close()` stops it and shuts NVML down.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from spx.daemon.gpu.kernel_log import KMSG
from spx.daemon.gpu.recent import RecentReadings
from spx.daemon.gpu.xid import XidEvent, XidWatcher, handle_key

__all__ = ["GpuBackend", "GpuBackendError", "GpuDevice", "open_backend", "fake_backend", "handle_key", "XidEvent"]

log = structlog.get_logger(__name__)

BACKEND_KINDS = ("auto", "nvml", "fake", "none")


class GpuBackendError(RuntimeError):
    """The requested backend cannot be opened (e.g. `--gpu-backend nvml` on a host without a driver)."""


@dataclass(frozen=True)
class GpuDevice:
    """A GPU as found at start-up. Identity only: nothing here changes while the daemon runs."""

    index: int
    uuid: str
    name: str
    memory_total_bytes: int
    pci_bus_id: str
    minor: int | None  # N of /dev/nvidiaN (NVML's minor number, not always the index); None: NVML cannot say


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class GpuBackend:
    """One NVML session (real or fake) and the devices found when it opened.

    `kind` is "nvml", "fake" or "none"; `description` is one line for the log and `spx doctor`;
    `nvml` is the `pynvml` module, the `FakeNvml` object, or None for "none". Device handles are looked
    up once at open; a GPU that later falls off the bus keeps its index and answers with errors.
    """

    def __init__(self, kind: str, description: str, nvml: Any, driver_version: str = "") -> None:
        self.kind = kind
        self.description = description
        self.nvml = nvml
        self.driver_version = driver_version
        self._devices: list[GpuDevice] = []
        self._handles: list[Any] = []
        self._lock = threading.Lock()
        self._xid: XidWatcher | None = None
        self._closed = False
        # What the collector read on its last scrapes and the XIDs heard: the minutes before an incident.
        self.recent = RecentReadings()
        # Where the kernel writes about these GPUs (the fake's: its fixture's file, or none).
        self.kernel_log: str | None = KMSG if nvml is not None else None
        if nvml is not None:
            self._discover()

    def _discover(self) -> None:
        nvml = self.nvml
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            try:
                memory_total = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
            except nvml.NVMLError as err:  # lost already at start: listed (up 0), never healthy or allocated
                log.warning("gpu_unusable_at_start", gpu=index, error=str(err))
                memory_total = 0
            try:
                minor: int | None = int(nvml.nvmlDeviceGetMinorNumber(handle))
            except nvml.NVMLError as err:  # no job is let open a node NVML cannot name (device_filter)
                log.warning("gpu_minor_unknown", gpu=index, error=str(err))
                minor = None
            self._handles.append(handle)
            self._devices.append(
                GpuDevice(
                    index=index,
                    uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                    name=_text(nvml.nvmlDeviceGetName(handle)),
                    memory_total_bytes=memory_total,
                    pci_bus_id=_text(nvml.nvmlDeviceGetPciInfo(handle).busId),
                    minor=minor,
                )
            )

    def devices(self) -> list[GpuDevice]:
        return list(self._devices)

    def handle(self, index: int) -> Any:
        """The NVML handle of GPU `index` (IndexError if there is no such GPU)."""
        return self._handles[index]

    def compute_pids(self, index: int) -> list[int] | None:
        """Pids with a compute context on GPU `index`; None when NVML cannot say (treat as busy)."""
        if self.nvml is None or not 0 <= index < len(self._handles):
            return None
        try:
            procs = self.nvml.nvmlDeviceGetComputeRunningProcesses(self._handles[index])
        except self.nvml.NVMLError as err:
            log.warning("nvml_compute_pids_failed", gpu=index, error=str(err))
            return None
        return sorted({int(p.pid) for p in procs})

    def computing(self, index: int) -> bool | None:
        """Whether GPU `index` computed over NVML's last sample period (utilization above 0); None
        when NVML cannot say (treat as computing)."""
        if self.nvml is None or not 0 <= index < len(self._handles):
            return None
        try:
            return int(self.nvml.nvmlDeviceGetUtilizationRates(self._handles[index]).gpu) > 0
        except self.nvml.NVMLError:
            return None

    def healthy(self, index: int) -> bool:
        """False when NVML errors for this GPU (lost, fallen off the bus, needs a reset)."""
        if self.nvml is None or not 0 <= index < len(self._handles):
            return False
        try:
            self.nvml.nvmlDeviceGetMemoryInfo(self._handles[index])
        except self.nvml.NVMLError:
            return False
        return True

    # -- XID events ------------------------------------------------------------------------------

    def start_xid_watch(self, on_event: Callable[[XidEvent], None] | None = None) -> XidWatcher | None:
        """Start the XID event thread once (idempotent); `on_event` listeners may be added any time.

        Returns the watcher, or None for the "none" backend. `close()` stops the thread.
        """
        if self.nvml is None:
            return None
        with self._lock:
            if self._closed:
                raise GpuBackendError("backend is closed")
            if self._xid is None:
                self._xid = XidWatcher(self.nvml, self._handles, simulated=self.kind == "fake")
                self._xid.add_listener(lambda event: self.recent.xid(event.gpu, event.xid))
                self._xid.start()
            if on_event is not None:
                self._xid.add_listener(on_event)
            return self._xid

    @property
    def xid_watcher(self) -> XidWatcher | None:
        return self._xid

    def close(self) -> None:
        """Stop the XID thread and shut NVML down. Safe to call twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            watcher, self._xid = self._xid, None
        if watcher is not None:
            watcher.stop()
        if self.nvml is not None:
            try:
                self.nvml.nvmlShutdown()
            except self.nvml.NVMLError as err:
                log.warning("nvml_shutdown_failed", error=str(err))

    def __enter__(self) -> GpuBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _open_nvml() -> GpuBackend:
    import pynvml

    pynvml.nvmlInit()
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        backend = GpuBackend("nvml", "", pynvml, driver)
    except BaseException:
        pynvml.nvmlShutdown()
        raise
    names = {d.name for d in backend.devices()}
    backend.description = f"nvml: {len(backend.devices())}× {', '.join(sorted(names)) or 'no GPUs'} (driver {driver})"
    return backend


def fake_backend(fake: Any) -> GpuBackend:
    """A "fake" backend over a `FakeNvml` built by the caller (tests: custom clock, fixture, filter)."""
    fake.nvmlInit()
    backend = GpuBackend("fake", "", fake, fake.driver_version)
    backend.kernel_log = fake.kernel_log
    names = {d.name for d in backend.devices()}
    backend.description = f"fake: {len(backend.devices())}× {', '.join(sorted(names))} (fixture {fake.source})"
    faults = fake.injected_faults()
    if faults:
        log.info("gpu_fake_fixture_faults", fixture=fake.source, faults=faults,
                 detail="simulated faults of the fake fixture, not of this host; their XIDs are logged at info")
    return backend


def _open_fake(fixture: Path | None, scope: Path | None) -> GpuBackend:
    from spx.daemon.gpu.fake import DEFAULT_FIXTURE, FakeNvml
    from spx.daemon.gpu.fake_procs import run_dir_filter

    process_filter = run_dir_filter(scope) if scope is not None else None
    return fake_backend(FakeNvml.from_fixture(fixture or DEFAULT_FIXTURE, process_filter=process_filter))


def open_backend(kind: str, fake_fixture: Path | None = None, fake_scope: Path | None = None) -> GpuBackend:
    """Open the GPU backend named by `--gpu-backend`.

    auto: NVML if `nvmlInit` works, else "none" with the reason in `description`.
    nvml: NVML or a `GpuBackendError` saying why not (no silent fallback: the operator asked for GPUs).
    fake: the bundled 8×H100 SXM5 fixture, or `fake_fixture`. Only ever chosen explicitly.
      `fake_scope`: a daemon's run dir; the fake then sees only that daemon's job processes as
      using its GPUs, so each daemon on a test machine has a host of its own (see fake_procs).
    none: no GPUs; CPU jobs only.
    """
    if kind not in BACKEND_KINDS:
        raise GpuBackendError(f"unknown GPU backend {kind!r}; use one of {', '.join(BACKEND_KINDS)}")
    if kind == "fake":
        return _open_fake(fake_fixture, fake_scope)
    if kind == "none":
        return GpuBackend("none", "none: GPU backend disabled (--gpu-backend none)", None)
    import pynvml

    try:
        return _open_nvml()
    except pynvml.NVMLError as err:
        reason = f"NVML not available ({err})"
        if kind == "nvml":
            raise GpuBackendError(
                f"--gpu-backend nvml: {reason}; install the NVIDIA driver (libnvidia-ml.so.1) "
                "or run with --gpu-backend auto|none"
            ) from err
        return GpuBackend("none", f"none: {reason}", None)
