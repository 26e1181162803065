"""The short form of bench/bench_scale.py: real daemons (fake 8-GPU host) over stores seeded through
the store's API, measured in one run, and held to the curve's shape rather than to any machine's
milliseconds: ten times the finished history leaves the loop's turn and `spx ls` flat (each within
3× — before the live jobs' index, a turn read every job ever kept several times: ~6× here), and
ten times the queued jobs costs the loop at most linearly (within 10× × 2 of slack). A curve out of
shape is measured once more before it fails (the points run one after another, beside other tests)."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
from bench_scale import point  # noqa: E402


def measure(tmp: Path) -> dict[str, dict]:
    tmp.mkdir()
    return {"300 finished": point(tmp, 300, 10, calls=8, idle=4.0),
            "3,000 finished": point(tmp, 3000, 10, calls=8, idle=4.0),
            "100 queued": point(tmp, 300, 100, calls=8, idle=4.0)}


def in_shape(figures: dict[str, dict]) -> bool:
    small, history, queue = figures["300 finished"], figures["3,000 finished"], figures["100 queued"]
    return (history["loop_p50_ms"] <= 3 * small["loop_p50_ms"] and history["ls_p50_ms"] <= 3 * small["ls_p50_ms"]
            and queue["loop_p50_ms"] <= 20 * small["loop_p50_ms"])


def test_the_daemon_is_flat_in_history_and_at_most_linear_in_queued_jobs(tmp_path):
    figures = measure(tmp_path / "first")
    if not in_shape(figures):
        # The points are measured one after another, and the other xdist worker's test can load the
        # cores through one of them only (CI once saw `spx ls` at 3,000 finished 4× the 300 one; alone,
        # 0.97×): the curve is measured once more, and that one is held to the bounds.
        print(f"out of shape, measured again: {figures}")
        figures = measure(tmp_path / "again")
    assert all(r["listed"] == r["queued"] + 1 + min(200, r["finished"]) for r in figures.values()), figures
    assert in_shape(figures), figures
