"""The short form of bench/bench_scale.py: real daemons (fake 8-GPU host) over stores seeded through
the store's API, measured in one run, and held to the curve's shape rather than to any machine's
milliseconds: ten times the finished history leaves the loop's turn and `spx ls` flat (each within
3× — before the live jobs' index, a turn read every job ever kept several times: ~6× here), and
ten times the queued jobs costs the loop at most linearly (within 10× × 2 of slack)."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
from bench_scale import point  # noqa: E402


def test_the_daemon_is_flat_in_history_and_at_most_linear_in_queued_jobs(tmp_path):
    small = point(tmp_path, 300, 10, calls=8, idle=4.0)
    history = point(tmp_path, 3000, 10, calls=8, idle=4.0)
    queue = point(tmp_path, 300, 100, calls=8, idle=4.0)
    figures = {"300 finished": small, "3,000 finished": history, "100 queued": queue}
    assert all(r["listed"] == r["queued"] + 1 + min(200, r["finished"]) for r in figures.values()), figures
    assert history["loop_p50_ms"] <= 3 * small["loop_p50_ms"], figures
    assert history["ls_p50_ms"] <= 3 * small["ls_p50_ms"], figures
    assert queue["loop_p50_ms"] <= 20 * small["loop_p50_ms"], figures
