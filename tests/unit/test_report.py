"""`spx report`: the SVG writer (escaping, stable numbers, same bytes for the same data), the story of a
job read from a scripted status document (its step line, failures, recoveries, the account summing to
the wall time), the daemon's ledger and progress records taking over where the document has them, and
the picture parsed back: the step polyline's points, one × per failure, one shaded span per recovery."""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ET

import pytest

from spx.daemon.cli import job_story, report, report_chart
from spx.daemon.cli.parser import build_parser
from spx.daemon.cli.plot import Box, Plot, nice_ticks, nice_top
from spx.daemon.cli.svg import Svg, num

NS = "{http://www.w3.org/2000/svg}"
SUBMITTED = 1000.0


def attempt(number: int, start: float, end: float | None, *, reason_class: str | None = None,
            resumed: int | None = None, max_step: int | None = None, **phases: float) -> dict:
    return {"number": number, "start": start, "end": end, "reason": "exit code 1" if reason_class else None,
            "reason_class": reason_class, "root_cause": "rank 0: RuntimeError: boom" if reason_class else None,
            "resumed_from_step": resumed, "max_step": max_step, "phases": phases}


def crashed_twice(name: str = "train") -> dict:
    """Three attempts: crash at step 29 (resumed from 20), crash at step 45 (resumed from 40), success at 60."""
    return {"name": name, "job_id": 3, "state": "succeeded", "attempts": 3, "step": 60, "gpus": [0, 1],
            "submitted": SUBMITTED, "history": [
                attempt(1, 1001.0, 1032.0, reason_class="user-code", max_step=29, placed=1000.5, spawn=1001.0,
                        first_step=1004.0, first_beat=1004.0, launcher_exit=1031.0, failure_seen=1031.2,
                        group_dead=1031.3, end_recorded=1031.5),
                attempt(2, 1033.0, 1052.0, reason_class="oom", resumed=20, max_step=45, placed=1032.5, spawn=1033.0,
                        first_step=1036.0, launcher_exit=1051.0, failure_seen=1051.2, end_recorded=1051.6),
                attempt(3, 1053.0, 1080.0, resumed=40, max_step=60, placed=1052.0, spawn=1053.0, first_beat=1056.0),
            ]}


def parse(text: str) -> ET.Element:
    return ET.fromstring(text)


def polyline_points(root: ET.Element, cls: str) -> list[tuple[float, float]]:
    [line] = [e for e in root.iter(f"{NS}polyline") if e.get("class") == cls]
    return [tuple(float(v) for v in p.split(",")) for p in line.get("points", "").split()]  # type: ignore[misc]


# --- the SVG writer --------------------------------------------------------------------------------------


def test_numbers_are_short_and_stable():
    assert [num(v) for v in (1.0, 1.5, 2.345, -0.001, 0.0, 1234.5678)] == ["1", "1.5", "2.35", "0", "0", "1234.57"]


def test_text_and_attributes_are_escaped():
    svg = Svg(100, 50, title='a <job> & "quotes"')
    svg.text(1, 2, "</text><script>x</script>", class_='a"b')
    root = parse(svg.render())
    assert root.find(f"{NS}title").text == 'a <job> & "quotes"'
    [text] = root.iter(f"{NS}text")
    assert text.text == "</text><script>x</script>" and text.get("class") == 'a"b'
    assert not list(root.iter(f"{NS}script"))


