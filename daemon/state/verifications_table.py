"""Replay verification's tables: `verifications` (each replay's verdict on the job it verified, as a
JSON document: run/verification.py writes it) and `gpu_suspects` (a strike against a GPU each time a
replay found a step it trained computing different numbers).

A strike is the host's memory of the GPU, like its quarantine: it outlives the job, and an operator's
`spx gpu release` clears it. Strikes say who they came from (the job's owner): a replay is the user's
own run, so a user can forge one, and a GPU is quarantined only on strikes from more than one owner.
Bounded: a job keeps its `MAX_PER_JOB` latest verdicts; a GPU its `MAX_STRIKES` latest strikes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from spx.daemon.state.db import Database

MAX_PER_JOB = 50
MAX_STRIKES = 20


@dataclass(frozen=True)
class VerificationRow:
    job_id: int
    replay_job_id: int
    time: float
    verified: bool | None
    doc: dict


@dataclass(frozen=True)
class Strike:
    gpu: int
    owner_uid: int
    job: str
    step: int | None
    time: float
    detail: str


class VerificationsTable:
    """Written on the daemon's main loop only; read from any thread."""

    def __init__(self, db: Database):
        self._db = db

    def add(self, job_id: int, replay_job_id: int, time: float, verified: bool | None, doc: dict,
            strikes: list[Strike]) -> None:
        """The verdict, and the strikes it gives, in one transaction."""
        text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
        with self._db.write("record_verdict") as db:
            db.execute("INSERT INTO verifications (job_id, replay_job_id, time, verified, doc) VALUES (?, ?, ?, ?, ?)",
                       (job_id, replay_job_id, time, None if verified is None else int(verified), text))
            db.execute("DELETE FROM verifications WHERE job_id = ? AND id NOT IN "
                       "(SELECT id FROM verifications WHERE job_id = ? ORDER BY id DESC LIMIT ?)",
                       (job_id, job_id, MAX_PER_JOB))
            for s in strikes:
                db.execute("INSERT INTO gpu_suspects (gpu, owner_uid, job, step, time, detail) VALUES (?, ?, ?, ?, ?, ?)",
                           (s.gpu, s.owner_uid, s.job, s.step, s.time, s.detail))
                db.execute("DELETE FROM gpu_suspects WHERE gpu = ? AND id NOT IN "
                           "(SELECT id FROM gpu_suspects WHERE gpu = ? ORDER BY id DESC LIMIT ?)",
                           (s.gpu, s.gpu, MAX_STRIKES))
            db.execute("INSERT INTO events (job_id, time, kind, detail) VALUES (?, ?, 'verification', ?)",
                       (job_id, time, str(doc.get("text", ""))))

    def for_job(self, job_id: int, limit: int = 5) -> list[VerificationRow]:
        """The job's latest verdicts (as the job verified, or as the replay that gave them), newest first."""
        rows = self._db.conn.execute(
            "SELECT job_id, replay_job_id, time, verified, doc FROM verifications WHERE job_id = ? OR replay_job_id = ? "
            "ORDER BY id DESC LIMIT ?", (job_id, job_id, limit)).fetchall()
        return [VerificationRow(r[0], r[1], r[2], None if r[3] is None else bool(r[3]), json.loads(r[4])) for r in rows]

    def strikes(self) -> dict[int, list[Strike]]:
        """{gpu: its strikes, oldest first} of every suspect GPU."""
        out: dict[int, list[Strike]] = {}
        for r in self._db.conn.execute("SELECT gpu, owner_uid, job, step, time, detail FROM gpu_suspects ORDER BY id"):
            out.setdefault(r[0], []).append(Strike(*r))
        return out

    def clear(self, gpu: int) -> None:
        """An operator released the GPU: its strikes go with its quarantine."""
        with self._db.write(None) as db:
            db.execute("DELETE FROM gpu_suspects WHERE gpu = ?", (gpu,))
