"""`spx history`: what each job used, as sacct shows it — start, end, elapsed, state, attempts,
GPU-hours and peak memory (state/accounting.py says how each is counted).

    spx history                            # the last 30 days, your jobs (an admin: everyone's)
    spx history --since 7d --state failed  # filters as `spx ls` (--me, --user, --state)
    spx history --attempts                 # a line per attempt under each job
    spx history --json                     # the daemon's records, filtered

Asked of the daemon over the control socket (`accounting`); with no daemon, root reads the store.
"""

from __future__ import annotations

import argparse
import json
import time

from spx.daemon.cli import filters
from spx.daemon.cli.client import EXIT_OK, ask
from spx.daemon.cli.colour import PLAIN, Paint
from spx.daemon.cli.render import table_lines
from spx.daemon.core.config import DaemonConfig

DEFAULT_SINCE = "30d"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--since", type=filters.since_argument, default=DEFAULT_SINCE, metavar="WHEN",
                        help=f"jobs live or ended since WHEN: an age (30m, 12h, 7d, 2w), a date (2024-05-01), "
                             f"a date and time (2024-05-01T09:30) or all (default {DEFAULT_SINCE})")
    filters.add_arguments(parser)
    parser.add_argument("--attempts", action="store_true", help="a line per attempt under each job")
    parser.add_argument("--json", action="store_true", help="the records as JSON (docs/cli.md has their shape)")


def cmd_history(cfg: DaemonConfig, args: argparse.Namespace, paint: Paint = PLAIN) -> int:
    # argparse made even the default Unix seconds
    records = filters.select(ask(cfg, "accounting", arg=repr(args.since)), args)
    if args.json:
        print(json.dumps(records, indent=1))
    else:
        for line in render(records, args.attempts, paint):
            print(line)
    return EXIT_OK


def clock(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


def duration(seconds: float) -> str:
    """Like sacct's Elapsed: [D-]HH:MM:SS."""
    s = int(seconds)
    days, s = divmod(s, 86400)
    text = f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"
    return f"{days}-{text}" if days else text


def memory(n: int | None) -> str:
    """Bytes in binary units, as `free -h` writes them; '-' when not measured."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "K", "M", "G", "T"):
        if value < 1024 or unit == "T":
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    return f"{value:.1f}T"


def render(records: list[dict], per_attempt: bool = False, paint: Paint = PLAIN) -> list[str]:
    rows = [("JOB", "NAME", "STATE", "USER", "START", "END", "ELAPSED", "ATTEMPTS", "GPUS", "GPU-HOURS", "PEAK MEM")]
    for r in records:
        rows.append((str(r["job_id"]), r["name"], r["state"], r["owner"], clock(r["start"]), clock(r["end"]),
                     duration(r["elapsed_seconds"]), str(r["attempts"]), str(r["gpus"]), f"{r['gpu_hours']:.2f}",
                     memory(r["memory_peak_bytes"])))
        for a in r["history"] if per_attempt else ():
            rows.append(("", f"  attempt {a['number']}", a["reason_class"] or ("running" if a["end"] is None else "ok"),
                         "", clock(a["start"]), clock(a["end"]), duration(a["elapsed_seconds"]), "", "",
                         f"{a['gpu_hours']:.2f}", memory(a["memory_peak_bytes"])))
    return [line.rstrip() for line in table_lines(rows, paint)]