def test_nice_ticks_are_round_and_cover_the_range():
    assert nice_ticks(0, 70) == [0, 20, 40, 60]
    assert nice_ticks(0, 1) == [0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert nice_top(63) == 80 and nice_top(60) == 60 and nice_top(0) == 1.0


def test_plot_pieces_carry_their_classes():
    svg = Svg(200, 200)
    plot = Plot(svg, Box(10, 10, 100, 100), (0.0, 10.0), (0.0, 10.0))
    plot.span(2, 4, "recovery", "recovery", "#000")
    plot.line([(0, 0), (10, 10)], "step", "step", "#000")
    plot.markers([(5, 5), (6, 6)], "failure", "failure", "#000", titles=["one", "two"])
    plot.legend()
    root = parse(svg.render())
    assert polyline_points(root, "series step") == [(10.0, 110.0), (110.0, 10.0)]
    assert len([g for g in root.iter(f"{NS}g") if g.get("class") == "marker failure"]) == 2
    [span] = [r for r in root.iter(f"{NS}rect") if r.get("class") == "span recovery"]
    assert (span.get("x"), span.get("width")) == ("30", "20")
    legend = [g for g in root.iter(f"{NS}g") if g.get("class") == "legend"]
    assert [t.text for t in legend[0].iter(f"{NS}text")] == ["recovery", "step", "failure"]


# --- the story of a job ----------------------------------------------------------------------------------


def test_the_step_line_drops_at_each_failure_and_waits_through_the_recovery():
    st = job_story.story(crashed_twice(), now=5000.0)
    rel = [(t - SUBMITTED, s) for t, s in st.steps]
    assert rel == [(4, 0), (31, 29), (31, 20), (36, 20), (51, 45), (51, 40), (56, 40), (80, 60)]
    assert [(f.attempt, f.time - SUBMITTED, f.step, f.reason_class) for f in st.failures] == [
        (1, 31.0, 29.0, "user-code"), (2, 51.0, 45.0, "oom")]
    assert [(a - SUBMITTED, b - SUBMITTED) for a, b in st.recoveries] == [(31, 36), (51, 56)]
    assert st.end - st.origin == 80


def test_a_live_job_ends_its_line_at_now_and_its_current_step():
    doc = crashed_twice()
    doc["state"], doc["step"] = "running", 52
    doc["history"][2]["end"] = doc["history"][2]["max_step"] = None
    st = job_story.story(doc, now=1070.0)
    assert st.steps[-1] == (1070.0, 52.0) and st.end == 1070.0


def test_the_estimated_account_sums_to_the_wall_time():
    acc = job_story.account(crashed_twice(), now=5000.0)
    assert acc.source == "estimate" and acc.wall == 80
    assert sum(acc.seconds.values()) == pytest.approx(80, abs=1e-9)
    # attempt 1 trained 27 s from step 0 to 29; attempt 2 resumed from 20: 9 of its 29 steps were lost
    recomputed_1 = 27 * 9 / 29
    recomputed_2 = 15 * 5 / 25  # attempt 2: 15 s from 20 to 45, attempt 3 resumed from 40
    assert acc.seconds["recomputed"] == pytest.approx(recomputed_1 + recomputed_2)
    assert acc.seconds["queued"] == pytest.approx(0.5)
    assert acc.seconds["restart_detect"] == pytest.approx(0.2 + 0.2)
    assert acc.goodput == pytest.approx(acc.seconds["productive"] / 80)


def test_a_script_without_heartbeat_is_running_time_and_draws_no_line():
    doc = {"name": "plain", "state": "succeeded", "submitted": 0.0, "history": [
        attempt(1, 1.0, 11.0, max_step=None, placed=0.5, spawn=1.0)]}
    st, acc = job_story.story(doc, 100.0), job_story.account(doc, 100.0)
    assert st.steps == [] and acc.seconds == {"queued": 0.5, "startup": 0.5, "running": 10.0}


def test_the_daemons_ledger_and_progress_records_take_over_when_present():
    doc = crashed_twice()
    doc["ledger"] = {"wall_seconds": 80.0, "gpus": 2, "goodput": 0.8,
                     "seconds": {"productive": 64.0, "recomputed": 6.0, "restart_detect": 10.0, "hang": 0.0},
                     "gpu_seconds": {"productive": 128.0, "recomputed": 12.0, "restart_detect": 20.0}}
    doc["history"][0]["progress"] = {"first": [1004.5, 1], "last": [1029.0, 29], "saves": [[10, 1012.0], [20, 1020.0]]}
    acc, st = job_story.account(doc, 5000.0), job_story.story(doc, 5000.0)
    assert acc.source == "ledger" and acc.goodput == 0.8 and acc.seconds["recomputed"] == 6.0
    assert st.steps[:5] == [(1004.5, 1.0), (1012.0, 10.0), (1020.0, 20.0), (1029.0, 29.0), (1031.0, 29.0)]
    assert st.saves == [(1012.0, 10.0), (1020.0, 20.0)]
    text = report.table(doc, acc, st)
    assert "the daemon's ledger" in text and "GPU-seconds" in text
    assert "restart_detect" in text and "hang" not in text  # a cause with no time is left out of the table
    root = parse(report_chart.draw("train", st, acc))
    assert len([c for c in root.iter(f"{NS}circle") if c.get("class") == "marker save"]) == 2
    # A live job: the time its ledger has not settled yet is a line of its own.
    doc["ledger"]["unsettled_seconds"] = 5.0
    live = job_story.account(doc, 5000.0)
    assert live.seconds["unsettled"] == 5.0 and live.gpu_seconds["unsettled"] == 10.0
    assert "unsettled" in report.table(doc, live, st)


# --- the picture ---------------------------------------------------------------------------------------------


def test_the_picture_has_the_step_line_one_marker_per_failure_and_the_recoveries_shaded():
    doc = crashed_twice('a <b> & "c"')
    st, acc = job_story.story(doc, 5000.0), job_story.account(doc, 5000.0)
    text = report_chart.draw(doc["name"], st, acc)
    root = parse(text)
    # the chart's geometry: x 0..80 s over 760 px from 80; y 0..nice_top(60)=60 over 330 px up from 380
    expected = [(4, 0), (31, 29), (31, 20), (36, 20), (51, 45), (51, 40), (56, 40), (80, 60)]
    assert polyline_points(root, "series step") == [
        (float(num(80 + t / 80 * 760)), float(num(380 - s / 60 * 330))) for t, s in expected]
    markers = [g for g in root.iter(f"{NS}g") if g.get("class") == "marker failure"]
    assert len(markers) == 2 and [m.find(f"{NS}title").text for m in markers] == [
        "attempt 1: exit code 1", "attempt 2: exit code 1"]
    spans = [r for r in root.iter(f"{NS}rect") if r.get("class") == "span recovery"]
    assert [(float(r.get("x")), float(r.get("width"))) for r in spans] == [
        (float(num(80 + 31 / 80 * 760)), float(num(5 / 80 * 760))), (float(num(80 + 51 / 80 * 760)), float(num(5 / 80 * 760)))]
    titles = [t.text for t in root.iter(f"{NS}text") if t.get("class") == "title"]
    assert titles[0].startswith('a <b> & "c", goodput') and "&lt;b&gt;" in text
    assert {b.get("data-category") for b in root.iter(f"{NS}rect") if b.get("class") == "bar"} == {
        c for c, s in acc.seconds.items() if c != "productive" and s >= report_chart.SHOWN_SECONDS}
    assert report_chart.draw(doc["name"], st, acc) == text  # the same data, the same bytes


def test_spx_report_writes_the_picture_and_prints_json(tmp_path, capsys):
    args = build_parser().parse_args(["report", "train", "-o", str(tmp_path / "x.svg"), "--json"])
    assert isinstance(args, argparse.Namespace) and args.command == "report"
    assert report.run_report(crashed_twice(), args, now=5000.0) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["svg"] == str(tmp_path / "x.svg") and len(out["failures"]) == 2
    assert out["account"]["source"] == "estimate" and len(out["recoveries"]) == 2
    root = parse((tmp_path / "x.svg").read_text())
    assert len(polyline_points(root, "series step")) == len(out["steps"]) == 8


def test_spx_report_table_names_each_failure_on_one_line():
    doc = crashed_twice()
    text = report.table(doc, job_story.account(doc, 5000.0), job_story.story(doc, 5000.0))
    failures = [ln for ln in text.splitlines() if ln.startswith("  attempt ")]
    assert len(failures) == 2 and "step 29  user-code: exit code 1 — rank 0: RuntimeError: boom" in failures[0]
    assert "estimated from the attempts' phases" in text and "recomputed" in text


def test_default_output_is_a_plain_file_name():
    assert report.default_output("a/b c") == "a_b_c-report.svg"
