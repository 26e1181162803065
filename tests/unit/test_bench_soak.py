"""The soak's arithmetic (bench/bench_soak.py) without a daemon: the loop's p99 from two readings of
`spx_daemon_loop_turn_seconds`, the slope pooled within daemon lives (a restart's lower level is not
a trend), and soak.svg drawn from a recorded result (bench/figures.py)."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import figures  # noqa: E402
from bench_soak import histogram_quantile, pooled_slope, turn_buckets  # noqa: E402

NS = "{http://www.w3.org/2000/svg}"
SCRAPE = """# HELP spx_daemon_loop_turn_seconds ...
# TYPE spx_daemon_loop_turn_seconds histogram
spx_daemon_loop_turn_seconds_bucket{le="0.001"} %d
spx_daemon_loop_turn_seconds_bucket{le="0.01"} %d
spx_daemon_loop_turn_seconds_bucket{le="0.1"} %d
spx_daemon_loop_turn_seconds_bucket{le="+Inf"} %d
spx_daemon_loop_turn_seconds_count %d
"""


def reading(*cumulative: int) -> list[tuple[float, float]]:
    return turn_buckets(SCRAPE % (*cumulative, cumulative[-1]))


def test_the_p99_is_of_the_turns_between_two_readings_interpolated_in_its_bucket():
    before = reading(1000, 1000, 1000, 1000)  # a thousand quick turns before the window: not in it
    after = reading(1000 + 90, 1000 + 99, 1000 + 100, 1000 + 100)
    # 100 turns in the window: 90 under 1 ms, 9 in (1, 10] ms, 1 in (10, 100] ms; the 99th is the
    # last of the second bucket.
    assert histogram_quantile(0.99, before, after) == pytest.approx(0.01)
    assert histogram_quantile(0.5, before, after) == pytest.approx(0.001 * 50 / 90)
    assert histogram_quantile(0.99, after, after) is None  # no turn in the window
    assert histogram_quantile(0.99, after, reading(5, 5, 5, 5)) is None  # a new daemon: counts went back


def test_a_turn_past_the_last_bound_reads_as_that_bound():
    assert histogram_quantile(0.99, reading(0, 0, 0, 0), reading(0, 0, 0, 10)) == pytest.approx(0.1)


def test_the_slope_is_pooled_within_daemon_lives():
    # Two lives, each flat, the second at a lower level (a restarted daemon): no growth.
    flat = [(0, t, 60.0) for t in range(10)] + [(1, t, 55.0) for t in range(10, 20)]
    assert pooled_slope(flat) == 0
    # Each life grows 0.5 per unit; one outlier does not tilt the fit.
    growing = [(0, t, 50 + 0.5 * t) for t in range(10)] + [(1, t, 40 + 0.5 * t) for t in range(10, 20)]
    growing[4] = (0, 4, 500.0)
    assert pooled_slope(growing) == pytest.approx(0.5)
    assert pooled_slope([(0, 1, 5.0)]) == 0  # one sample: nothing to fit


def test_soak_figure_draws_each_life_and_marks_each_disruption(tmp_path):
    samples = [{"case": "sample", "t": 60.0 * i, "segment": int(i >= 3), "rss_mib": 60 + i % 3, "fds": 20,
                "threads": 12, "loop_p99_ms": None if i in (0, 3) else 40.0, "scrape_ms": 30.0} for i in range(8)]
    result = {"when": "now", "rows": [*samples, {"case": "disruption", "t": 170.0, "what": "adopt", "seconds": 1.2},
                                      {"case": "figures", "minutes": 8, "jobs": 100, "segments": 2, "warmup_seconds": 60,
                                       "rss_mib_per_hour": 0.5, "fds_range": 0, "threads_range": 0}]}
    root = ET.fromstring(figures.soak_figure(result))
    rss = root.findall(f".//{NS}polyline[@class='series rss_mib']")
    assert len(rss) == 2 and rss[0].get("data-label") == "RSS MiB (slope 0.5 MiB/h)"
    assert root.findall(f".//{NS}g[@class='legend']")[0].findall(f"{NS}text")[1].text == "RSS MiB (slope 0.5 MiB/h)"
    assert len(root.findall(f".//{NS}g[@class='marker disruption']")) == 3  # one per panel
    (tmp_path / "soak.json").write_text(json.dumps(result))
    assert tmp_path / "soak.svg" in figures.draw_all(tmp_path)
