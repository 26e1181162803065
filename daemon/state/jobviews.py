"""Build `JobView`s from the store and the heartbeats: the one snapshot every reader shares."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal, Protocol

from spx.daemon.state import goodput, ledger_view, standby_memory
from spx.daemon.state import phases as timeline
from spx.daemon.state.attempts_table import restarts_by_reason
from spx.daemon.state.jobs_table import JobRow
from spx.daemon.state.node_view import node_view
from spx.daemon.state.store import Store
from spx.daemon.state.views import AttemptView, JobView
from spx.daemon.userfs import heartbeat


def heartbeat_path(run_dir: Path, job: JobRow) -> Path:
    """`run/jobs/ID-NAME/heartbeat.json`: `run/jobs` is root's, `ID-NAME/` is the job owner's."""
    return run_dir / "jobs" / f"{job.id}-{job.name}" / "heartbeat.json"


class Seen(Protocol):
    """The processes the supervisor last published (run/snapshot.py's `Snapshot`): each job's
    attempt's, by name, and its standby's, by id."""

    def live_pids(self) -> dict[str, list[int]]: ...
    def standby_pids(self) -> dict[int, list[int]]: ...


def job_view(
    store: Store, job: JobRow, run_dir: Path, pids: dict[str, list[int]] | None = None, with_history: bool = False,
    gang_hosts: list[dict] | None = None, now: float | None = None, ledgers: dict[int, goodput.Ledger] | None = None,
    standbys: dict[int, list[int]] | None = None,
) -> JobView:
    """`gang_hosts`: for a job across hosts, every host's line as the supervisor last read it. The
    goodput ledger is at `now` (default: the wall clock); a live job's is also put in `ledgers`.
    `standbys`: each job's standby processes by job id, whose memory is read now (state/standby_memory.py)."""
    attempts = store.attempts.for_job(job.id)
    # Through userfs: the file is the user's, and this runs for every `spx ls` and scrape — a FIFO,
    # a link to a root-only file, a huge file or garbage there is "no heartbeat" with the reason,
    # never a wait, a leak or an exception.
    found = heartbeat.read(heartbeat_path(run_dir, job), run_dir / "jobs")
    beat = found.beat
    # A beat older than the current attempt is the previous attempt's: its step was lost with it
    # (the job went back to the checkpoint it resumed from), and its rate is not this attempt's.
    ledger = ledger_view.job_ledger(store, job, attempts, time.time() if now is None else now)
    if ledgers is not None and not job.state.terminal:
        ledgers[job.id] = ledger
    stale = beat is not None and bool(attempts) and beat.time < attempts[-1].start
    step = attempts[-1].resumed_from_step if stale else (beat.step if beat else None)
    last_ckpt_step = beat.last_checkpoint_step if beat else None
    if last_ckpt_step is None:
        resumed = [a.resumed_from_step for a in attempts if a.resumed_from_step is not None]
        last_ckpt_step = max(resumed) if resumed else None
    history = [
        AttemptView(
            number=a.number, start=a.start, end=a.end, exit_code=a.exit_code, signal=a.signal,
            reason=a.reason, resumed_from_step=a.resumed_from_step, resumed_from=a.resumed_from,
            root_cause=a.root_cause, reason_class=a.reason_class, phases=timeline.stored(a.phases), max_step=a.max_step,
            checkpoint=json.loads(a.checkpoint_discovery) if a.checkpoint_discovery else None,
        )
        for a in attempts
    ] if with_history else []
    return JobView(
        name=job.name,
        state=job.state.value,
        reason=job.reason,
        owner_uid=job.owner_uid,
        owner=job.owner,
        attempts=len(attempts),
        step=step,
        epoch=beat.epoch if beat and not stale else None,
        samples_per_second=beat.samples_per_second if beat and not stale and job.state.value == "running" else None,
        last_checkpoint_step=last_ckpt_step,
        last_checkpoint_time=beat.last_checkpoint_time if beat else None,
        gpus=list(job.gpus),
        submitted=job.submitted,
        priority=job.priority,
        restarts_by_reason=restarts_by_reason(attempts),
        pids=list((pids or {}).get(job.name, [])),
        standby_memory_bytes=(standby_bytes := standby_memory.tree_bytes((standbys or {}).get(job.id, ()))),
        standby_workers=job.spec.worker_count if standby_bytes is not None and job.spec.restart.standby_workers else 0,
        staging=job.staging,
        history=history,
        job_id=job.id,
        checkpoints_tracked=beat is not None,
        heartbeat_problem=found.problem,
        rank_step_seconds=beat.rank_step_seconds if beat and not stale and job.state.value == "running" else None,
        node=node_view(getattr(job.spec, "nodes", None), job.name, None if stale else beat,
                       attempts[-1].generation if attempts else None, gang_hosts),
        ledger=ledger.to_json(),
        verifications=[{**v.doc, "time": v.time, "verified": v.verified}
                       for v in store.verifications.for_job(job.id)] if with_history else [],
    )


# Finished jobs stay in `spx ls` and /metrics this long after they end (SpxJobFailed looks back an
# hour); then `spx ls --all` and `spx status NAME` still show them. Without it a host's history would
# grow every scrape forever, and a reused name would give two series of one job.
RECENT_SECONDS = 24 * 3600.0

Scope = Literal["live", "recent", "all"]


class EndedViews:
    """The views of ended jobs, kept between one scrape and the next: an ended job's view no longer
    changes (its attempts, its settled ledger, its last beat), and each scrape showed every one of them
    afresh — the soak's scrape time followed the day's job count (bench/bench_soak.py). Keyed by the
    row's state and reason too, so a job changed after its end is built again. Holds only what the
    last read showed; the exporter's scrapes may run on two threads at once. `limit`: how many ended
    jobs a read shows, the newest (config `metrics_ended_jobs`); None, all of the last day's."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._kept: dict[int, tuple[tuple[str, str | None], JobView]] = {}
        self.built = 0  # views built rather than found (the tests count them)

    def views(self, rows: list[JobRow], build: Callable[[JobRow], JobView]) -> list[JobView]:
        with self._lock:
            kept = dict(self._kept)
        fresh: dict[int, tuple[tuple[str, str | None], JobView]] = {}
        shown = []
        for job in rows:
            if not job.state.terminal:
                shown.append(build(job))
                continue
            key = (job.state.value, job.reason)
            found = kept.get(job.id)
            if found is None or found[0] != key:
                found = (key, build(job))
                self.built += 1
            fresh[job.id] = found
            shown.append(found[1])
        with self._lock:
            self._kept = fresh
        return shown


def all_views(store: Store, run_dir: Path, seen: Callable[[], Seen] | None = None,
              scope: Scope = "recent", now: float | None = None,
              ledgers: dict[int, goodput.Ledger] | None = None, kept: EndedViews | None = None) -> list[JobView]:
    """Views of the live jobs ("live"), plus each name's latest job that finished in the last
    RECENT_SECONDS ("recent"), or of every job ever submitted ("all"); each ledger at `now`, and the
    live jobs' in `ledgers` (see `job_view`). With `kept`, "recent" shows only the `kept.limit` that
    ended last, and an ended job's view is taken from the last read's when it showed the same job.
    `seen`: the supervisor's last snapshot (its jobs' pids and standbys)."""
    snap = seen() if seen else None
    live_pids, standbys = (snap.live_pids(), snap.standby_pids()) if snap else ({}, {})
    now = time.time() if now is None else now
    if scope == "live":
        rows = store.jobs.live()
    elif scope == "recent":
        rows = store.jobs.current(finished_since=now - RECENT_SECONDS, ended_limit=kept.limit if kept else None)
    else:
        rows = store.jobs.all()

    def build(job: JobRow) -> JobView:
        return job_view(store, job, run_dir, live_pids, now=now, ledgers=ledgers, standbys=standbys)

    return kept.views(rows, build) if kept is not None else [build(j) for j in rows]
