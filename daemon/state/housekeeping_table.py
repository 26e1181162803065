"""The daemon's housekeeping reads and deletes: the `events` rows every change leaves, read in order
by the notifier (run/notify.py tells owners of ends and restarts), and the removal of finished jobs' rows once they are older than
the config's retention (run/retention.py decides which and when; this only answers and deletes).

Written on the daemon's main loop only, like every table; a removal is one transaction of bounded
size, and it removes only jobs that are finished, whatever it is asked.
"""

from __future__ import annotations

from dataclasses import dataclass

from spx.daemon.state.db import Database
from spx.daemon.state.states import TERMINAL

# In the order (and spelling) of the `jobs_ended` partial index (schema.py), so SQLite uses it.
ENDED_SQL = "state IN (" + ", ".join(f"'{s.value}'" for s in sorted(TERMINAL, key=lambda s: s.value)) + ")"


@dataclass(frozen=True)
class Event:
    """One `events` row: a job's state change (kind = the new state), or another entry in its history."""

    id: int
    job_id: int | None
    time: float
    kind: str
    detail: str | None


@dataclass(frozen=True)
class Finished:
    """What retention needs of a finished job: where its files are and whose lane removes them."""

    id: int
    name: str
    owner_uid: int
    spec_file: str
    ended: float


class HousekeepingTable:
    def __init__(self, db: Database):
        self._db = db

    # --- events -------------------------------------------------------------------------------------

    def events_after(self, after_id: int, limit: int) -> list[Event]:
        """Up to `limit` events after event `after_id`, in order (the primary key: no scan)."""
        rows = self._db.conn.execute(
            "SELECT id, job_id, time, kind, detail FROM events WHERE id > ? ORDER BY id LIMIT ?", (after_id, limit)
        ).fetchall()
        return [Event(int(r[0]), r[1], float(r[2]), str(r[3]), r[4]) for r in rows]

    def last_event_id(self) -> int:
        return int(self._db.conn.execute("SELECT COALESCE(MAX(id), 0) FROM events").fetchone()[0])

    # --- finished jobs --------------------------------------------------------------------------------

    def expired(self, ended_before: float, limit: int, keep_names: frozenset[str] = frozenset()) -> list[Finished]:
        """Up to `limit` finished jobs that ended before `ended_before`, the oldest first (the
        `jobs_ended` index), without those named in `keep_names` (what live jobs' `after:` names:
        their dependency must still resolve)."""
        marks = ",".join("?" * len(keep_names))
        rows = self._db.conn.execute(
            f"SELECT id, name, owner_uid, spec_file, updated FROM jobs WHERE {ENDED_SQL} AND updated < ?"
            f"{f' AND name NOT IN ({marks})' if keep_names else ''} ORDER BY updated LIMIT ?",
            (ended_before, *sorted(keep_names), limit),
        ).fetchall()
        return [Finished(int(r[0]), str(r[1]), int(r[2]), str(r[3]), float(r[4])) for r in rows]

    def finished_by_age(self) -> list[Finished]:
        """Every finished job, the oldest end first: the order retention's log cap removes logs in."""
        rows = self._db.conn.execute(
            f"SELECT id, name, owner_uid, spec_file, updated FROM jobs WHERE {ENDED_SQL} ORDER BY updated"
        ).fetchall()
        return [Finished(int(r[0]), str(r[1]), int(r[2]), str(r[3]), float(r[4])) for r in rows]

    def remove_finished(self, job_ids: list[int]) -> list[int]:
        """Delete these jobs with their attempts and events, in one transaction: only those that are
        finished (a live job is never removed, whatever the caller asked). Returns the ids removed."""
        if not job_ids:
            return []
        with self._db.write("remove_finished") as db:
            marks = ",".join("?" * len(job_ids))
            ids = [int(r[0]) for r in db.execute(f"SELECT id FROM jobs WHERE id IN ({marks}) AND {ENDED_SQL}",
                                                 job_ids).fetchall()]
            if ids:
                marks = ",".join("?" * len(ids))
                db.execute(f"DELETE FROM events WHERE job_id IN ({marks})", ids)
                db.execute(f"DELETE FROM attempts WHERE job_id IN ({marks})", ids)
                db.execute(f"DELETE FROM jobs WHERE id IN ({marks})", ids)
            return ids
