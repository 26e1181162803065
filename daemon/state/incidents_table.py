"""The `incidents` table: one row per failed attempt of a job — what broke, on which GPUs, what the
kernel and the GPUs said, the stacks of a hang (run/incidents.py assembles it) — as one JSON
document, kept with the job and removed with it (a trigger on `jobs`: schema.py).

Bounded: a document is at most `MAX_DOC_BYTES` (its assembler fits it; a larger one is refused
here, never stored cut mid-JSON), and a job keeps its `MAX_PER_JOB` latest incidents (a crash
loop of thousands of attempts keeps the last ones).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from spx.daemon.state.db import Database

MAX_DOC_BYTES = 256 * 1024
MAX_PER_JOB = 50


class IncidentTooLarge(ValueError):
    pass


@dataclass(frozen=True)
class IncidentRow:
    job_id: int
    attempt: int
    time: float
    reason_class: str | None
    doc: dict


class IncidentsTable:
    """Incidents: written on the daemon's main loop only; read from any thread."""

    def __init__(self, db: Database):
        self._db = db

    def add(self, job_id: int, attempt: int, time: float, reason_class: str | None, doc: dict) -> None:
        """The incident of the job's attempt `attempt` (a second one for the same attempt replaces
        it); the job's oldest beyond MAX_PER_JOB go. Not a fault point: when it is written depends
        on when its off-loop reads finish, and nothing is decided on it."""
        text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
        if len(text.encode()) > MAX_DOC_BYTES:
            raise IncidentTooLarge(f"incident of {len(text.encode())} bytes (at most {MAX_DOC_BYTES})")
        with self._db.write(None) as db:
            db.execute("INSERT OR REPLACE INTO incidents (job_id, attempt, time, reason_class, doc) VALUES (?, ?, ?, ?, ?)",
                       (job_id, attempt, time, reason_class, text))
            db.execute("DELETE FROM incidents WHERE job_id = ? AND id NOT IN "
                       "(SELECT id FROM incidents WHERE job_id = ? ORDER BY attempt DESC LIMIT ?)",
                       (job_id, job_id, MAX_PER_JOB))

    def get(self, job_id: int, attempt: int) -> IncidentRow | None:
        """The incident of the job's attempt `attempt`, if one was recorded."""
        r = self._db.conn.execute("SELECT job_id, attempt, time, reason_class, doc FROM incidents WHERE job_id = ? "
                                  "AND attempt = ?", (job_id, attempt)).fetchone()
        return None if r is None else IncidentRow(r[0], r[1], r[2], r[3], json.loads(r[4]))

    def job_ids(self) -> list[int]:
        """The jobs that have incidents."""
        return [r[0] for r in self._db.conn.execute("SELECT DISTINCT job_id FROM incidents ORDER BY job_id")]

    def for_jobs(self, job_ids: list[int]) -> list[IncidentRow]:
        """The incidents of these jobs, by job then attempt."""
        out: list[IncidentRow] = []
        for chunk in (job_ids[i:i + 500] for i in range(0, len(job_ids), 500)):  # SQLite's bound-variable limit
            rows = self._db.conn.execute(
                f"SELECT job_id, attempt, time, reason_class, doc FROM incidents WHERE job_id IN "
                f"({','.join('?' * len(chunk))}) ORDER BY job_id, attempt", chunk).fetchall()
            out.extend(IncidentRow(r[0], r[1], r[2], r[3], json.loads(r[4])) for r in rows)
        return out
