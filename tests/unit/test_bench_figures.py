"""`make bench`'s figures (bench/figures.py), drawn from recorded results: the goodput figure's lines
(recorded heartbeat samples, or the kill log's reconstruction), one × per kill that hit, the recovery
phases as stacked bars whose tops are the recorded medians; the same results give the same bytes."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import figures  # noqa: E402

NS = "{http://www.w3.org/2000/svg}"


def goodput_result(with_steps: bool) -> dict:
    def row(launcher, disturbance, kills, wall):
        r = {"launcher": launcher, "disturbance": disturbance, "wall_s": wall, "goodput": 0.9, "steps_useful": 300,
             "kill_log": kills}
        if with_steps:
            r["steps"] = [[0.0, 0], [10.0, 140], [10.5, 100], [30.0, 300]]
        return r
    kills = [{"t": 10.0, "rank": 0, "pid": 1, "step": 140, "hit": True},
             {"t": 20.0, "rank": 1, "pid": None, "step": 150, "hit": False}]
    return {"when": "now", "rows": [
        row("spx", "undisturbed", [], 28.0), row("torchrun", "undisturbed", [], 27.0),
        row("spx", "kill -9 every 10 s", kills, 30.0), row("torchrun", "kill -9 every 10 s", kills[:1], 31.0),
        row("spx", "SIGTERM (spot reclaim) at 15 s", [{"t": 15.0, "signal": "SIGTERM", "step": 155, "hit": True}], 29.0),
    ]}


def test_the_goodput_series_is_the_recorded_samples_or_the_kill_logs_reconstruction():
    result = goodput_result(with_steps=False)
    points, measured = figures.goodput_series(result["rows"][2])
    assert not measured and points == [(0, 0), (10, 140), (10, 100), (30, 300)]  # kill -9: back to step 100
    points, _ = figures.goodput_series(result["rows"][4])
    assert points == [(0, 0), (15, 155), (15, 155), (29, 300)]  # SIGTERM: its checkpoint is the kill's step
    assert figures.goodput_series(goodput_result(with_steps=True)["rows"][2]) == (
        [(0, 0), (10, 140), (10.5, 100), (30, 300)], True)


@pytest.mark.parametrize("with_steps", [True, False])
def test_the_goodput_figure_has_a_line_per_launcher_and_a_marker_per_kill_that_hit(with_steps):
    text = figures.goodput_figure(goodput_result(with_steps))
    root = ET.fromstring(text)
    lines = [e.get("class") for e in root.iter(f"{NS}polyline")]
    assert lines == ["series step spx", "series step torchrun", "series step spx"]  # 2 disturbed panels
    kills = [g for g in root.iter(f"{NS}g") if g.get("class") == "marker kill"]
    assert len(kills) == 3  # 1 + 1 in the kill -9 panel (the miss draws none), 1 SIGTERM
    assert ("reconstructed from the kill log" in text) is not with_steps
    assert figures.goodput_figure(goodput_result(with_steps)) == text


def test_recovery_bars_stack_each_phase_on_the_one_before():
    result = {"when": "now", "rows": [
        {"case": "spx relaunch (kill → first step)", "median_s": 2.6},
        {"case": "  spx relaunch phase launcher_exit (from the kill)", "median_s": 0.6},
        {"case": "  spx relaunch phase gpus_free (from the kill)", "median_s": 0.7},
        {"case": "  spx relaunch phase first_step (from the kill)", "median_s": 2.6},
        {"case": "  spx cold phase spawn (from submit)", "median_s": 0.1},
        {"case": "  spx cold phase first_step (from submit)", "median_s": 2.8},
    ]}
    categories, stacks = figures.recovery_bars(result)
    assert categories == ["spx cold start", "spx relaunch after a kill"]
    assert [name for name, _ in stacks] == ["launcher_exit", "placed", "spawn", "first_step"]
    tops = [sum(values[i] for _, values in stacks) for i in range(2)]
    assert tops == pytest.approx([2.8, 2.6])
    root = ET.fromstring(figures.recovery_figure(result))
    assert len([r for r in root.iter(f"{NS}rect") if r.get("class") == "bar"]) == 2 * 4


def test_the_goodput_bench_records_its_step_samples_for_the_figure():
    import bench_goodput as g

    samples = [(100.0 + t, step, "running") for t, step in enumerate([0, 5, 10, 15, 3, 8, 12, 20])]
    assert g.StepLog(samples).series(100.0, most=4) == [[0, 0], [2, 10], [3, 15], [4, 3], [6, 12], [7, 20]]
    assert g.StepLog(samples).series(100.0, most=2) == [[0, 0], [3, 15], [4, 3], [7, 20]]  # the drop kept
    assert g.StepLog().series(0.0) == []


def test_draw_all_writes_the_figures_of_the_results_there(tmp_path):
    (tmp_path / "goodput.json").write_text(json.dumps(goodput_result(with_steps=True)))
    assert figures.draw_all(tmp_path) == [tmp_path / "goodput.svg"]
    ET.fromstring((tmp_path / "goodput.svg").read_text())
