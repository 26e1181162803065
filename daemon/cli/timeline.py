"""`spx status NAME --timeline`: where each attempt's (re)start spent its time.

    spx status NAME --timeline           # a table per attempt
    spx status NAME --timeline --json    # the same rows, for scripts (bench/bench_recovery.py)

Built from the status document (its `history`, each attempt's `phases`; see run/timeline.py for
what each phase means). Attempt N ≥ 2 starts with the failure phases of attempt N−1, and every row
gives its delta from that failure (the first of them recorded: a worker's death, else the launcher's exit) and from the
attempt's spawn; attempt 1's "from failure" column counts from the job's submission instead. The
table's last column draws each phase as a bar on the attempt's own scale (its origin to its last
phase): where it began (the phase before it ended) and how long it took, so the slow phase of a
restart is the long bar.
"""

from __future__ import annotations

import time

from spx.daemon.state.phases import ATTEMPT_PHASES, FAILURE_PHASES


def rows(doc: dict) -> list[dict]:
    """One row per recorded phase: attempt, phase, time, from_origin (failure or submit), from_spawn."""
    out: list[dict] = []
    previous: dict[str, float] = {}
    for attempt in doc.get("history", []):
        phases: dict[str, float] = attempt.get("phases") or {}
        failure = [(p, previous[p]) for p in FAILURE_PHASES if p in previous]
        origin = failure[0][1] if failure else (doc.get("submitted") if attempt["number"] == 1 else None)
        spawn = phases.get("spawn")
        for name, t in [*failure, *[(p, phases[p]) for p in ATTEMPT_PHASES if p in phases]]:
            out.append({"attempt": attempt["number"], "phase": name, "time": t,
                        "from_origin": None if origin is None else round(t - origin, 3),
                        "from_spawn": None if spawn is None or name in FAILURE_PHASES else round(t - spawn, 3)})
        previous = phases
    return out


BAR_WIDTH = 32


def bars(offsets: list[float | None], width: int = BAR_WIDTH) -> list[str]:
    """One bar per phase of an attempt, from the previous phase's offset (0 for the first) to its
    own, on a scale of `width` characters spanning the attempt's last offset; "" where unknown, and
    a thin mark for a phase that took no time at this scale."""
    known = [o for o in offsets if o is not None]
    total = max([*known, 0.0])
    out, previous = [], 0.0
    for offset in offsets:
        if offset is None:
            out.append("")
            continue
        start = round(max(previous, 0.0) / total * width) if total > 0 else 0
        end = round(max(offset, 0.0) / total * width) if total > 0 else 0
        out.append(" " * start + ("█" * (end - start) if end > start else "▏"))
        previous = max(previous, offset)
    return out


def render(doc: dict) -> str:
    """The rows as a table per attempt, with the origin each attempt's first column counts from, and
    its bars."""
    lines: list[str] = []
    current = None
    history = {a["number"]: a for a in doc.get("history", [])}
    table = rows(doc)
    drawn: list[str] = []
    for number in dict.fromkeys(r["attempt"] for r in table):
        drawn += bars([r["from_origin"] for r in table if r["attempt"] == number])
    for r, bar in zip(table, drawn, strict=True):
        if r["attempt"] != current:
            current = r["attempt"]
            origin = "the job's submission" if current == 1 else f"attempt {current - 1}'s failure"
            reason = history.get(current - 1, {}).get("reason") if current > 1 else None
            if lines:
                lines.append("")
            lines += [f"attempt {current}  (from {origin}{f': {reason}' if reason else ''})",
                      f"  {'phase':<18} {'time (UTC)':<14} {'from failure':>12} {'from spawn':>11}"]
        lines.append(f"  {r['phase']:<18} {_clock(r['time']):<14} {_delta(r['from_origin']):>12} "
                     f"{_delta(r['from_spawn']):>11}  {bar}".rstrip())
    if not lines:
        return f"{doc.get('name', 'job')}: no phases recorded yet (they come with its attempts' starts)"
    return "\n".join(lines)


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(t)) + f".{int((t % 1) * 1000):03d}"


def _delta(v: float | None) -> str:
    return "" if v is None else f"{v:+.2f} s"
