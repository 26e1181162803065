"""A job's incidents as `spx incidents` shows them: each stored document (run/incidents.py) with
its recovery read from the attempts' timelines, which go on after the incident is written.

The recovery is the failed attempt's failure phases (launcher exit, failure seen, group dead, end
recorded) and the next attempt's start and worker phases (placed, checkpoint found, spawn, …,
first step); `restart_seconds` is from the failure (`failed_at`: the daemon's stop began, or the
launcher exited) to the next attempt's first step (its first heartbeat for a script that reports
no phases), None until it has one. The goodput ledger (issue 27) will own restart time; until it
does, this field is filled from the phases and says so in `restart_seconds_from`.
"""

from __future__ import annotations

from collections.abc import Callable

from spx.daemon.state import phases as timeline
from spx.daemon.state.jobs_table import JobRow
from spx.daemon.state.store import Store

# The phase of the next attempt that ends a restart, best first.
RESTART_ENDS = ("first_step", "first_beat")
MAX_LISTED = 200  # incidents of all of a user's jobs at once: the latest ones


def visible(store: Store, name: str | None, may_see: Callable[[JobRow], bool]) -> list[dict] | None:
    """`spx incidents [NAME]`: the incidents of the job named `name` (its latest of that name; None
    if there is none the caller may see), or, without a name, the latest MAX_LISTED of every job
    the caller may see, oldest first."""
    if name:
        job = store.jobs.by_name(name)
        return incidents(store, [job]) if job is not None and may_see(job) else None
    having = set(store.incidents.job_ids())
    jobs = [j for j in store.jobs.all() if j.id in having and may_see(j)]
    return sorted(incidents(store, jobs), key=lambda i: i["failed_at"])[-MAX_LISTED:]


def incidents(store: Store, jobs: list[JobRow]) -> list[dict]:
    """Every incident of `jobs`, oldest first per job, each with `job`, `recovery` and `restart_seconds`."""
    by_id = {j.id: j for j in jobs}
    rows = store.incidents.for_jobs(list(by_id))
    attempts = store.attempts.for_jobs(sorted({r.job_id for r in rows}))
    out: list[dict] = []
    for r in rows:
        phases = {a.number: timeline.stored(a.phases) for a in attempts.get(r.job_id, [])}
        failed, following = phases.get(r.attempt, {}), phases.get(r.attempt + 1, {})
        recovery = [{"attempt": r.attempt, "phase": p, "time": failed[p]} for p in timeline.FAILURE_PHASES if p in failed]
        recovery += [{"attempt": r.attempt + 1, "phase": p, "time": following[p]}
                     for p in timeline.ATTEMPT_PHASES if p in following]
        start = r.doc.get("failed_at")
        end = next((following[p] for p in RESTART_ENDS if p in following), None)
        restart = round(end - start, 3) if isinstance(start, (int, float)) and end is not None else None
        out.append({**r.doc, "job": by_id[r.job_id].name, "job_id": r.job_id, "attempt": r.attempt,
                    "class": r.reason_class, "recovery": sorted(recovery, key=lambda p: p["time"]),
                    "restart_seconds": restart, "restart_seconds_from": "phases"})
    return out
