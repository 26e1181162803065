"""XID events feed a real counter (fixture schedule and injected events), and the thread stops."""

from __future__ import annotations

import copy
import json

import pynvml
from exporter_support import ManualClock
from metrics_text import scrape, value

from harness import wait_for
from spx.daemon.exporter.server import build_registry
from spx.daemon.gpu.fake import DEFAULT_FIXTURE


def test_fixture_xid79_fires_at_open_and_on_schedule(make_backend):
    fixture = json.loads(DEFAULT_FIXTURE.read_text())
    fixture = copy.deepcopy(fixture)
    fixture["devices"][3]["xid_schedule"] = [{"xid": 79, "at_seconds": 0.0, "every_seconds": 60.0}]
    clock = ManualClock()
    backend = make_backend(clock=clock, fixture=fixture)
    registry = build_registry(backend, lambda: [], "t")
    watcher = backend.xid_watcher
    wait_for(lambda: watcher.counts()[(3, 79)] == 1, 10, "XID 79 at open")
    assert value(scrape(registry), "spx_gpu_xid_errors_total", gpu="3", xid="79") == 1
    clock.advance(125)  # two more periods due
    wait_for(lambda: watcher.counts()[(3, 79)] == 3, 10, "two scheduled XID 79s")
    text = scrape(registry)
    assert value(text, "spx_gpu_xid_errors_total", gpu="3", xid="79") == 3
    assert value(text, "spx_gpu_xid_errors_total", gpu="2", xid="79") == 0  # pre-created at 0


def test_injected_xids_count_every_event_and_notify_listeners(make_backend):
    backend = make_backend(clock=ManualClock())
    registry = build_registry(backend, lambda: [], "t")
    seen = []
    backend.start_xid_watch(seen.append)
    for _ in range(3):
        backend.nvml.inject_xid(2, 48)
    backend.nvml.inject_xid(2, 4242)
    wait_for(lambda: backend.xid_watcher.counts().get((2, 4242)) == 1, 10, "injected XIDs")
    text = scrape(registry)
    assert value(text, "spx_gpu_xid_errors_total", gpu="2", xid="48") == 3
    assert value(text, "spx_gpu_xid_errors_total", gpu="2", xid="4242") == 1
    assert [(e.gpu, e.xid) for e in seen if e.gpu == 2] == [(2, 48)] * 3 + [(2, 4242)]


def test_close_stops_the_thread(make_backend):
    backend = make_backend()
    build_registry(backend, lambda: [], "t")
    watcher = backend.xid_watcher
    assert watcher.running
    backend.close()
    assert not watcher.running
    backend.close()  # idempotent


def test_no_gpu_accepting_xid_registration_reads_watch_down(make_backend):
    """A watcher thread that watches nothing must not claim XIDs are being counted."""
    backend = make_backend()
    backend.nvml.fail_function("nvmlDeviceRegisterEvents", code=pynvml.NVML_ERROR_NO_PERMISSION)
    text = scrape(build_registry(backend, lambda: [], "t"))
    assert value(text, "spx_xid_watch_up") == 0
    assert value(text, "spx_nvml_errors_total", function="nvmlDeviceRegisterEvents") == 8
