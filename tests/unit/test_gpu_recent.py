"""gpu/recent.py: each GPU's recent readings and XIDs, bounded in count and age, cut to a window;
a fake clock, no NVML."""

from __future__ import annotations

import math

from spx.daemon.exporter import gpu_reading
from spx.daemon.gpu import recent as R


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_readings_are_kept_per_gpu_and_cut_to_the_window_asked():
    clock = Clock()
    ring = R.RecentReadings(clock)
    for i in range(10):
        clock.t = 1000.0 + 10 * i
        ring.record(2, {"utilization": i / 10})
        ring.record(3, {"utilization": 1.0})
    got = ring.readings(2, 1030.0, 1060.0)
    assert [r["time"] for r in got] == [1030.0, 1040.0, 1050.0, 1060.0]
    assert [r["utilization"] for r in got] == [0.3, 0.4, 0.5, 0.6]
    assert ring.readings(5, 0, 2000) == []  # a GPU never read
    got[0]["utilization"] = 99.0  # a copy: the ring is not changed through it
    assert ring.readings(2, 1030.0, 1030.0)[0]["utilization"] == 0.3


def test_readings_older_than_the_keep_time_go_and_the_count_is_capped():
    clock = Clock(0.0)
    ring = R.RecentReadings(clock)
    ring.record(0, {"x": 1.0})
    clock.t = R.KEEP_SECONDS + 1
    ring.record(0, {"x": 2.0})
    assert [r["x"] for r in ring.readings(0, -1, 1e9)] == [2.0]
    for i in range(R.MAX_READINGS + 50):
        clock.t = R.KEEP_SECONDS + 2 + i * 0.01
        ring.record(0, {"x": float(i)})
    kept = ring.readings(0, -1, 1e9)
    assert len(kept) == R.MAX_READINGS and kept[-1]["x"] == R.MAX_READINGS + 49


def test_a_reading_keeps_finite_numbers_only_and_at_most_max_fields():
    ring = R.RecentReadings(Clock())
    ring.record(1, {"a": math.nan, "b": math.inf, "c": 3.0, **{f"f{i}": float(i) for i in range(100)}})
    (kept,) = ring.readings(1, 0, 2000)
    assert "a" not in kept and "b" not in kept and kept["c"] == 3.0
    assert len(kept) == R.MAX_FIELDS - 2 + 1  # the two non-finite ones dropped, plus the time


def test_xids_are_kept_with_their_time_bounded():
    clock = Clock(0.0)
    ring = R.RecentReadings(clock)
    for i in range(R.MAX_XIDS + 5):
        clock.t = float(i)
        ring.xid(4, 79 if i == R.MAX_XIDS + 4 else 13)
    events = ring.xids(4, 0, 1e9)
    assert len(events) == R.MAX_XIDS and events[-1] == (R.MAX_XIDS + 4.0, 79)
    assert ring.xids(4, R.MAX_XIDS + 3.5, 1e9) == [(R.MAX_XIDS + 4.0, 79)]


def test_a_scrape_is_summarised_from_the_collectors_samples():
    base = {"gpu": "2", "uuid": "GPU-x"}
    samples = [
        ("spx_gpu_utilization_ratio", base, 0.97), ("spx_gpu_memory_used_bytes", base, 4e10),
        ("spx_gpu_power_watts", base, 650.0), ("spx_gpu_temperature_celsius", base, 71.0),
        ("spx_gpu_sm_clock_hertz", base, 1.98e9), ("spx_gpu_memory_clock_hertz", base, 2.6e9),
        ("spx_gpu_clocks_event_active", {**base, "reason": "sw_power_cap"}, 1.0),
        ("spx_gpu_clocks_event_active", {**base, "reason": "hw_slowdown"}, 0.0),
        ("spx_gpu_ecc_errors_total", {**base, "type": "uncorrected"}, 2.0),
        ("spx_gpu_nvlink_errors_total", {**base, "link": "0", "type": "replay"}, 3.0),
        ("spx_gpu_nvlink_errors_total", {**base, "link": "1", "type": "replay"}, 4.0),
        ("spx_gpu_process_memory_used_bytes", {**base, "pid": "12"}, 1e9),  # not kept
    ]
    assert gpu_reading.summary(samples) == {
        "up": 1.0, "utilization": 0.97, "memory_used_bytes": 4e10, "power_watts": 650.0,
        "temperature_celsius": 71.0, "sm_clock_hertz": 1.98e9, "memory_clock_hertz": 2.6e9,
        "throttle_sw_power_cap": 1.0, "ecc_uncorrected": 2.0, "nvlink_replay_errors": 7.0}
