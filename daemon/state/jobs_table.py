"""The `jobs` table: one row per accepted job (its spec as accepted, owner, state and the bookkeeping
that must outlive a daemon restart), and the job events that go with each change.

Only intake adds jobs; only the run package changes their state afterwards, through `transition`
(or `AttemptsTable.finish`/`running`, which move the job in the same transaction as its attempt).
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from dataclasses import dataclass

from pydantic import ValidationError

from spx.daemon.core.spec import JobSpec
from spx.daemon.state.db import Database
from spx.daemon.state.states import TERMINAL, JobState, check_edge

# In the order and spelling of the `jobs_live` and `jobs_ended` partial indexes (schema.py): a query
# whose WHERE has the index's own term is one SQLite may answer from that index.
_TERMINAL_SQL = ", ".join(f"'{s.value}'" for s in sorted(TERMINAL, key=lambda s: s.value))
_LIVE_SQL = f"state NOT IN ({_TERMINAL_SQL})"        # the live jobs: `jobs_live`
_ENDED_SQL = f"state IN ({_TERMINAL_SQL})"           # the finished ones, with `updated >= ?`: `jobs_ended`
# The bookkeeping fields `transition` and `update` may write besides the state and its reason.
JOB_FIELDS = frozenset({"gpus", "backoff_remaining", "no_progress_streak", "backoff_level", "staging", "reason",
                        "held", "priority"})


class DuplicateJob(Exception):
    """A live job with this name exists already."""


@dataclass(frozen=True)
class JobRow:
    id: int
    name: str
    state: JobState
    reason: str | None
    owner_uid: int
    owner: str
    spec: JobSpec
    spec_file: str
    submitted: float
    priority: int
    gpus: list[int]
    backoff_remaining: float  # seconds of backoff left (monotonic), resumed after a daemon restart
    no_progress_streak: int
    backoff_level: int
    staging: str | None
    # Why this version refuses the spec stored when the job was accepted (its bounds tightened
    # since); None when it validates. Such a job's `spec` holds the stored values unvalidated.
    spec_problem: str | None = None
    # The job's identity across hosts: 32 hex digits made when it was submitted, kept when another
    # host adopts it from its checkpoint dir (`spx adopt`), so both name the same job alike.
    uid: str = ""
    held: str | None = None  # who holds it queued (`spx hold`), None when not held


def _parse_stored(raw: str) -> tuple[JobSpec, str | None]:
    """The accepted spec, re-validated by this version. A row that no longer validates must not make
    every read raise (the daemon would crash-loop at start on one job): it is returned unvalidated
    with the problem, and the run package ends such a job with that reason (`run/invalid_specs.py`)."""
    try:
        return JobSpec.model_validate_json(raw), None
    except ValidationError as e:
        problem = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors()[:5])
        return JobSpec.model_construct(**json.loads(raw)), problem


class LiveSpecs:
    """The live jobs' parsed specs, kept while they are live: a stored spec never changes after
    intake, and the scheduler, every `spx ls` and every scrape read the live jobs — validating each
    again was most of the cost of reading a thousand queued jobs (bench/bench_scale.py). A JobSpec is
    frozen, so one parsed copy is shared by every reader. Only live jobs: an ended job's spec is read
    now and then (~20 µs to parse), and a cache of every job read (an LRU of 2,048) filled at one
    entry (~5 KiB) per job the daemon saw, for its life or the cap — the soak's RSS growth
    (bench/bench_soak.py). Keyed by the text too: a rewritten row (an upgrade's) is parsed anew."""

    def __init__(self) -> None:
        self._kept: dict[int, tuple[str, tuple[JobSpec, str | None]]] = {}

    def parsed(self, job_id: int, raw: str, live: bool) -> tuple[JobSpec, str | None]:
        found = self._kept.get(job_id)
        if found is not None and found[0] == raw:
            return found[1]
        parsed = _parse_stored(raw)
        if live:
            self._kept[job_id] = (raw, parsed)
        return parsed

    def keep_only(self, live_ids: set[int]) -> None:
        """Let go of the jobs no longer live (every read of all live jobs says which are)."""
        if len(self._kept) > len(live_ids):
            self._kept = {i: v for i, v in self._kept.items() if i in live_ids}


def _job(row: sqlite3.Row, specs: LiveSpecs) -> JobRow:
    state = JobState(row["state"])
    spec, spec_problem = specs.parsed(row["id"], row["spec_json"], not state.terminal)
    return JobRow(
        id=row["id"],
        name=row["name"],
        state=state,
        reason=row["reason"],
        owner_uid=row["owner_uid"],
        owner=row["owner"],
        spec=spec,
        spec_file=row["spec_file"],
        submitted=row["submitted"],
        priority=row["priority"],
        gpus=json.loads(row["gpus"]),
        backoff_remaining=row["backoff_remaining"],
        no_progress_streak=row["no_progress_streak"],
        backoff_level=row["backoff_level"],
        staging=row["staging"],
        spec_problem=spec_problem,
        uid=row["uid"] or "",
        held=row["held"],
    )


def check_job_fields(fields: dict[str, object]) -> None:
    unknown = set(fields) - JOB_FIELDS
    if unknown:
        raise ValueError(f"not job fields: {sorted(unknown)}")


def write_transition(db: sqlite3.Connection, job_id: int, new: JobState, reason: str | None, now: float,
                     fields: dict[str, object]) -> None:
    """Inside a write transaction: check the edge, write state, reason and `fields`, record the event."""
    row = db.execute("SELECT state FROM jobs WHERE id = ?", (job_id,)).fetchone()
    check_edge(JobState(row["state"]), new)
    _set(db, job_id, {"state": new.value, "reason": reason, **fields}, now)
    db.execute("INSERT INTO events (job_id, time, kind, detail) VALUES (?, ?, ?, ?)", (job_id, now, new.value, reason))


def _set(db: sqlite3.Connection, job_id: int, fields: dict[str, object], now: float) -> None:
    values = {k: (json.dumps(v) if k == "gpus" else v) for k, v in fields.items()}
    values["updated"] = now
    cols = ", ".join(f"{k} = ?" for k in values)
    db.execute(f"UPDATE jobs SET {cols} WHERE id = ?", (*values.values(), job_id))


class JobsTable:
    """Jobs: writes on the daemon's main loop only; reads from any thread."""

    def __init__(self, db: Database):
        self._db = db
        self._specs = LiveSpecs()

    # --- writes -----------------------------------------------------------------------------------

    def add(self, spec: JobSpec, owner_uid: int, owner: str, spec_file: str, now: float, *,
            uid: str | None = None, submitted: float | None = None, event: str | None = None) -> int:
        """A new queued job. `uid`, `submitted` and `event` are given for a job adopted from another
        host's checkpoint dir (its identity and submission time are kept; the event says from where);
        a submitted job gets a fresh uid."""
        try:
            with self._db.write("add_job") as db:
                cur = db.execute(
                    "INSERT INTO jobs (name, state, owner_uid, owner, spec_json, spec_file, submitted,"
                    " priority, updated, uid) VALUES (?, 'queued', ?, ?, ?, ?, ?, ?, ?, ?)",
                    (spec.name, owner_uid, owner, spec.model_dump_json(by_alias=True), spec_file,
                     now if submitted is None else submitted, spec.priority, now, uid or uuid.uuid4().hex),
                )
                job_id = int(cur.lastrowid or 0)
                db.execute(
                    "INSERT INTO events (job_id, time, kind, detail) VALUES (?, ?, 'submitted', ?)",
                    (job_id, now, event or f"by {owner} (uid {owner_uid})"),
                )
                return job_id
        except sqlite3.IntegrityError as e:
            raise DuplicateJob(spec.name) from e

    def transition(self, job_id: int, new: JobState, reason: str | None, now: float, **fields: object) -> None:
        """The only writer of a job's state: checks the edge, writes state, reason and any of the
        job's bookkeeping fields, and records an event, all in one transaction."""
        check_job_fields(fields)
        with self._db.write("transition") as db:
            write_transition(db, job_id, new, reason, now, fields)

    def update(self, job_id: int, now: float, **fields: object) -> None:
        """Bookkeeping fields of a job (not its state)."""
        check_job_fields(fields)
        with self._db.write("update_job") as db:
            _set(db, job_id, fields, now)

    def set_reasons(self, reasons: dict[int, str], now: float) -> None:
        """Why each of these jobs waits (the scheduler's `Plan.waiting`), in one transaction: a
        thousand queued jobs must not cost a thousand commits."""
        with self._db.write("set_reasons") as db:
            db.executemany("UPDATE jobs SET reason = ?, updated = ? WHERE id = ?",
                           [(why, now, job_id) for job_id, why in reasons.items()])

    def add_event(self, job_id: int | None, kind: str, detail: str | None, now: float) -> None:
        """An entry in a job's history that changes nothing else (held, released, priority)."""
        with self._db.write("add_event") as db:
            db.execute("INSERT INTO events (job_id, time, kind, detail) VALUES (?, ?, ?, ?)",
                       (job_id, now, kind, detail))

    # --- reads ------------------------------------------------------------------------------------

    def get(self, job_id: int) -> JobRow:
        return _job(self._db.conn.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone(), self._specs)

    def live(self) -> list[JobRow]:
        """The jobs not finished (`LIVE`), in the queue's order: from the `jobs_live` index, however
        many finished jobs the store keeps."""
        rows = self._db.conn.execute(f"SELECT * FROM jobs WHERE {_LIVE_SQL} ORDER BY priority DESC, submitted, id").fetchall()
        jobs = [_job(r, self._specs) for r in rows]
        self._specs.keep_only({j.id for j in jobs})
        return jobs

    def live_states(self) -> list[tuple[str, list[int]]]:
        """Each live job's state and GPUs, in one statement reading no spec: what the STATUS line
        counts every few seconds, whatever the length of the queue."""
        rows = self._db.conn.execute(f"SELECT state, gpus FROM jobs WHERE {_LIVE_SQL}").fetchall()
        return [(r[0], json.loads(r[1])) for r in rows]

    def live_with_invalid_spec(self) -> list[JobRow]:
        """Live jobs whose stored spec this version refuses (`JobRow.spec_problem` says why)."""
        return [j for j in self.live() if j.spec_problem is not None]

    def all(self) -> list[JobRow]:
        return [_job(r, self._specs) for r in self._db.conn.execute("SELECT * FROM jobs ORDER BY id").fetchall()]

    def current(self, finished_since: float, ended_limit: int | None = None) -> list[JobRow]:
        """One job per name, the one `by_name` gives (the live one, else the newest finished),
        without finished ones that ended before `finished_since`; of those, only the `ended_limit`
        that ended last when it is set."""
        # The candidates (live jobs, jobs that ended since: two index reads), each kept if it is its
        # name's `by_name` job (the `jobs_name` index): never a pass over the whole history. The
        # ended ones are walked newest first along `jobs_ended`, so a limit stops the walk.
        latest = f"j.id = (SELECT k.id FROM jobs k WHERE k.name = j.name ORDER BY (k.{_ENDED_SQL}), k.id DESC LIMIT 1)"
        live = self._db.conn.execute(f"SELECT * FROM jobs j WHERE {_LIVE_SQL} AND {latest}").fetchall()
        ended = self._db.conn.execute(
            f"SELECT * FROM jobs j WHERE {_ENDED_SQL} AND updated >= ? AND {latest} ORDER BY updated DESC, id DESC LIMIT ?",
            (finished_since, -1 if ended_limit is None else ended_limit),
        ).fetchall()
        return sorted((_job(r, self._specs) for r in [*live, *ended]), key=lambda j: j.id)

    def by_name(self, name: str) -> JobRow | None:
        """The live job of that name, else the most recent finished one."""
        row = self._db.conn.execute(
            f"SELECT * FROM jobs WHERE name = ? ORDER BY (state IN ({_TERMINAL_SQL})), id DESC LIMIT 1",
            (name,),
        ).fetchone()
        return _job(row, self._specs) if row else None

    def by_uid(self, uid: str) -> JobRow | None:
        """The job with this identity (see `JobRow.uid`), whatever its state; None if unknown here."""
        row = self._db.conn.execute("SELECT * FROM jobs WHERE uid = ? ORDER BY id DESC LIMIT 1", (uid,)).fetchone()
        return _job(row, self._specs) if row else None

    def latest_named_before(self, name: str, before_id: int, owner_uid: int | None) -> JobRow | None:
        """The newest job called `name` submitted before job `before_id` (what `after:` names) of
        owner `owner_uid` (None: of anyone). The owner is filtered here, not by the caller: any
        number of newer same-name jobs of other users must not hide one's own."""
        row = self._db.conn.execute(
            "SELECT * FROM jobs WHERE name = ? AND id < ? AND (? IS NULL OR owner_uid = ?) ORDER BY id DESC LIMIT 1",
            (name, before_id, owner_uid, owner_uid),
        ).fetchone()
        return _job(row, self._specs) if row else None

    def active_since(self, since: float) -> list[JobRow]:
        """Jobs that are live, or whose last change was at or after `since` (wall clock), oldest first:
        what `spx history --since` covers."""
        rows = self._db.conn.execute(
            f"SELECT * FROM jobs WHERE {_LIVE_SQL} UNION ALL SELECT * FROM jobs WHERE {_ENDED_SQL} AND updated >= ?",
            (since,)).fetchall()
        return sorted((_job(r, self._specs) for r in rows), key=lambda j: j.id)

    def ended_since(self, since: float) -> list[JobRow]:
        """Jobs in a terminal state whose last change was at or after `since` (wall clock)."""
        # Sorted here: an ORDER BY id makes SQLite scan the table in id order rather than read `jobs_ended`.
        rows = self._db.conn.execute(f"SELECT * FROM jobs WHERE {_ENDED_SQL} AND updated >= ?", (since,)).fetchall()
        return sorted((_job(r, self._specs) for r in rows), key=lambda j: j.id)

    def ended_times_since(self, since: float) -> list[tuple[int, float]]:
        """(id, last change) of the jobs in a terminal state whose last change was at or after `since`,
        read through the finished jobs' index (a terminal job's row changes no more)."""
        rows = self._db.conn.execute(f"SELECT id, updated FROM jobs WHERE {_ENDED_SQL} AND updated >= ?",
                                     (since,)).fetchall()
        return [(int(r[0]), float(r[1])) for r in rows]

    def ended_ids_since(self, since: float) -> list[int]:
        """The ids of the jobs in a terminal state whose last change was at or after `since` (as
        `ended_since`, without reading their specs)."""
        rows = self._db.conn.execute(f"SELECT id FROM jobs WHERE {_ENDED_SQL} AND updated >= ?", (since,)).fetchall()
        return sorted(int(r[0]) for r in rows)

    def allocated_and_ended(self, job_id: int) -> tuple[float | None, float | None, float | None]:
        """When the job's GPUs were first allocated and when it was last placed (its first and latest
        `starting` events) and when it ended (its terminal event); None for what has not happened."""
        row = self._db.conn.execute(
            "SELECT MIN(CASE WHEN kind = 'starting' THEN time END), MAX(CASE WHEN kind = 'starting' THEN time END),"
            f" MAX(CASE WHEN kind IN ({_TERMINAL_SQL}) THEN time END) FROM events WHERE job_id = ?",
            (job_id,),
        ).fetchone()
        return (row[0], row[1], row[2]) if row is not None else (None, None, None)

    def spec_files(self) -> set[str]:
        """Every job's `spec_file`: the accepted copies intake has recorded."""
        return {r[0] for r in self._db.conn.execute("SELECT spec_file FROM jobs").fetchall()}
