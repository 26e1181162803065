"""XID events: a thread blocked in `nvmlEventSetWait` that counts every XID critical error per GPU.

XIDs are events, not states, so a last-value gauge would lose all but one of a burst and forget one
that happened between scrapes; the counters here only ever go up, and the exporter reads them as
`spx_gpu_xid_errors_total{xid}`. Listeners (e.g. the supervisor, to classify a failure as a GPU fault)
are called on this thread and must only enqueue.
"""

from __future__ import annotations

import collections
import ctypes
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

log = structlog.get_logger(__name__)

# XIDs that operators alert on; their counters exist at 0 from the start so `increase()` sees the
# first one (a series that appears at 1 has no increase). Others appear when they first happen.
# 13 graphics engine exception, 31 MMU fault, 43 GPU stopped, 45 preemptive cleanup, 48 DBE, 61/62
# internal micro-controller, 63/64 row remapping, 74 NVLink error, 79 fallen off the bus, 92 high
# single-bit ECC rate, 94/95 contained/uncontained ECC, 119/120 GSP errors.
WELL_KNOWN_XIDS = (13, 31, 43, 45, 48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120)

WAIT_TIMEOUT_MS = 500


def handle_key(handle: Any) -> int:
    """A hashable identity for an NVML device handle (real handles are ctypes pointers)."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value or 0
    except (TypeError, ctypes.ArgumentError):
        return id(handle)


@dataclass(frozen=True)
class XidEvent:
    gpu: int
    xid: int


class XidWatcher:
    """Counts XID critical-error events for the given device handles (index = position)."""

    def __init__(self, nvml: Any, handles: list[Any], simulated: bool = False) -> None:
        """`simulated`: the fake backend's fixture raises these XIDs on purpose (said once at open),
        so each one is logged at info, not as a warning that would alarm someone trying things out."""
        self._nvml = nvml
        self._simulated = simulated
        self._handles = list(handles)
        self._counts: dict[tuple[int, int], int] = {(i, x): 0 for i in range(len(handles)) for x in WELL_KNOWN_XIDS}
        self._watched: set[int] = set()
        self._listeners: list[Callable[[XidEvent], None]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._event_set: Any = None
        self._errors: collections.Counter[str] = collections.Counter()

    def start(self) -> None:
        """Register every GPU that supports XID events and start the thread (once)."""
        if self._thread is not None:
            return
        nvml = self._nvml
        try:
            self._event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as err:
            log.warning("xid_watch_unavailable", error=str(err))
            self._errors["nvmlEventSetCreate"] += 1
            return
        self._by_key: dict[int, int] = {}
        for index, handle in enumerate(self._handles):
            try:
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, self._event_set)
            except nvml.NVMLError as err:
                log.warning("xid_watch_register_failed", gpu=index, error=str(err))
                if err.value != nvml.NVML_ERROR_NOT_SUPPORTED:
                    self._errors["nvmlDeviceRegisterEvents"] += 1
                continue
            self._watched.add(index)
            self._by_key[handle_key(handle)] = index
        if not self._watched:  # a thread watching nothing would report spx_xid_watch_up 1
            log.warning("xid_watch_unavailable", error="no GPU accepted XID event registration")
            self.stop()
            return
        self._thread = threading.Thread(target=self._run, name="spx-xid-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        nvml = self._nvml
        while not self._stop.is_set():
            try:
                data = nvml.nvmlEventSetWait_v2(self._event_set, WAIT_TIMEOUT_MS)
            except nvml.NVMLError as err:
                if err.value == nvml.NVML_ERROR_TIMEOUT:
                    continue
                # A GPU that falls off the bus can make the wait fail; keep watching the others,
                # but do not spin.
                log.warning("xid_wait_failed", error=str(err))
                with self._lock:
                    self._errors["nvmlEventSetWait_v2"] += 1
                self._stop.wait(1.0)
                continue
            if not data.eventType & nvml.nvmlEventTypeXidCriticalError:
                continue
            index = self._by_key.get(handle_key(data.device))
            if index is None:
                continue
            event = XidEvent(gpu=index, xid=int(data.eventData))
            with self._lock:
                key = (event.gpu, event.xid)
                self._counts[key] = self._counts.get(key, 0) + 1
                listeners = list(self._listeners)
            if self._simulated:
                log.info("gpu_xid", gpu=event.gpu, xid=event.xid, simulated=True)
            else:
                log.warning("gpu_xid", gpu=event.gpu, xid=event.xid)
            for listener in listeners:
                try:
                    listener(event)
                except Exception:
                    log.exception("xid_listener_failed")

    def errors(self) -> dict[str, int]:
        """Failed NVML calls of the watcher, by function (exported with the collector's)."""
        with self._lock:
            return dict(self._errors)

    def add_listener(self, listener: Callable[[XidEvent], None]) -> None:
        with self._lock:
            self._listeners.append(listener)

    def counts(self) -> dict[tuple[int, int], int]:
        """{(gpu index, xid): events since the daemon started} for the GPUs being watched."""
        with self._lock:
            return {k: v for k, v in self._counts.items() if k[0] in self._watched}

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def watched(self) -> set[int]:
        return set(self._watched)

    def stop(self) -> None:
        """Stop the thread (within one wait timeout) and free the event set."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5 * WAIT_TIMEOUT_MS / 1000)
            self._thread = None
        if self._event_set is not None:
            try:
                self._nvml.nvmlEventSetFree(self._event_set)
            except self._nvml.NVMLError as err:
                log.warning("xid_event_set_free_failed", error=str(err))
            self._event_set = None
