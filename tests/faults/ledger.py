"""Jobs that count their own runs, and the audit that compares those counts with the state store.

A scenario submits `CountedJob`s (tests/faults/scripts/counted.py appends a line to the job's ledger
file at every start and end), breaks the daemon in some way, lets it recover, and calls `audit`:

- lost: a job that was submitted but the store does not know (or, at the end, never settled);
- run twice: an attempt that started twice, two runs of one job alive at once, a run the store has
  no attempt for, or a job that started again after it had succeeded (unless the daemon's stop
  signal reached that run as it ended: then nothing could tell it from a stopped one);
- problems: anything else that is wrong (a job in the wrong final state, a daemon restart counted
  as a crash against max_restarts, a crash counted twice, a GPU given to two runs alive at once).
"""

from __future__ import annotations

import json
import sqlite3
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from spx.daemon.state.store import Store

SCRIPT = Path(__file__).resolve().parent / "scripts" / "counted.py"
PY = sys.executable


@dataclass(frozen=True)
class CountedJob:
    """`expect`: the final state the job must reach by itself ("succeeded", "failed"), or "cancelled"
    for jobs the scenario cancels (long runners, queued ones, ones in backoff)."""

    name: str
    ledger: Path
    seconds: float = 0.5
    exit_code: int = 0
    expect: str = "succeeded"
    max_restarts: int = 3
    backoff: tuple[float, float] = (1, 2)
    gpus: int = 0
    flood: bool = False
    fail_first_run: bool = False
    script: Path = SCRIPT
    python: str = PY

    def yaml(self) -> str:
        args = [str(self.ledger), str(self.seconds), str(self.exit_code)]
        args += ["--flood"] * self.flood + ["--fail-first-run"] * self.fail_first_run
        return (f"name: {self.name}\nlauncher: python\nscript: {self.script}\npython: {self.python}\n"
                f"args: {json.dumps(args)}\ngpus: {self.gpus}\n"
                f"restart: {{max_restarts: {self.max_restarts}, backoff_seconds: [{self.backoff[0]}, {self.backoff[1]}]}}\n"
                "stop: {grace_seconds: 2}\n")

    def runs(self) -> list[dict]:
        try:
            return [json.loads(ln) for ln in self.ledger.read_text().splitlines() if ln.strip()]
        except FileNotFoundError:
            return []


def state_of(root: Path, name: str) -> str | None:
    """The state of the newest job called `name`, read straight from the store (cheaper than a
    `spx` process per poll, which on two cores slows the daemon under test)."""
    path = root / "state" / "spx.sqlite"
    if not path.exists():
        return None
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
        try:
            row = db.execute("SELECT state FROM jobs WHERE name = ? ORDER BY id DESC LIMIT 1", (name,)).fetchone()
        finally:
            db.close()
    except sqlite3.Error:
        return None
    return row[0] if row else None


@dataclass
class Audit:
    lost: list[str] = field(default_factory=list)
    twice: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not (self.lost or self.twice or self.problems)

    def __str__(self) -> str:
        return f"lost: {self.lost}; run twice: {self.twice}; problems: {self.problems}"


def audit(store_path: Path, jobs: list[CountedJob], final: bool = True) -> Audit:
    """Compare each job's ledger with the store. `final`: every job must have reached its `expect`."""
    result = Audit()
    store = Store(store_path, readonly=True)
    try:
        for job in jobs:
            _audit_job(store, job, final, result, store_path.parent.parent / "log")
        result.problems += _shared_gpus(store, jobs)
    finally:
        store.close()
    return result


