"""The XID event thread on the real driver: it registers every GPU that supports XID events,
reports `spx_xid_watch_up 1`, counts nothing it did not see, and stops within a wait timeout.

(Provoking a real XID needs a faulting kernel or a GPU reset; the event path itself is covered
against the fake in tests/exporter/test_exporter_xid.py.)
"""

from __future__ import annotations

import threading
import time

import pytest
from metrics_text import scrape, value

from spx.daemon.exporter.server import build_registry
from spx.daemon.gpu.xid import WAIT_TIMEOUT_MS


def xid_capable(nvml, handle) -> bool:
    try:
        return bool(nvml.nvmlDeviceGetSupportedEventTypes(handle) & nvml.nvmlEventTypeXidCriticalError)
    except nvml.NVMLError as err:
        if err.value == nvml.NVML_ERROR_NOT_SUPPORTED:
            return False
        raise


def test_xid_watcher_on_real_nvml_starts_watches_every_capable_gpu_and_stops_cleanly(nvml_backend, nvml):
    capable = {d.index for d in nvml_backend.devices() if xid_capable(nvml, nvml.nvmlDeviceGetHandleByIndex(d.index))}
    if not capable:
        pytest.skip("no GPU here supports XID critical-error events (nvmlDeviceGetSupportedEventTypes), "
                    "e.g. a vGPU or a driver without event support: nothing to watch")
    registry = build_registry(nvml_backend, lambda: [], "t")
    watcher = nvml_backend.xid_watcher
    assert watcher is not None and watcher.running
    assert watcher.watched() == capable, (
        f"XID events registered on GPUs {sorted(watcher.watched())}, supported on {sorted(capable)} "
        "(nvmlDeviceRegisterEvents needs root on some drivers)")
    time.sleep(2 * WAIT_TIMEOUT_MS / 1000)  # a few nvmlEventSetWait_v2 timeouts go by
    text = scrape(registry)
    assert value(text, "spx_xid_watch_up") == 1
    assert watcher.errors() == {}, f"the XID thread's NVML calls failed: {watcher.errors()}"
    counts = watcher.counts()
    for index in capable:
        # Pre-created at 0 for alerting, so present even on a healthy GPU; a real XID during the test
        # (a host problem, not the daemon's) shows in the count and in the daemon's log.
        assert value(text, "spx_gpu_xid_errors_total", gpu=str(index), xid="79") == counts[(index, 79)]
    start = time.monotonic()
    nvml_backend.close()
    assert not watcher.running
    assert time.monotonic() - start < 2 * WAIT_TIMEOUT_MS / 1000 + 1.0, "close() waited too long for the XID thread"
    assert not [t for t in threading.enumerate() if t.name == "spx-xid-watch"]
