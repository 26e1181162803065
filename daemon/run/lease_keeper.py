"""Keeps each job's `.spx/` on the checkpoint volume true while it lives here (host loss).

Two duties, each a helper process per owner, as that owner (the volume may be slow or hung, and a
user may hold their own lock files: the main loop must never wait on it, and neither may another
owner):

- every `adopt_lease_seconds / 3`: renew the lease of every live job whose `.spx/job.yaml` names it
  (written when its attempt was prepared, or by the host it was adopted from). A lease another
  host holds now means that host adopted the job while this one could not renew (a partition, a
  hung volume, a stopped daemon): reported once to the main loop (`on_lost`, thread-safe), which
  stops the attempt here and ends the job as handed over (step: LeaseLost). A renewal that has not
  succeeded for longer than the lease's safety margin (two thirds of it) is logged loudly;
- every turn (TURN_SECONDS): for each job that ended since the last turn, write `.spx/state` with its
  terminal state and give the lease up, so that `spx adopt` on any host never runs it again.

Both run in this keeper's own `core.lanes.Lanes` (one slot per owner, a deadline from each helper's
start): one owner's stalled helper holds only that owner's slot, so every other owner's renewal
runs at once. This thread submits and delivers; it writes nothing to the store.

A job that ended while this daemon was down (or the marker failed) is found again at start: the jobs
that ended in the last START_LOOKBACK_SECONDS are marked once more (the write is idempotent).
"""

from __future__ import annotations

import functools
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from spx.daemon.core.config import DaemonConfig
from spx.daemon.core.lanes import Lanes, Outcome
from spx.daemon.core.log import get_logger
from spx.daemon.intake import job_record
from spx.daemon.state.jobs_table import JobRow
from spx.daemon.state.store import Store
from spx.daemon.userfs import as_user

log = get_logger()
TURN_SECONDS = 2.0
START_LOOKBACK_SECONDS = 6 * 3600.0
HELPER_TIMEOUT_SECONDS = 30.0
# The lane's deadline is past the helper's own timeout (it kills the helper): the answer comes from
# the helper, and `overdue` only if even the kill did not return.
LANE_DEADLINE_SECONDS = HELPER_TIMEOUT_SECONDS + 5.0
LANE_SLOTS = 8
SAFETY_MARGIN = 2 / 3  # of adopt_lease_seconds: past it without a renewal, the job may be adopted elsewhere soon

# (owner uid, action, args, timeout) -> the helper's result; as_user.run as that owner unless a test says otherwise
Call = Callable[[int, str, dict[str, Any], float], Any]


def _as_owner(uid: int, action: str, args: dict[str, Any], timeout: float) -> Any:
    return as_user.run(as_user.owner(uid), action, args, timeout)


