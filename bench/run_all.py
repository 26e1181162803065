"""`make bench`: run every benchmark (bench/bench_*.py), then print one table of their goals.

    .venv/bin/python bench/run_all.py [--only NAME ...] [--quick] [--markdown] [--no-run]

Each benchmark runs as its own process (its printed output streams through) and writes
bench/results/<name>.json with benchlib (`bench_foo.py` → `foo.json`). The table has one line per
goal: bench | goal | value | target | met, under the machine the figures came from; a benchmark
that wrote no result in this run shows as an error line. bench/results/summary.json holds the same
(machine, each bench's exit code, seconds and goals). `--no-run` only renders the results already
there; `--markdown` renders the table as Markdown (docs/benchmarks.md's table is made so).
`--readme docs/benchmarks.md` also puts the Markdown table between that file's bench-table markers.
`--quick` gives each benchmark its short form: `--quick` where the script has one, else QUICK_ARGS.
Then bench/figures.py draws the figures of the results there (bench/results/*.svg: goodput,
recovery, checkpoint stall), with `--no-run` too, so they are redrawn from what was recorded.
Exit status: 1 if a benchmark failed to write its result, else 0 (unmet goals are in the table).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from benchlib import RESULTS, machine  # noqa: E402
from figures import draw_all  # noqa: E402

# Short forms of the benchmarks that have no --quick of their own.
QUICK_ARGS = {
    "checkpoint_stall": ["--repeats", "1"],
    "daemon_restart": ["--restarts", "1", "--steps", "120"],
    "intake": ["--drops", "10"],
    "scrape": ["--scrapes", "10", "--idle-seconds", "5"],
    "trainer_loop": ["--steps", "50", "--rounds", "1"],
}
HEADER = ("bench", "goal", "value", "target", "met")
README_BEGIN = "<!-- bench-table: bench/run_all.py --no-run --readme docs/benchmarks.md -->"
README_END = "<!-- /bench-table -->"


def discover(bench_dir: Path = BENCH) -> dict[str, Path]:
    """{name: script} for every bench_<name>.py, sorted by name."""
    return {p.stem.removeprefix("bench_"): p for p in sorted(bench_dir.glob("bench_*.py"))}


def quick_args(name: str, script: Path) -> list[str]:
    return ["--quick"] if '"--quick"' in script.read_text() else QUICK_ARGS.get(name, [])


def run_one(name: str, script: Path, quick: bool, results: Path) -> dict[str, Any]:
    """Run one benchmark; its entry for the summary (the result read only if written by this run)."""
    path = results / f"{name}.json"
    before = path.stat().st_mtime_ns if path.exists() else None
    args = [sys.executable, str(script), *(quick_args(name, script) if quick else [])]
    print(f"== {name}: {' '.join(args[1:])}", flush=True)
    start = time.monotonic()
    rc = subprocess.run(args, cwd=BENCH.parent, env={**os.environ, "PYTHONUNBUFFERED": "1"}).returncode
    entry: dict[str, Any] = {"bench": name, "exit": rc, "seconds": round(time.monotonic() - start, 1)}
    if path.exists() and path.stat().st_mtime_ns != before:
        entry["result"] = json.loads(path.read_text())
    return entry


def load(name: str, results: Path) -> dict[str, Any]:
    """The entry of a benchmark not run now: its last result file, if any."""
    path = results / f"{name}.json"
    entry: dict[str, Any] = {"bench": name, "exit": None, "seconds": None}
    if path.exists():
        entry["result"] = json.loads(path.read_text())
    return entry


def fmt(value: Any, unit: str = "") -> str:
    if isinstance(value, float):
        text = f"{value:.3f}".rstrip("0").rstrip(".") if abs(value) < 1000 else f"{value:.0f}"
    else:
        text = str(value)
    return f"{text} {unit}".strip()


def table_rows(entries: list[dict[str, Any]]) -> list[tuple[str, str, str, str, str]]:
    rows = []
    for e in entries:
        result = e.get("result")
        if result is None:
            why = "not run" if e["exit"] is None else f"no result (exit {e['exit']})"
            rows.append((e["bench"], why, "–", "–", "error" if e["exit"] is not None else "–"))
            continue
        if not result["goals"]:
            rows.append((e["bench"], "(no goal stated)", "–", "–", "–"))
        for g in result["goals"]:
            rows.append((e["bench"], g["name"], fmt(g["value"], g.get("unit", "")), f"{g['op']} {fmt(g['target'])}",
                         "yes" if g["met"] else "NO"))
    return rows


def machine_line(m: dict[str, Any]) -> str:
    return (f"{m['cpus']} CPUs ({m['cpu']}), {m['memory_gib']} GiB, GPU: {m['gpu']}, Python {m['python']}, "
            f"Linux {m['kernel']}")


def where_measured(entries: list[dict[str, Any]]) -> list[str]:
    """One line per machine the results came from: the machine, when its results were written and
    which benchmarks they are. Results are kept per benchmark, so a table re-rendered with --no-run
    can hold figures written on different machines and days; each line says which are whose."""
    by_machine: dict[str, list[dict[str, Any]]] = {}
    for e in entries:
        if e.get("result"):
            by_machine.setdefault(json.dumps(e["result"]["machine"], sort_keys=True), []).append(e)
    if not by_machine:
        return [f"{machine_line(machine())}; no results"]
    lines = []
    for key, found in sorted(by_machine.items(), key=lambda kv: min(e["result"]["when"] for e in kv[1])):
        whens = sorted(e["result"]["when"] for e in found)
        span = whens[0] if whens[0] == whens[-1] else f"{whens[0]} – {whens[-1]}"
        lines.append(f"{machine_line(json.loads(key))}; measured {span}: {', '.join(e['bench'] for e in found)}")
    return lines


def render(entries: list[dict[str, Any]], markdown: bool) -> str:
    rows = table_rows(entries)
    where = where_measured(entries)
    if markdown:
        lines = [f"| {' | '.join(HEADER)} |", "|" + "---|" * len(HEADER)]
        lines += [f"| {' | '.join(r)} |" for r in rows]
        lines.append("")
        lines += [f"Machine: {w}." for w in where]
        return "\n".join(lines)
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(HEADER)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(HEADER, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines += [f"machine: {w}" for w in where]
    return "\n".join(lines)


def summary(entries: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "machine": machine(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "benches": [{"bench": e["bench"], "exit": e["exit"], "seconds": e["seconds"],
                     "when": e["result"]["when"] if e.get("result") else None,
                     "goals": e["result"]["goals"] if e.get("result") else None} for e in entries],
        "all_met": all(e.get("result") and all(g["met"] for g in e["result"]["goals"]) for e in entries),
    }


def write_summary(entries: list[dict[str, Any]], results: Path) -> Path:
    results.mkdir(parents=True, exist_ok=True)
    path = results / "summary.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(summary(entries), indent=1) + "\n")
    os.replace(tmp, path)
    return path


def update_readme(path: Path, table: str) -> None:
    """Replace what lies between the bench-table markers of the document at `path` with `table`."""
    text = path.read_text()
    head, sep, rest = text.partition(README_BEGIN)
    _, sep2, tail = rest.partition(README_END)
    if not sep or not sep2:
        raise SystemExit(f"{path}: no {README_BEGIN} … {README_END} markers")
    path.write_text(f"{head}{README_BEGIN}\n{table}\n{README_END}{tail}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", metavar="NAME", help="these benchmarks only (bench_NAME.py)")
    ap.add_argument("--quick", action="store_true", help="each benchmark's short form")
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    ap.add_argument("--no-run", action="store_true", help="render the results already in bench/results")
    ap.add_argument("--readme", type=Path, help="also write the Markdown table between the bench-table markers of this file (docs/benchmarks.md)")
    ap.add_argument("--results", type=Path, default=RESULTS, help=argparse.SUPPRESS)
    ap.add_argument("--bench-dir", type=Path, default=BENCH, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    found = discover(a.bench_dir)
    unknown = sorted(set(a.only or []) - set(found))
    if unknown:
        ap.error(f"no such benchmark: {', '.join(unknown)} (have: {', '.join(found)})")
    names = a.only or list(found)
    if a.no_run:
        entries = [load(n, a.results) for n in names]
    else:
        entries = [run_one(n, found[n], a.quick, a.results) for n in names]
        print(f"wrote {write_summary(entries, a.results)}")
    print(render(entries, a.markdown))
    for path in draw_all(a.results):
        print(f"drew {path}")
    if a.readme:
        update_readme(a.readme, render([e for e in entries if e.get("result")], markdown=True))
    return 1 if any(e["exit"] is not None and not e.get("result") for e in entries) else 0


if __name__ == "__main__":
    sys.exit(main())
