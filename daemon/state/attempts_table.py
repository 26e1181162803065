"""The `attempts` table: one row per launch of a job, from before its exec (the attempt id finds its
processes after a crash) to its end, with what a restarted daemon needs to adopt or decide on it.

The writes that also move the job (`running`, `finish`) do both in one transaction: a daemon killed
at any instant leaves both written or neither.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass

from spx.daemon.state.db import Database
from spx.daemon.state.jobs_table import JOB_FIELDS, write_transition
from spx.daemon.state.states import JobState


@dataclass(frozen=True)
class AttemptRow:
    id: int
    job_id: int
    number: int
    attempt_id: str
    start: float
    end: float | None
    exit_code: int | None
    signal: int | None
    reason: str | None
    reason_class: str | None
    resumed_from: str | None
    resumed_from_step: int | None
    max_step: int | None
    pgid: int | None
    port: int | None
    root_cause: str | None
    boot_id: str | None = None     # the boot and /proc start time of the pgid leader, to tell it
    start_ticks: int | None = None  # from a later process that reuses the pid
    stop_cause: str | None = None   # why the daemon stops it, stored before the SIGTERM (outlives a restart)
    exited: float | None = None     # when its launcher's exit (exit_code, signal) was seen, before the end
    phases: str | None = None       # JSON {phase: Unix seconds}: where its (re)start spent its time (run/timeline.py)
    checkpoint_discovery: str | None = None  # JSON: the layout found, what was skipped and why (checkpoint_discovery)
    generation: int | None = None   # a job across hosts: the round it joined (run/gang.py)
    memory_peak: int | None = None  # bytes: its cgroup's memory.peak at the end (None: not measured)
    progress: str | None = None     # JSON: what its heartbeats said of its progress (state/attempt_progress.py)
    backoff: float | None = None    # seconds of backoff decided at its end (the goodput ledger's `backoff`)


_COLUMNS = frozenset(AttemptRow.__dataclass_fields__)
# What an attempt's end may write.
_END_FIELDS = frozenset({"end", "exit_code", "signal", "reason", "reason_class", "max_step", "root_cause",
                         "memory_peak", "backoff"})
# Attempt classes that are not the job's own fault: a daemon stop or restart, a lost attempt, a
# peer host's restart, a cancel, a daemon error, a failed launch.
_NOT_THE_JOBS_FAULT = "('daemon-restart', 'lost', 'peer-restart', 'cancelled', 'daemon-error', 'launch')"


def _attempt(row: sqlite3.Row) -> AttemptRow:
    return AttemptRow(**{k: row[k] for k in row.keys() if k in _COLUMNS})  # noqa: SIM118 (sqlite3.Row iterates values)

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def restarts_by_reason(attempts: list[AttemptRow]) -> dict[str, int]:
    """Closed attempts that were followed by a relaunch, counted by failure class: from the job's
    attempts as read (`AttemptsTable.for_job`), so a view costs no statement more per job."""
    numbers = {a.number for a in attempts}
    counts: dict[str, int] = {}
    for a in attempts:
        if a.end is not None and a.number + 1 in numbers:
            counts[a.reason_class or "unknown"] = counts.get(a.reason_class or "unknown", 0) + 1
    return counts


class AttemptsTable:
    """Attempts: writes on the daemon's main loop only; reads from any thread."""

    def __init__(self, db: Database):
        self._db = db

    # --- writes -----------------------------------------------------------------------------------

    def start(self, job_id: int, *, number: int, attempt_id: str, now: float, resumed_from: str | None,
              resumed_from_step: int | None, port: int | None, checkpoint_discovery: str | None = None,
              generation: int | None = None) -> int:
        """The attempt's row, written before its launcher execs. Returns the row id."""
        with self._db.write("start_attempt") as db:
            cur = db.execute(
                "INSERT INTO attempts (job_id, number, attempt_id, start, resumed_from, resumed_from_step, port,"
                " checkpoint_discovery, generation) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (job_id, number, attempt_id, now, resumed_from, resumed_from_step, port, checkpoint_discovery,
                 generation),
            )
            return int(cur.lastrowid or 0)

    def running(self, job_id: int, attempt_row: int, *, pgid: int, boot_id: str | None,
                start_ticks: int | None, reason: str | None, now: float) -> None:
        """The attempt's launcher exec'd: its process group (with what identifies its leader across a
        daemon restart) and the job → running, in one transaction."""
        with self._db.write("attempt_running") as db:
            db.execute("UPDATE attempts SET pgid = ?, boot_id = ?, start_ticks = ? WHERE id = ?",
                       (pgid, boot_id, start_ticks, attempt_row))
            write_transition(db, job_id, JobState.RUNNING, reason, now, {})

    def stopping(self, attempt_row: int, cause: str) -> None:
        """Why the daemon stops the attempt ("cancel", "hang", "daemon-stop", "daemon-restart"), stored
        before the SIGTERM: a daemon restarted before the end still cancels a cancelled attempt and
        never counts one the daemon stopped as the job's own failure."""
        with self._db.write("attempt_stopping") as db:
            db.execute("UPDATE attempts SET stop_cause = ? WHERE id = ?", (cause, attempt_row))

    def exited(self, attempt_row: int, exit_code: int | None, signal: int | None, stop_cause: str | None,
               now: float) -> None:
        """The launcher's exit status (and why the daemon was stopping it, if it was), as soon as it is
        seen: the attempt may still have leftovers to kill and a diagnosis to make, and a daemon
        restarted meanwhile must decide on this status, not lose it."""
        with self._db.write("attempt_exited") as db:
            db.execute("UPDATE attempts SET exit_code = ?, signal = ?, stop_cause = ?, exited = ? WHERE id = ?",
                       (exit_code, signal, stop_cause, now, attempt_row))

    def add_phases(self, attempt_row: int, phases: dict[str, float]) -> None:
        """Merge `phases` into the attempt's timeline (a phase already recorded keeps its time). Not a
        fault point: how many of these a job's life writes depends on when heartbeats land, and
        nothing is decided on them."""
        with self._db.write(None) as db:
            row = db.execute("SELECT phases FROM attempts WHERE id = ?", (attempt_row,)).fetchone()
            if row is None:
                return
            merged = {**phases, **json.loads(row[0] or "{}")}
            db.execute("UPDATE attempts SET phases = ? WHERE id = ?", (json.dumps(merged, sort_keys=True), attempt_row))

    def set_progress(self, attempt_row: int, progress: str) -> None:
        """The attempt's progress record (state/attempt_progress.py), replaced. Not a fault point, as
        `add_phases`: how many a job's life writes depends on its heartbeats, and nothing is decided
        on them (the goodput ledger reads them)."""
        with self._db.write(None) as db:
            db.execute("UPDATE attempts SET progress = ? WHERE id = ?", (progress, attempt_row))

    def finish(self, job_id: int, attempt_row: int | None, new_state: JobState, reason: str | None,
               now: float, attempt_fields: dict[str, object], job_fields: dict[str, object]) -> None:
        """End the attempt row (if any) AND move the job, in ONE transaction: a daemon killed at any
        instant leaves either both written or neither."""
        unknown = (set(attempt_fields) - _END_FIELDS) | (set(job_fields) - JOB_FIELDS)
        if unknown:
            raise ValueError(f"not attempt/job fields: {sorted(unknown)}")
        # An integer SQLite cannot hold (a step from a user's file, were one unchecked) is dropped,
        # not raised: refused, this write would leave the job `running` here while given up in memory.
        attempt_fields = {k: None if type(v) is int and not _INT64_MIN <= v <= _INT64_MAX else v
                          for k, v in attempt_fields.items()}
        with self._db.write("finish_attempt") as db:
            if attempt_row is not None and attempt_fields:
                cols = ", ".join(f"{k} = ?" for k in attempt_fields)
                db.execute(f"UPDATE attempts SET {cols} WHERE id = ?", (*attempt_fields.values(), attempt_row))
            write_transition(db, job_id, new_state, reason, now, job_fields)

    def end(self, attempt_row: int, **fields: object) -> None:
        """End the attempt row alone (the job's state is not moved)."""
        unknown = set(fields) - _END_FIELDS
        if unknown:
            raise ValueError(f"not attempt fields: {sorted(unknown)}")
        with self._db.write("end_attempt") as db:
            cols = ", ".join(f"{k} = ?" for k in fields)
            db.execute(f"UPDATE attempts SET {cols} WHERE id = ?", (*fields.values(), attempt_row))

    # --- reads ------------------------------------------------------------------------------------

    def for_job(self, job_id: int) -> list[AttemptRow]:
        """Every attempt of the job, first to last."""
        rows = self._db.conn.execute("SELECT * FROM attempts WHERE job_id = ? ORDER BY number", (job_id,)).fetchall()
        return [_attempt(r) for r in rows]

    def for_jobs(self, job_ids: list[int]) -> dict[int, list[AttemptRow]]:
        """Every attempt of each of these jobs, first to last (one query, for `spx history`)."""
        found: dict[int, list[AttemptRow]] = {j: [] for j in job_ids}
        for chunk in (job_ids[i:i + 500] for i in range(0, len(job_ids), 500)):  # SQLite's bound-variable limit
            rows = self._db.conn.execute(
                f"SELECT * FROM attempts WHERE job_id IN ({','.join('?' * len(chunk))}) ORDER BY job_id, number",
                chunk).fetchall()
            for r in rows:
                found[r["job_id"]].append(_attempt(r))
        return found

    def open_for(self, job_id: int) -> AttemptRow | None:
        """The job's attempt that has not ended, if any."""
        row = self._db.conn.execute(
            "SELECT * FROM attempts WHERE job_id = ? AND end IS NULL ORDER BY number DESC LIMIT 1", (job_id,)
        ).fetchone()
        return _attempt(row) if row else None

    def fault_count(self, job_id: int) -> int:
        """Closed attempts that ended by the job's own fault — what `restart.max_restarts` counts. A
        daemon stop or restart, a lost attempt, a cancel and a daemon error are not the job's."""
        return sum(self.faults_by_class(job_id).values())

    def faults_by_class(self, job_id: int) -> dict[str, int]:
        """`fault_count` by failure class (the attempts' reason_class): what a class's
        `restart.on_failure` rule counts."""
        rows = self._db.conn.execute(
            "SELECT reason_class, COUNT(*) FROM attempts WHERE job_id = ? AND end IS NOT NULL AND reason_class IS NOT NULL"
            f" AND reason_class NOT IN {_NOT_THE_JOBS_FAULT} GROUP BY reason_class",
            (job_id,),
        ).fetchall()
        return {str(cls): int(n) for cls, n in rows}