class LeaseKeeper:
    def __init__(self, cfg: DaemonConfig, store: Store, on_lost: Callable[[int, str], None] = lambda _j, _h: None,
                 clock: Callable[[], float] = time.time, call: Call = _as_owner, lanes: Lanes | None = None):
        self.cfg = cfg
        self.store = store
        self.clock = clock
        self.on_lost = on_lost
        self.host = job_record.host_id(cfg.state_dir)
        self.label = job_record.host_label(cfg.state_dir)
        self._call = call
        self._woken = threading.Event()
        self.lanes = lanes or Lanes(LANE_SLOTS, 1, wake=self._woken.set, name="spx-lease")
        self._since = clock() - START_LOOKBACK_SECONDS
        self._marked: dict[int, float] = {}  # job id → when it ended (kept while inside the window)
        self._next_renew = 0.0
        self._renewing: set[int] = set()  # owners with a renewal submitted and not answered yet
        self._renewed: dict[int, float] = {}  # live job id → when its lease was last renewed (held jobs only)
        self.at_risk: set[int] = set()  # live jobs past the safety margin without a renewal (logged once)
        self._lost: set[int] = set()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spx-lease-keeper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._woken.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.lanes.close()

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self.turn()
            except Exception as e:  # noqa: BLE001 — a store hiccup: next turn tries again
                log.error("lease_keeper_turn_failed", job=None, attempt=None, error=f"{type(e).__name__}: {e}")
            self._woken.wait(TURN_SECONDS)
            self._woken.clear()

    def turn(self) -> None:
        """One pass: answers of helpers that finished, end markers of jobs that ended, the leases if
        their renewal is due, and the loud line for a lease past its margin."""
        self.lanes.deliver()
        now = self.clock()
        self.mark_ended(now)
        live = [j for j in self.store.jobs.live() if j.uid]
        if now >= self._next_renew:
            self._next_renew = now + self.cfg.adopt_lease_seconds / 3
            self.renew(live, now)
        self._check_margins(live, now)

    # --- end markers ---------------------------------------------------------------------------

    def mark_ended(self, now: float) -> None:
        since, self._since = self._since, now - 60.0  # a minute of overlap: a commit racing this query
        ended = [j for j in self.store.jobs.ended_since(since) if j.id not in self._marked and j.uid]
        self._marked = {i: t for i, t in self._marked.items() if t >= since}
        for uid, jobs in _by_owner(ended).items():
            docs = [{"dir": str(j.spec.checkpoint_dir(self.cfg.checkpoints_root)), "host": self.host,
                     "state": job_record.state_doc(j, self.host, now, self.label)} for j in jobs]
            self._submit(uid, "end-marker", "spx_mark_ended", {"jobs": docs, "now": now}, jobs,
                         functools.partial(self._ended, jobs, docs))
            self._marked.update((j.id, now) for j in jobs)  # tried once: an owner gone stays gone

    @staticmethod
    def _ended(jobs: list[JobRow], docs: list[dict[str, Any]], results: list[Any]) -> None:
        """The end markers' answers (on the keeper's thread)."""
        for job, doc, result in zip(jobs, docs, results, strict=False):
            if result == "written":
                log.info("job_end_recorded", job=job.name, attempt=None, state=job.state.value, dir=doc["dir"])
            elif result == "other":
                log.info("job_end_left_to_holder", job=job.name, attempt=None, state=job.state.value, dir=doc["dir"],
                         detail="another host holds its lease (it took the job over): its end is that host's to record")
            elif str(result).startswith("error"):
                log.warning("job_end_not_recorded", job=job.name, attempt=None, error=str(result))

    # --- renewals ------------------------------------------------------------------------------

    def renew(self, live: list[JobRow], now: float) -> None:
        """One renewal per owner (all their live jobs in one helper), in that owner's lane; an owner
        whose last renewal has not come back yet gets no second one (it would only queue behind)."""
        ids = {j.id for j in live}
        self._renewed = {i: t for i, t in self._renewed.items() if i in ids}
        self._lost &= ids
        for uid, jobs in _by_owner(live).items():
            if uid in self._renewing:
                continue
            docs = [{"dir": str(j.spec.checkpoint_dir(self.cfg.checkpoints_root)),
                     "lease": job_record.lease_doc(self.host, j.uid, self.cfg.adopt_lease_seconds, now, self.label)}
                    for j in jobs]
            self._renewing.add(uid)
            self._submit(uid, "lease-renewal", "spx_renew", {"jobs": docs, "now": now}, jobs,
                         functools.partial(self._renewals, uid, jobs, now), functools.partial(self._renewing.discard, uid))

    def _renewals(self, uid: int, jobs: list[JobRow], asked: float, results: list[Any]) -> None:
        """A renewal's answers (on the keeper's thread), one per job."""
        self._renewing.discard(uid)
        for job, result in zip(jobs, results, strict=False):
            if not isinstance(result, dict):
                continue
            if result.get("result") == "held":
                self._renewed[job.id] = asked
                if job.id in self.at_risk:
                    self.at_risk.discard(job.id)
                    log.info("job_lease_renewed_again", job=job.name, attempt=None)
            elif result.get("result") == "other":
                self._report_lost(job, result.get("holder"))
            elif result.get("result") == "error":
                log.warning("job_lease_not_renewed", job=job.name, attempt=None, error=result.get("error"))

    def _report_lost(self, job: JobRow, holder: object) -> None:
        if job.id in self._lost:
            return
        self._lost.add(job.id)
        lease = holder if isinstance(holder, dict) else {}
        label = str(lease.get("label") or lease.get("host") or "(unknown)")[:300]
        log.error("job_lease_lost", job=job.name, attempt=None, holder=label,
                  detail="another host took this job over while its lease here could not be renewed; its attempt "
                         "here is stopped and the job ends here as handed over")
        self.on_lost(job.id, label)

    def _check_margins(self, live: list[JobRow], now: float) -> None:
        margin = self.cfg.adopt_lease_seconds * SAFETY_MARGIN
        for job in live:
            last = self._renewed.get(job.id)
            if last is None or job.id in self.at_risk or job.id in self._lost or now - last <= margin:
                continue
            self.at_risk.add(job.id)
            log.error("job_lease_at_risk", job=job.name, attempt=None, seconds_since_renewal=round(now - last, 1),
                      lease_seconds=self.cfg.adopt_lease_seconds,
                      detail="its lease could not be renewed for two thirds of its length: another host may adopt "
                             "this job soon (a slow or hung checkpoint volume, or its owner's lock files held)")

    # --- the owner's lane ----------------------------------------------------------------------

    def _submit(self, uid: int, kind: str, action: str, args: dict[str, Any], jobs: list[JobRow],
                answer: Callable[[list[Any]], None], late: Callable[[], None] = lambda: None) -> None:
        def done(outcome: Outcome) -> None:
            if outcome.ok and isinstance(outcome.value, list):
                answer(outcome.value)
                return
            late()
            for job in jobs:
                log.warning("job_record_unreachable", job=job.name, attempt=None, action=action,
                            error=str(outcome.error) if outcome.error is not None else "an odd answer")

        self.lanes.submit(uid, kind, lambda: self._call(uid, action, args, HELPER_TIMEOUT_SECONDS),
                          LANE_DEADLINE_SECONDS, done)


def _by_owner(jobs: list[JobRow]) -> dict[int, list[JobRow]]:
    out: dict[int, list[JobRow]] = defaultdict(list)
    for job in jobs:
        out[job.owner_uid].append(job)
    return out
