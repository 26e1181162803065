"""NVML calls per scrape: a fixed handful per GPU, independent of the NVLink link count."""

from __future__ import annotations

import copy
import json

from metrics_text import scrape

from spx.daemon.exporter.gpu_collector import CALLS_PER_GPU
from spx.daemon.exporter.server import build_registry
from spx.daemon.gpu.fake import DEFAULT_FIXTURE


def calls_of_one_scrape(backend) -> dict[str, int]:
    registry = build_registry(backend, lambda: [], "t")
    scrape(registry)  # the first scrape also asks each GPU for its link count, once
    backend.nvml.calls.clear()
    scrape(registry)
    return {k: v for k, v in backend.nvml.calls.items() if not k.startswith("nvmlEventSet")}


def test_steady_state_calls_per_gpu(make_backend):
    calls = calls_of_one_scrape(make_backend())
    assert sum(calls.values()) == 8 * len(CALLS_PER_GPU)
    assert calls["nvmlDeviceGetFieldValues"] == 8  # every link counter of a GPU in one call
    assert len(CALLS_PER_GPU) <= 10


def test_calls_do_not_grow_with_links(make_backend):
    fixture = json.loads(DEFAULT_FIXTURE.read_text())
    four = copy.deepcopy(fixture)
    four["defaults"]["nvlink_links"] = 4
    four["devices"][3]["nvlink_down"] = []
    assert calls_of_one_scrape(make_backend(fixture=four)) == calls_of_one_scrape(make_backend(fixture=fixture))


def test_counters_move_between_scrapes(make_backend):
    from exporter_support import ManualClock
    from metrics_text import value

    clock = ManualClock()
    registry = build_registry(make_backend(clock=clock), lambda: [], "t")
    first = scrape(registry)
    clock.advance(10)
    second = scrape(registry)
    for name in ("spx_gpu_energy_joules_total", "spx_gpu_nvlink_transmit_bytes_total", "spx_gpu_nvlink_receive_bytes_total"):
        labels = {"gpu": "0", "link": "0"} if "nvlink" in name else {"gpu": "0"}
        assert value(second, name, **labels) > value(first, name, **labels)
    # A down link's counters do not move.
    assert value(second, "spx_gpu_nvlink_up", gpu="3", link="7") == 0
    assert value(second, "spx_gpu_nvlink_transmit_bytes_total", gpu="3", link="7") == value(
        first, "spx_gpu_nvlink_transmit_bytes_total", gpu="3", link="7")


def test_each_scrape_feeds_the_gpus_recent_readings_at_no_extra_call(make_backend):
    """The incidents' minute before a failure (gpu/recent.py) is the collector's own reads, kept:
    the call count above is the same with it, and each scrape adds one reading per GPU."""
    backend = make_backend()
    calls = calls_of_one_scrape(backend)  # two scrapes
    assert sum(calls.values()) == 8 * len(CALLS_PER_GPU)
    for g in range(8):
        readings = backend.recent.readings(g, 0, float("inf"))
        assert len(readings) == 2 and {"utilization", "power_watts", "sm_clock_hertz"} <= set(readings[-1])
