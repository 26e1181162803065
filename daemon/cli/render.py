"""What `spx ls` (a table of jobs), `spx status` (one job and its attempts) and `spx gpus` print:
text for a person, from the daemon's JSON answers (`--json` prints those as they are). State words
are painted by `colour.Paint` when it is on (a terminal), after padding, so columns line up.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from spx.daemon.cli.colour import PLAIN, Paint
from spx.daemon.contract import checkpoint_discovery
from spx.daemon.core.causes import NOT_FAILURES
from spx.daemon.state import node_view


def _ago(t: float | None, now: float) -> str:
    if t is None:
        return "-"
    s = max(0, int(now - t))
    return f"{s}s" if s < 120 else f"{s // 60}m" if s < 7200 else f"{s // 3600}h"


def _fmt(v: object) -> str:
    return "-" if v is None or v == [] else ",".join(map(str, v)) if isinstance(v, list) else str(v)


STATE_COLUMN = 2


def table_lines(rows: Sequence[tuple[str, ...]], paint: Paint = PLAIN, state_column: int | None = STATE_COLUMN) -> list[str]:
    """Columns padded to their widest cell (the last one left as it is), the state column painted."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = []
    for n, r in enumerate(rows):
        cells = [c.ljust(w) for c, w in zip(r, widths, strict=False)]
        if n and state_column is not None:
            cells[state_column] = paint.state(cells[state_column], r[state_column])
        lines.append("  ".join(cells) + "  " + r[-1])
    return lines


def print_table(jobs: list[dict], paint: Paint = PLAIN) -> None:
    now = time.time()
    rows = [("NAME", "JOB", "STATE", "USER", "ATTEMPTS", "STEP", "CKPT", "CKPT AGE", "GPUS", "REASON")]
    for j in jobs:
        rows.append((j["name"], str(j.get("job_id", "-")), j["state"], str(j.get("owner") or j.get("owner_uid", "-")),
                     str(j["attempts"]), _fmt(j["step"]), _fmt(j["last_checkpoint_step"]),
                     _ago(j.get("last_checkpoint_time"), now), _fmt(j["gpus"]), j["reason"] or ""))
    for line in table_lines(rows, paint):
        print(line)


def print_status(doc: dict, paint: Paint = PLAIN) -> None:
    print(f"{doc['name']}: {paint.state(doc['state'])}" + (f" ({doc['reason']})" if doc["reason"] else ""))
    print(f"  owner {doc['owner']}  gpus {_fmt(doc['gpus'])}  step {_fmt(doc['step'])}  "
          f"last checkpoint {_last_checkpoint(doc)}  samples/s {_fmt(doc['samples_per_second'])}")
    if doc.get("heartbeat_problem"):
        print(f"  heartbeat unreadable: {doc['heartbeat_problem']}")
    for s in doc.get("stragglers") or []:  # a slow rank and its GPU's evidence (service/stragglers.py)
        print(f"  straggler: {s['text']}")
    for v in (doc.get("verifications") or [])[:3]:  # replays of its checkpoints (run/verification.py)
        where = f"replay {v.get('replay')} on GPUs {_fmt(v.get('replay_gpus'))}"
        print(f"  verify: {paint.check(v.get('text') or '', {True: 'ok', False: 'fail'}.get(v.get('verified'), 'unknown'))} ({where})")
    if doc.get("node"):
        for line in node_view.describe(doc["node"], time.time()):
            print(f"  {line}")
    if doc.get("staging"):
        print(f"  staging: {doc['staging']}")
    if doc.get("standby_memory_bytes") is not None:  # what keeping it costs (state/standby_memory.py)
        workers = doc.get("standby_workers") or 0
        what = f"launcher and {workers} workers" if workers else "launcher"
        knobs = "launch_standby, restart.standby_workers" if workers else "launch_standby"
        print(f"  standby: next attempt's {what} ready, {doc['standby_memory_bytes'] / 2**20:.0f} MiB ({knobs})")
    history = doc.get("history", [])
    failed = [a for a in history if a.get("reason_class") and a["reason_class"] not in NOT_FAILURES]
    if failed:
        # The operator's one line: the latest failure's class and cause.
        last = failed[-1]
        print(f"  last failure (attempt {last['number']}): {last['reason_class']}: {last.get('root_cause') or last['reason']}")
    for a in history:
        start = time.strftime("%H:%M:%S", time.localtime(a["start"])) if a["start"] else "-"
        end = time.strftime("%H:%M:%S", time.localtime(a["end"])) if a["end"] else "running"
        resumed = f"resumed from step {a['resumed_from_step']}" if a["resumed_from_step"] is not None else "fresh start"
        reason = a["reason"] or ""
        cancelled = reason.startswith("cancelled")
        if cancelled and a["end"]:
            # A user's decision, not a failure: who and when, and what it kept (the last attempt's
            # checkpoint is the job's newest one).
            reason += f" at {end}" + (_kept_checkpoint(doc) if a is history[-1] else "")
        cls = a.get("reason_class")
        tag = f" [{cls}]" if cls and not cancelled else ""
        print(f"  attempt {a['number']}: {start} → {end}  {resumed}  {reason}{tag}")
        if a.get("root_cause") and not cancelled:
            print(f"      root cause: {a['root_cause']}")
        for line in checkpoint_discovery.describe(a["checkpoint"]) if a.get("checkpoint") else ():
            print(f"      checkpoint: {line}")


def _last_checkpoint(doc: dict) -> str:
    """The newest checkpoint step the daemon knows of. Without a heartbeat it knows only the ones
    attempts resumed from: said as such, never as the newest."""
    step = doc["last_checkpoint_step"]
    if doc.get("checkpoints_tracked", True):
        return _fmt(step)
    return (f">= {step}" if step is not None else "?") + " (no heartbeat: not tracked)"


def _kept_checkpoint(doc: dict) -> str:
    """What a cancelled job kept, as far as the daemon can tell (see `_last_checkpoint`)."""
    step = doc["last_checkpoint_step"]
    if not doc.get("checkpoints_tracked", True):
        return " (the script sends no heartbeat: its checkpoints are not tracked; a new start resumes from the newest)"
    return f" (checkpoint at step {step})" if step is not None else " (no checkpoint)"


def print_gpus(rows: list[dict]) -> None:
    """Index, name and UUID, the job on it, health, and why it is quarantined (or suspect: replays
    found it computing wrong numbers, `spx verify`)."""
    print(f"{'GPU':<4} {'NAME':<24} {'UUID':<42} {'JOB':<20} {'HEALTH':<12} QUARANTINE")
    for r in rows:
        health = "quarantined" if r.get("quarantine") else "suspect" if r.get("suspect") else r.get("health", "ok")
        why = "; ".join(w for w in (r.get("quarantine"), r.get("suspect") and f"suspect: {r['suspect']}") if w)
        print(f"{r['index']:<4} {r['name'][:24]:<24} {(r.get('uuid') or '-'):<42} {(r.get('job') or '-')[:20]:<20} "
              f"{health:<12} {why}")


def retention_footer(days: float | None) -> str:
    """The last line of `spx ls --all`: how far back the list goes (config `retention:`)."""
    if days is None:
        return "finished jobs are kept forever (retention.finished_jobs_days: null)"
    span = f"{days:g} days" if days >= 1 else f"{days * 86400:g} s"
    return f"finished jobs are kept {span} after they end (retention.finished_jobs_days), then removed"
