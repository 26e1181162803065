"""`spx report NAME [-o FILE.svg] [--json]`: where a job's time went, for a failure review.

    spx report train                 # the account as a table, goodput, one line per failure; train-report.svg
    spx report train -o fig.svg      # the picture there (`-o -`: to stdout, the table then goes to stderr)
    spx report train --json          # the same, for scripts (the picture is still written)

Everything comes from the job's status document (one `status` request: its attempts, phases,
resume steps, and the daemon's goodput `ledger` where it keeps one); job_story reads it and
report_chart draws it. The picture is written as the caller, wherever the caller may write.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

from spx.daemon.cli.job_story import Account, Story, account, story
from spx.daemon.cli.report_chart import SHOWN_SECONDS, draw


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", help="the job's name")
    p.add_argument("-o", "--output", metavar="FILE.svg",
                   help="where to write the picture (default: NAME-report.svg here; -: stdout)")
    p.add_argument("--json", action="store_true",
                   help="print the account, failures, step line and recoveries as JSON (docs/cli.md)")


def default_output(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) + "-report.svg"


def duration(seconds: float) -> str:
    seconds = round(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def table(doc: dict, acc: Account, st: Story) -> str:
    gpus = len(doc.get("gpus") or [])
    head = f"{doc.get('name')}  (job {doc.get('job_id')}, {doc.get('state')}, {doc.get('attempts')} attempt(s))"
    goodput = "—" if acc.goodput is None else f"{acc.goodput:.1%}"
    source = ("the daemon's ledger" if acc.source == "ledger"
              else "estimated from the attempts' phases: this daemon keeps no ledger")
    lines = [head, f"wall {duration(acc.wall)}   goodput {goodput}   ({source})", ""]
    with_gpu = acc.gpu_seconds is not None
    lines.append(f"  {'cause':<18} {'seconds':>10} {'share':>7}" + (f" {'GPU-seconds':>12}" if with_gpu else ""))
    spent = {cause: seconds for cause, seconds in acc.seconds.items() if seconds >= SHOWN_SECONDS}
    for cause, seconds in sorted(spent.items(), key=lambda cs: (-cs[1], cs[0])):
        share = f"{seconds / acc.wall:.1%}" if acc.wall > 0 else "—"
        gpu = f" {(acc.gpu_seconds or {}).get(cause, 0.0):>12.1f}" if with_gpu else ""
        lines.append(f"  {cause:<18} {seconds:>10.1f} {share:>7}{gpu}")
    if not spent:
        lines.append("  (nothing recorded yet)")
    if gpus and not with_gpu:
        lines.append(f"  GPU-seconds: seconds × {gpus} GPU(s)")
    lines += ["", f"failures: {len(st.failures)}"]
    for f in st.failures:
        when = time.strftime("%H:%M:%S", time.gmtime(f.time))
        step = "" if f.step is None else f"  step {f.step:.0f}"
        cause = f" — {f.root_cause}" if f.root_cause else ""
        lines.append(f"  attempt {f.attempt}  {when}{step}  {f.reason_class}: {f.reason}{cause}")
    for start, end in st.recoveries:
        lines.append(f"  recovered in {end - start:.1f} s (failure → next first step)")
    return "\n".join(lines)


def as_json(doc: dict, acc: Account, st: Story, output: str | None) -> dict:
    return {
        "name": doc.get("name"), "job_id": doc.get("job_id"), "state": doc.get("state"),
        "account": {"source": acc.source, "wall_seconds": round(acc.wall, 3),
                    "goodput": None if acc.goodput is None else round(acc.goodput, 4),
                    "seconds": {k: round(v, 3) for k, v in sorted(acc.seconds.items())},
                    "gpu_seconds": acc.gpu_seconds},
        "failures": [{"attempt": f.attempt, "time": f.time, "step": f.step, "reason": f.reason,
                      "reason_class": f.reason_class, "root_cause": f.root_cause} for f in st.failures],
        "steps": [[round(t, 3), s] for t, s in st.steps],
        "recoveries": [[round(a, 3), round(b, 3)] for a, b in st.recoveries],
        "svg": output,
    }


def run_report(doc: dict, args: argparse.Namespace, now: float) -> int:
    """Write the picture, print the table (or JSON). Exit 0; an unwritable -o is an OSError here."""
    st, acc = story(doc, now), account(doc, now)
    picture = draw(str(doc.get("name")), st, acc)
    output = args.output or default_output(str(doc.get("name")))
    out = sys.stderr if output == "-" else sys.stdout
    if output == "-":
        sys.stdout.write(picture)
    else:
        Path(output).write_text(picture)
    if args.json:
        print(json.dumps(as_json(doc, acc, st, None if output == "-" else output), indent=1), file=out)
    else:
        print(table(doc, acc, st), file=out)
        if output != "-":
            print(f"\npicture: {output}", file=out)
    return 0
