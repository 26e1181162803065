"""Keeps each job's `.spx/` on the checkpoint volume true while it lives here (host loss).

Two duties, on a thread of its own (each is a helper process per owner, as that owner: the volume may
be slow or hung, and the main loop must never wait on it):

- every `adopt_lease_seconds / 3`: renew the lease of every live job whose `.spx/job.yaml` names it
  (written when its attempt was prepared, or by the host it was adopted from). A lease another
  host holds now is logged (`job_lease_lost`): that host adopted the job while this one could not
  renew (a partition or a hung volume longer than the lease);
- every turn (TURN_SECONDS): for each job that ended since the last turn, write `.spx/state` with its
  terminal state and give the lease up, so that `spx adopt` on any host never runs it again.

A job that ended while this daemon was down (or the marker failed) is found again at start: the jobs
that ended in the last START_LOOKBACK_SECONDS are marked once more (the write is idempotent).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from spx.daemon.core.config import DaemonConfig
from spx.daemon.core.log import get_logger
from spx.daemon.intake import job_record
from spx.daemon.state.jobs_table import JobRow
from spx.daemon.state.store import Store
from spx.daemon.userfs import as_user
from spx.daemon.userfs.fsafe import UserPathError

log = get_logger()
TURN_SECONDS = 2.0
START_LOOKBACK_SECONDS = 6 * 3600.0
HELPER_TIMEOUT_SECONDS = 30.0


class LeaseKeeper:
    def __init__(self, cfg: DaemonConfig, store: Store, clock: Callable[[], float] = time.time):
        self.cfg = cfg
        self.store = store
        self.clock = clock
        self.host = job_record.host_id(cfg.state_dir)
        self._since = clock() - START_LOOKBACK_SECONDS
        self._marked: dict[int, float] = {}  # job id → when it ended (kept while inside the window)
        self._next_renew = 0.0
        self._lost: set[int] = set()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spx-lease-keeper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout=HELPER_TIMEOUT_SECONDS + 5)

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self.turn()
            except Exception as e:  # noqa: BLE001 — a bad volume or a store hiccup: next turn tries again
                log.error("lease_keeper_turn_failed", job=None, attempt=None, error=f"{type(e).__name__}: {e}")
            self._stopping.wait(TURN_SECONDS)

    def turn(self) -> None:
        """One pass: end markers of jobs that ended, then the leases if their renewal is due."""
        now = self.clock()
        self.mark_ended(now)
        if now >= self._next_renew:
            self._next_renew = now + self.cfg.adopt_lease_seconds / 3
            self.renew(now)

    def mark_ended(self, now: float) -> None:
        since, self._since = self._since, now - 60.0  # a minute of overlap: a commit racing this query
        ended = [j for j in self.store.jobs.ended_since(since) if j.id not in self._marked and j.uid]
        self._marked = {i: t for i, t in self._marked.items() if t >= since}
        by_owner: dict[int, list[JobRow]] = defaultdict(list)
        for job in ended:
            by_owner[job.owner_uid].append(job)
        for uid, jobs in by_owner.items():
            docs = [{"dir": str(j.spec.checkpoint_dir(self.cfg.checkpoints_root)), "host": self.host,
                     "state": job_record.state_doc(j, self.host, now)} for j in jobs]
            results = self._as_owner(uid, "spx_mark_ended", {"jobs": docs, "now": now}, jobs) or []
            for job, doc, result in zip(jobs, docs, results, strict=False):
                if result == "written":
                    log.info("job_end_recorded", job=job.name, attempt=None, state=job.state.value, dir=doc["dir"])
                elif str(result).startswith("error"):
                    log.warning("job_end_not_recorded", job=job.name, attempt=None, error=str(result))
            self._marked.update((j.id, now) for j in jobs)  # tried once: an owner gone stays gone

    def renew(self, now: float) -> None:
        by_owner: dict[int, list[JobRow]] = defaultdict(list)
        for job in self.store.jobs.live():
            if job.uid:
                by_owner[job.owner_uid].append(job)
        for uid, jobs in by_owner.items():
            docs = [{"dir": str(j.spec.checkpoint_dir(self.cfg.checkpoints_root)),
                     "lease": job_record.lease_doc(self.host, j.uid, self.cfg.adopt_lease_seconds, now)} for j in jobs]
            for job, result in zip(jobs, self._as_owner(uid, "spx_renew", {"jobs": docs, "now": now}, jobs) or [],
                                   strict=False):
                self._report(job, result)

    def _report(self, job: JobRow, result: dict[str, Any]) -> None:
        if result.get("result") == "other":
            if job.id not in self._lost:
                self._lost.add(job.id)
                holder = result.get("holder") or {}
                log.error("job_lease_lost", job=job.name, attempt=None, holder=holder.get("host"),
                          detail="another host adopted this job while its lease here could not be renewed; "
                                 "cancel it here (spx cancel) so that only one host writes its checkpoints")
        elif result.get("result") == "error":
            log.warning("job_lease_not_renewed", job=job.name, attempt=None, error=result.get("error"))

    def _as_owner(self, uid: int, action: str, args: dict[str, Any], jobs: list[JobRow]) -> list[Any] | None:
        try:
            result = as_user.run(as_user.owner(uid), action, args, HELPER_TIMEOUT_SECONDS)
        except UserPathError as e:
            for job in jobs:
                log.warning("job_record_unreachable", job=job.name, attempt=None, action=action, error=e.strerror)
            return None
        return result if isinstance(result, list) else None