def _shared_gpus(store: Store, jobs: list[CountedJob]) -> list[str]:
    """A GPU that two runs of different jobs held at the same moment (a double allocation). A run
    holds its GPUs from its start line to its end line or, when a signal ended it (no end line), to
    its attempt's end in the store — the daemon frees the GPUs only after that (never ended: still held)."""
    spans: list[tuple[str, int, set[str], float, float]] = []  # (job, attempt, GPUs, from, to)
    for job in jobs:
        row = store.jobs.by_name(job.name)
        ends = {a.attempt_id: a.end for a in store.attempts.for_job(row.id)} if row is not None else {}
        runs = job.runs()
        for r in runs:
            gpus = {g for g in r["gpus"].split(",") if g}
            if r["event"] != "start" or not gpus:
                continue
            end = next((e["time"] for e in runs if e["event"] == "end" and e["attempt_id"] == r["attempt_id"]),
                       ends.get(r["attempt_id"]))
            spans.append((job.name, r["attempt"], gpus, r["time"], float("inf") if end is None else end))
    out = []
    for i, (a, n, gpus_a, from_a, to_a) in enumerate(spans):
        for b, m, gpus_b, from_b, to_b in spans[i + 1:]:
            both = gpus_a & gpus_b
            if both and a != b and from_a < to_b and from_b < to_a:
                out.append(f"GPUs {sorted(both)} held by {a} (attempt {n}) and {b} (attempt {m}) at once")
    return out


def _stopped_as_it_ended(job_log_dir: Path, run: dict) -> bool:
    """The attempt monitor's record says a stop signal reached this run's attempt."""
    try:
        record = json.loads((job_log_dir / f"attempt-{run['attempt']}.exit").read_text())
    except (OSError, ValueError):
        return False
    return record.get("attempt_id") == run["attempt_id"] and record.get("stop_signal") is not None


def _audit_job(store: Store, job: CountedJob, final: bool, result: Audit, log_dir: Path) -> None:
    row = store.jobs.by_name(job.name)
    if row is None:
        result.lost.append(f"{job.name}: submitted, not in the store")
        return
    attempts = store.attempts.for_job(row.id)
    known = {a.attempt_id for a in attempts}
    runs = job.runs()
    starts = [r for r in runs if r["event"] == "start"]
    twice = []
    for attempt_id, n in Counter(r["attempt_id"] for r in starts).items():
        if n > 1:
            twice.append(f"attempt {attempt_id} started {n} times")
    for r in starts:
        if r["concurrent_with"]:
            twice.append(f"attempt {r['attempt']} started while {r['concurrent_with']} still ran")
        if r["attempt_id"] not in known:
            twice.append(f"a run (attempt {r['attempt']}, pid {r['pid']}) the store has no attempt for")
    done = [i for i, r in enumerate(runs) if r["event"] == "end" and r["code"] == 0]
    # A run that finished, then got the daemon's stop signal before its launcher was seen to exit,
    # looks like one the daemon stopped (a job may well exit 0 on SIGTERM): its rerun is by design.
    # Any other start after a finished run is a job run twice.
    done = [i for i in done if not _stopped_as_it_ended(log_dir / job.name, runs[i])]
    if done and any(r["event"] == "start" for r in runs[done[0] + 1:]):
        twice.append("started again after it had succeeded")
    if twice:
        result.twice.append(f"{job.name}: " + "; ".join(twice))
    if not final:
        return
    state = row.state.value
    if state != job.expect:
        result.problems.append(f"{job.name}: {state} ({row.reason}), expected {job.expect}")
    if state == "succeeded" and len(done) != 1:
        result.problems.append(f"{job.name}: succeeded, but ran to the end {len(done)} times")
    crashes = [a for a in attempts if a.reason_class == "crash"]
    crashed_runs = [r for r in runs if r["event"] == "end" and r["code"] != 0]
    if len(crashes) > len(crashed_runs):
        result.problems.append(f"{job.name}: {len(crashes)} attempts recorded as crashes, {len(crashed_runs)} crashed")
    gave_up = state == "failed" and job.exit_code != 0 and "gave up after" in (row.reason or "")
    if gave_up and len(crashes) != job.max_restarts + 1:
        result.problems.append(f"{job.name}: failed after {len(crashes)} crashes with max_restarts "
                               f"{job.max_restarts} (daemon restarts must not count)")
