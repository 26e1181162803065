"""The host's own tables, kept across restarts: `gpu_quarantine` (GPUs the health gate found faulty)
and `queue_settings` (the queue's host-wide switches: `spx drain`). Each change is also a host event
(an `events` row with no job).
"""

from __future__ import annotations

from spx.daemon.state.db import Database


class HostTables:
    """Quarantined GPUs and the drain switch: writes on the daemon's main loop only; reads from any
    thread (the exporter reads both)."""

    def __init__(self, db: Database):
        self._db = db

    # --- GPU quarantine -------------------------------------------------------------------------------

    def quarantine_gpu(self, gpu: int, uuid: str | None, reason: str, now: float) -> bool:
        """Record GPU `gpu` as faulty (the first reason is kept). True if it was not quarantined yet."""
        with self._db.write("quarantine_gpu") as db:
            cur = db.execute("INSERT OR IGNORE INTO gpu_quarantine (gpu, uuid, reason, since) VALUES (?, ?, ?, ?)",
                             (gpu, uuid, reason, now))
            if cur.rowcount:
                db.execute("INSERT INTO events (job_id, time, kind, detail) VALUES (NULL, ?, 'gpu-quarantined', ?)",
                           (now, f"GPU {gpu}: {reason}"))
            return bool(cur.rowcount)

    def release_gpu(self, gpu: int, by: str, now: float) -> bool:
        """An operator's release of a quarantined GPU. False if it was not quarantined."""
        with self._db.write("release_gpu") as db:
            cur = db.execute("DELETE FROM gpu_quarantine WHERE gpu = ?", (gpu,))
            if cur.rowcount:
                db.execute("INSERT INTO events (job_id, time, kind, detail) VALUES (NULL, ?, 'gpu-released', ?)",
                           (now, f"GPU {gpu} released by {by}"))
            return bool(cur.rowcount)

    def quarantined_gpus(self) -> dict[int, tuple[str | None, str, float]]:
        """{gpu index: (uuid, reason, since)} of every quarantined GPU."""
        rows = self._db.conn.execute("SELECT gpu, uuid, reason, since FROM gpu_quarantine").fetchall()
        return {int(r[0]): (r[1], str(r[2]), float(r[3])) for r in rows}

    # --- queue switches (spx drain) -------------------------------------------------------------------

    def drained(self) -> str | None:
        """Who drained the host (no new starts), or None."""
        row = self._db.conn.execute("SELECT value FROM queue_settings WHERE key = 'drained'").fetchone()
        return str(row[0]) if row else None

    def set_drained(self, by: str | None, now: float) -> None:
        """Drain (`by` says who) or undrain (None), with an event, in one transaction."""
        with self._db.write("set_drained") as db:
            if by is None:
                db.execute("DELETE FROM queue_settings WHERE key = 'drained'")
            else:
                db.execute("INSERT OR REPLACE INTO queue_settings (key, value, since) VALUES ('drained', ?, ?)",
                           (by, now))
            db.execute("INSERT INTO events (job_id, time, kind, detail) VALUES (NULL, ?, ?, ?)",
                       (now, "drained" if by else "undrained", by))
