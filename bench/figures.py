"""The figures of `make bench`, drawn from the results the benchmarks recorded (bench/results/*.json)
into bench/results/*.svg, so they can be redrawn without rerunning anything:

    .venv/bin/python bench/figures.py [--results DIR]      # run_all.py draws them after each run too

- goodput.svg: training step over wall time, spx against bare torchrun, one panel per disturbance,
  each kill an ×. From each row's `steps` (rank 0's heartbeat samples, [seconds, step]); a result
  recorded before the bench kept them is reconstructed from its kill log — the step at each kill,
  the drop to the checkpoint it resumes from (the last multiple of bench_goodput.CHECKPOINT_EVERY
  for a kill -9, the kill's own step after a SIGTERM's checkpoint), the end at the wall time — and
  the panel says so.
- recovery.svg: where a (re)start's time goes, as stacked bars of its phases (`spx status
  --timeline`'s names), for bare torchrun's and spx's cold start and spx's relaunch after a kill,
  with a standby launcher and with standby workers too.
- checkpoint_stall.svg: the training loop's stall in a synchronous torch.save against spx's
  asynchronous save, and the background write's length.
- scale.svg: the daemon's latencies (loop turn p99, spx ls / status over the socket and /metrics,
  p99) against finished jobs in the store and against queued jobs, both axes log10, each line's
  log-log slope in its legend (0 flat, 1 linear).
- soak.svg: the daemon's samples over the soak (bench_soak.py): RSS, descriptors and threads, loop
  turn p99 and the /metrics scrape, against minutes since the start; each restart (adopt) or reload
  a marker, each daemon life's warm-up (not fitted) shaded, earlier lives dashed, the fitted slopes
  and ranges in the legends.

Drawn with the daemon's own stdlib SVG writer (spx.daemon.cli.plot / svg): no plotting library.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_goodput import CHECKPOINT_EVERY  # noqa: E402
from benchlib import RESULTS  # noqa: E402

from spx.daemon.cli.plot import PALETTE, Box, Plot, bars, nice_top  # noqa: E402
from spx.daemon.cli.svg import Svg  # noqa: E402
from spx.daemon.state.phases import ALL_PHASES  # noqa: E402

LAUNCHER_COLOURS = {"spx": PALETTE[0], "torchrun": PALETTE[1], "spx-standby-workers": PALETTE[2]}
PHASE_ROW = re.compile(r"^\s+(?P<group>.+?) phase (?P<phase>\S+) \(from (?P<origin>.+)\)$")
# The recovery bench's groups of phase rows, and the bar each becomes.
RECOVERY_GROUPS = {"bare torchrun cold": "torchrun cold start", "spx cold": "spx cold start",
                   "spx relaunch": "spx relaunch after a kill",
                   "standby workers relaunch": "spx relaunch, standby workers"}
RENAMED_PHASES = {"gpus_free": "placed"}


def goodput_series(row: dict[str, Any], checkpoint_every: int = CHECKPOINT_EVERY) -> tuple[list[tuple[float, float]], bool]:
    """(points, measured): the row's recorded heartbeat samples, else its reconstruction from the kill log."""
    if row.get("steps"):
        return [(float(t), float(s)) for t, s in row["steps"]], True
    points = [(0.0, 0.0)]
    for kill in row.get("kill_log") or []:
        if not kill.get("hit"):
            continue
        step = float(kill["step"])
        resumed = step if kill.get("signal") == "SIGTERM" else float(int(step) // checkpoint_every * checkpoint_every)
        points += [(float(kill["t"]), step), (float(kill["t"]), resumed)]
    points.append((float(row["wall_s"]), float(row.get("steps_useful") or points[-1][1])))
    return points, False


def goodput_figure(result: dict[str, Any]) -> str:
    # One panel per disturbance and kill schedule (the runs at the shortest T may have several seeds).
    disturbed = [d for d in dict.fromkeys((r["disturbance"], r.get("seed")) for r in result["rows"])
                 if d[0] != "undisturbed"]
    panel_h, top = 300.0, 40.0
    svg = Svg(880, top + panel_h * max(len(disturbed), 1) + 10,
              title="goodput: training step over wall time, spx vs bare torchrun, under kills")
    svg.text(80, 24, f"goodput bench ({result.get('when', '')}): training step over wall time, spx vs bare torchrun",
             font_size=14, font_weight="bold", class_="title")
    for i, (disturbance, seed) in enumerate(disturbed):
        rows = [r for r in result["rows"] if r["disturbance"] == disturbance and r.get("seed") == seed]
        series = {r["launcher"]: goodput_series(r) for r in rows}
        x_top = nice_top(max(p[0] for pts, _ in series.values() for p in pts))
        y_top = nice_top(max(p[1] for pts, _ in series.values() for p in pts))
        plot = Plot(svg, Box(80, top + 30 + panel_h * i, 760, panel_h - 90), (0.0, x_top), (0.0, y_top))
        measured = all(m for _, m in series.values())
        note = "" if measured else "  (reconstructed from the kill log)"
        seeded = f", kill seed {seed}" if seed is not None and len({d[1] for d in disturbed if d[0] == disturbance}) > 1 else ""
        plot.axes("seconds since the launch", "step", f"{disturbance}{seeded}{note}")
        for r in rows:
            colour = LAUNCHER_COLOURS.get(r["launcher"], PALETTE[2])
            plot.line(series[r["launcher"]][0], f"{r['launcher']}: goodput {r['goodput']:.3f}, wall {r['wall_s']:.1f} s",
                      f"step {r['launcher']}", colour)
            kills = [k for k in r.get("kill_log") or [] if k.get("hit")]
            plot.markers([(float(k["t"]), float(k["step"])) for k in kills], f"{r['launcher']}: kill", "kill", colour,
                         titles=[f"{k.get('signal', 'SIGKILL')} at {k['t']} s, step {k['step']}" for k in kills])
        plot.legend(x=plot.box.right - 300, y=plot.box.bottom - 16 * len(plot.legend_entries) - 8)
    return svg.render()


def recovery_bars(result: dict[str, Any]) -> tuple[list[str], list[tuple[str, list[float]]]]:
    """(categories, stacks): each group's phases as the time since the phase before (medians)."""
    cumulative: dict[str, dict[str, float]] = {}
    for row in result["rows"]:
        m = PHASE_ROW.match(row["case"])
        if m and m["group"] in RECOVERY_GROUPS and isinstance(row.get("median_s"), (int, float)):
            phase = RENAMED_PHASES.get(m["phase"], m["phase"])
            cumulative.setdefault(RECOVERY_GROUPS[m["group"]], {})[phase] = float(row["median_s"])
    categories = [c for c in RECOVERY_GROUPS.values() if c in cumulative]
    phases = [p for p in ALL_PHASES if any(p in cumulative[c] for c in categories)]
    stacks = [(p, [0.0] * len(categories)) for p in phases]
    for i, c in enumerate(categories):
        before = 0.0
        for p, values in stacks:
            if p in cumulative[c]:
                values[i] = max(cumulative[c][p] - before, 0.0)
                before = max(before, cumulative[c][p])
    return categories, [(p, v) for p, v in stacks if any(x > 0 for x in v)]


def recovery_figure(result: dict[str, Any]) -> str:
    categories, stacks = recovery_bars(result)
    svg = Svg(880, 420, title="recovery: where a (re)start's time goes, by phase")
    plot = bars(svg, Box(80, 50, 520, 320), categories, stacks, "seconds (median)",
                f"recovery bench ({result.get('when', '')}): (re)start phases")
    plot.legend(x=plot.box.right + 20, y=plot.box.top)
    return svg.render()


def checkpoint_figure(result: dict[str, Any]) -> str:
    categories: list[str] = []
    values: list[float] = []
    for row in result["rows"]:
        size = row.get("model_size", "")
        for label, key in (("torch.save (sync) stall", "sync_torch_save_s"), ("spx async stall", "async_stall_s"),
                           ("async background write", "async_background_total_s")):
            if isinstance(row.get(key), (int, float)):
                categories.append(f"{size}: {label}")
                values.append(float(row[key]))
    svg = Svg(880, 400, title="checkpoint stall: synchronous torch.save vs spx's asynchronous save")
    bars(svg, Box(80, 50, 760, 300), categories, [("seconds", values)], "seconds",
         f"checkpoint stall bench ({result.get('when', '')}): the training loop's wait per save")
    return svg.render()


SCALE_SERIES = (("loop_p99_ms", "loop turn p99"), ("ls_p99_ms", "ls p99"), ("status_p99_ms", "status p99"),
                ("metrics_p99_ms", "/metrics p99"))


def scale_figure(result: dict[str, Any]) -> str:
    slopes = next((r for r in result["rows"] if "curve" not in r and "history" in r), {})
    svg = Svg(880, 720, title="scale: the daemon's latencies against finished history and queued jobs")
    svg.text(80, 24, f"scale bench ({result.get('when', '')}): p99 latencies, log10 axes", font_size=14,
             font_weight="bold", class_="title")
    for i, (curve, size, label) in enumerate((("history", "finished", "finished jobs in the store"),
                                              ("queued", "queued", "queued jobs"))):
        rows = sorted((r for r in result["rows"] if r.get("curve") == curve), key=lambda r: r[size])
        if not rows:
            continue
        points = {key: [(math.log10(max(r[size], 1)), math.log10(max(r[key], 1e-3))) for r in rows]
                  for key, _ in SCALE_SERIES}
        xs = [x for pts in points.values() for x, _ in pts]
        ys = [y for pts in points.values() for _, y in pts]
        plot = Plot(svg, Box(80, 60 + 340 * i, 760, 250), (min(xs), max(max(xs), min(xs) + 1)),
                    (min(0.0, min(ys)), math.ceil(max(ys))))
        plot.axes(f"log10 {label}", "log10 ms", f"against {label}")
        for n, (key, name) in enumerate(SCALE_SERIES):
            plot.line(points[key], f"{name} (slope {slopes.get(curve, {}).get(key, float('nan')):.2f})", key, PALETTE[n])
        plot.legend(x=plot.box.right - 240, y=plot.box.top + 8)
    return svg.render()


# Per panel: (sample key, label, the figure of the result's "figures" row said in the legend, how).
SOAK_PANELS = ((("rss_mib", "RSS MiB", "rss_mib_per_hour", "slope {} MiB/h"),),
               (("fds", "open descriptors", "fds_range", "max − min {}"), ("threads", "threads", "threads_range", "max − min {}")),
               (("loop_p99_ms", "loop turn p99 ms", "loop_p99_ms_per_hour", "slope {} ms/h"),
                ("scrape_ms", "/metrics scrape ms", "scrape_ms_per_hour", "slope {} ms/h")))


def soak_figure(result: dict[str, Any]) -> str:
    samples = [r for r in result["rows"] if r.get("case") == "sample"]
    disruptions = [r for r in result["rows"] if r.get("case") == "disruption"]
    figures = next((r for r in result["rows"] if r.get("case") == "figures"), {})
    warmup = float(figures.get("warmup_seconds", 0))
    panel_h = 250.0
    svg = Svg(880, 50 + panel_h * len(SOAK_PANELS), title="soak: the daemon's samples over a run of jobs of every kind")
    svg.text(80, 24, f"soak bench ({result.get('when', '')}): {figures.get('minutes', '?')} min, "
             f"{figures.get('jobs', '?')} jobs, {figures.get('segments', '?')} daemon lives", font_size=14,
             font_weight="bold", class_="title")
    x_top = nice_top(max((s["t"] for s in samples), default=1.0) / 60)
    starts = [0.0] + [float(d["t"]) for d in disruptions]
    for i, panel in enumerate(SOAK_PANELS):
        values = [s[key] for key, *_ in panel for s in samples if s.get(key) is not None]
        plot = Plot(svg, Box(80, 60 + panel_h * i, 500, panel_h - 80), (0.0, x_top), (0.0, nice_top(max(values, default=1.0))))
        plot.axes("minutes since the start", " / ".join(label for _, label, *_ in panel))
        for start in starts:
            plot.span(start / 60, (start + warmup) / 60, "warm-up (not fitted)", "warmup", "#999999")
        for n, (key, label, figure, how) in enumerate(panel):
            by_life: dict[int, list[tuple[float, float]]] = {}
            for s in samples:
                if s.get(key) is not None:
                    by_life.setdefault(s["segment"], []).append((s["t"] / 60, float(s[key])))
            for life, pts in by_life.items():
                plot.line(pts, f"{label} ({how.format(figures.get(figure, '?'))})", key, PALETTE[n],
                          dashed=life != max(by_life))
        top = plot.y_range[1]
        plot.markers([(float(d["t"]) / 60, top) for d in disruptions], "daemon restarted (adopt) / reloaded", "disruption",
                     PALETTE[3], titles=[f"{d['what']} at {d['t']} s ({d['seconds']} s)" for d in disruptions])
        plot.legend_entries = list(dict.fromkeys(plot.legend_entries))  # one entry per series, not per life
        plot.legend(x=plot.box.right + 15, y=plot.box.top)
    return svg.render()


FIGURES = {"goodput": goodput_figure, "recovery": recovery_figure, "checkpoint_stall": checkpoint_figure,
           "scale": scale_figure, "soak": soak_figure}


def draw_all(results: Path = RESULTS) -> list[Path]:
    """Each figure whose result file exists, written next to it; the paths written."""
    written = []
    for name, draw in FIGURES.items():
        source = results / f"{name}.json"
        if source.exists():
            target = results / f"{name}.svg"
            target.write_text(draw(json.loads(source.read_text())))
            written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=RESULTS, help="where the results are (default bench/results)")
    a = ap.parse_args(argv)
    for path in draw_all(a.results):
        print(f"drew {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
