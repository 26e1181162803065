"""Retention: nothing of a finished job is kept forever (config `retention:`, docs/retention.md).

A job that ended more than `finished_jobs_days` ago is removed: first its files (the accepted copy,
its log dirs, its heartbeat dir: run/retention_files.py), off the main loop in its owner's lane,
one removal per owner at a time — the per-rank log dir is the owner's, who may have filled it with
a million files: that costs their own lane's time, no one else's, and a backlog of their old jobs
never queues ahead of their live jobs' work —, then, once they are gone, its store rows (job, attempts,
events) on the loop, the store's one writer, at most ROWS_PER_TURN jobs per transaction. Rows go
last: a job whose files could not be removed keeps its rows and is tried again at the next pass.

A pass runs every `check_every_seconds` (at once again while a whole batch of expired jobs was
found); it also sends the daemon's own sweep to its lane (DAEMON_LANE): the disk used by each
finished job's logs, spool/rejected/ entries as old as a finished job may be, and trash a crash
left. With the sizes, `logs_max_bytes` is held: the oldest finished jobs' logs go first (their rows
stay, with a `logs-removed` event) until the rest fit.

Never touched: a live job (the store removes only finished rows; a log dir is taken only by its
marker, and the sweep skips live jobs' ids), nor a finished job a live job's `after:` names (the
dependency must still resolve when that job is checked).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from spx.daemon.core.config import DaemonConfig
from spx.daemon.core.lanes import Lanes, Outcome
from spx.daemon.core.log import get_logger
from spx.daemon.run import retention_files
from spx.daemon.run.retention_files import Sweep
from spx.daemon.state.housekeeping_table import Finished
from spx.daemon.state.store import Store

log = get_logger()

DAY_SECONDS = 86400.0
BATCH = 100                 # expired jobs whose files are being removed at once, at most
ROWS_PER_TURN = 200         # jobs whose rows one turn deletes, at most (one transaction)
DAEMON_LANE = -1            # the lanes' owner of the daemon's own sweep: no user's slot is taken
FILES_DEADLINE_SECONDS = 600.0


class Retention:
    """The main loop's side of retention (see the module doc); `tick` is its stage of each turn."""

    def __init__(self, cfg: DaemonConfig, store: Store, lanes: Lanes,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time):
        self.cfg = cfg
        self.settings = cfg.retention
        self.store = store
        self.lanes = lanes
        self.clock = clock
        self.wall = wall
        # What /metrics shows (exporter/housekeeping_collector.py), counted since the daemon started.
        self.removed_jobs = 0
        self.logs_removed = 0
        self.rejected_removed = 0
        self.finished_log_bytes: int | None = None  # at the last sweep
        self._removing: dict[int, Finished] = {}  # job id → its files being removed (a task in its lane)
        self._capping: dict[int, Finished] = {}    # job id → its logs being removed by the cap
        self._removable: list[Finished] = []       # files gone: rows to delete on the loop
        self._failed: set[int] = set()             # jobs whose files could not be removed (logged once)
        self._sweeping = False
        self._again = False  # work was left for an owner who had a removal running: look again when it ends
        self._next_pass = 0.0
        self._next_sweep = 0.0

    # --- the loop's stage ---------------------------------------------------------------------------

    def tick(self) -> None:
        self._delete_rows()
        now = self.clock()
        if now < self._next_pass:
            return
        self._next_pass = now + self.settings.check_every_seconds
        if len(self._removing) < BATCH and self._expire() == BATCH:
            self._next_pass = now  # more are due: the next turn takes the next batch
        if not self._sweeping and now >= self._next_sweep:
            self._next_sweep = now + self.settings.check_every_seconds
            self._start_sweep()

    def _cutoff(self) -> float | None:
        days = self.settings.finished_jobs_days
        return None if days is None else self.wall() - days * DAY_SECONDS

    def _busy_owners(self) -> set[int]:
        """Owners with a removal in their lane now: one at a time each, so a user's backlog of old
        jobs never queues ahead of their own jobs' launches in that lane."""
        return {j.owner_uid for j in (*self._removing.values(), *self._capping.values())}

    def _expire(self) -> int:
        """Send the files of the next batch of expired jobs to their owners' lanes, one per owner; how
        many were found."""
        cutoff = self._cutoff()
        if cutoff is None:
            return 0
        keep = frozenset(name for job in self.store.jobs.live() for name in job.spec.after)
        found = self.store.housekeeping.expired(cutoff, BATCH, keep)
        busy = self._busy_owners()
        for job in found:
            if not self._may_start(job, busy):
                continue
            self._removing[job.id] = job
            self.lanes.submit(job.owner_uid, "retention", self._files_of(job), FILES_DEADLINE_SECONDS,
                              self._files_removed(job))
        return len(found)

    def _may_start(self, job: Finished, busy: set[int]) -> bool:
        """One removal per owner at a time (the next one as soon as it ends: `_again`), and never two
        of one job; `busy` gains the owner when this one may start."""
        if job.id in self._removing or job.id in self._capping:
            return False
        if job.owner_uid in busy:
            self._again = True
            return False
        busy.add(job.owner_uid)
        return True

    def _files_of(self, job: Finished) -> Callable[[], list[str]]:
        return lambda: retention_files.remove_job_files(self.cfg, job.id, job.name, job.spec_file)

    def _files_removed(self, job: Finished) -> Callable[[Outcome], None]:
        def done(outcome: Outcome) -> None:
            self._removing.pop(job.id, None)
            self._look_again()
            if outcome.ok:
                self._failed.discard(job.id)
                self._removable.append(job)
                if outcome.value:
                    log.info("retention_files_removed", job=job.name, attempt=None, job_id=job.id,
                             removed=outcome.value)
            elif job.id not in self._failed:
                self._failed.add(job.id)
                log.warning("retention_files_not_removed", job=job.name, attempt=None, job_id=job.id,
                            error=f"{type(outcome.error).__name__}: {outcome.error}",
                            then="its rows are kept; tried again at the next pass")
        return done

    def _look_again(self) -> None:
        """An owner's removal ended: if work was left for them, the next turn passes and sweeps again."""
        if self._again:
            self._again = False
            self._next_pass = self._next_sweep = 0.0

    def backlog(self) -> bool:
        """Rows of removed jobs wait for later turns (at most ROWS_PER_TURN a turn)."""
        return bool(self._removable)

    def _delete_rows(self) -> None:
        """The rows of jobs whose files are gone, at most ROWS_PER_TURN in one transaction."""
        if not self._removable:
            return
        batch = self._removable[:ROWS_PER_TURN]
        removed = set(self.store.housekeeping.remove_finished([j.id for j in batch]))  # StoreUnavailable: kept, retried
        del self._removable[:len(batch)]
        self.removed_jobs += len(removed)
        days = self.settings.finished_jobs_days
        for job in batch:
            if job.id in removed:
                log.info("retention_removed", job=job.name, attempt=None, job_id=job.id, owner_uid=job.owner_uid,
                         ended=job.ended, older_than_days=days)

    # --- the daemon's sweep: log sizes and their cap, rejected files, trash ----------------------------

    def _start_sweep(self) -> None:
        live = frozenset(j.id for j in self.store.jobs.live())
        cutoff, now = self._cutoff(), self.wall()
        self._sweeping = True
        self.lanes.submit(DAEMON_LANE, "retention-sweep", lambda: self._sweep(cutoff, live, now),
                          FILES_DEADLINE_SECONDS, self._swept)

    def _sweep(self, cutoff: float | None, live: frozenset[int], now: float) -> tuple[Sweep, list[Finished]]:
        """In the lane: the files' pass, and every finished job oldest first — a read of the whole
        history that a host keeping jobs forever makes long, so not on the loop (readers may use
        the store from any thread)."""
        return retention_files.sweep(self.cfg, cutoff, live, now), self.store.housekeeping.finished_by_age()

    def _swept(self, outcome: Outcome) -> None:
        self._sweeping = False
        if not outcome.ok:
            log.warning("retention_sweep_failed", job=None, attempt=None,
                        error=f"{type(outcome.error).__name__}: {outcome.error}")
            return
        found, by_age = outcome.value
        self.rejected_removed += found.rejected_removed
        if found.rejected_removed or found.trash_removed:
            log.info("retention_swept", job=None, attempt=None, rejected_removed=found.rejected_removed,
                     trash_removed=found.trash_removed)
        finished = [j for j in by_age if found.log_bytes.get(j.id)]
        total = sum(found.log_bytes[j.id] for j in finished)
        self.finished_log_bytes = total
        cap = self.settings.logs_max_bytes
        if cap is None:
            return
        busy = self._busy_owners()
        for job in finished:
            if total <= cap:
                break
            total -= found.log_bytes[job.id]
            if not self._may_start(job, busy):
                continue
            self._capping[job.id] = job
            self.lanes.submit(job.owner_uid, "retention-logs", self._logs_of(job), FILES_DEADLINE_SECONDS,
                              self._logs_removed(job, found.log_bytes[job.id]))

    def _logs_of(self, job: Finished) -> Callable[[], list[str]]:
        return lambda: retention_files.remove_logs(self.cfg, job.id, job.name)

    def _logs_removed(self, job: Finished, size: int) -> Callable[[Outcome], None]:
        def done(outcome: Outcome) -> None:
            self._capping.pop(job.id, None)
            self._look_again()
            if not outcome.ok:
                log.warning("retention_logs_not_removed", job=job.name, attempt=None, job_id=job.id,
                            error=f"{type(outcome.error).__name__}: {outcome.error}")
                return
            self.logs_removed += 1
            detail = f"logs removed ({size} bytes): finished jobs' logs were over retention.logs_max_bytes"
            self.store.jobs.add_event(job.id, "logs-removed", detail, self.wall())
            log.info("retention_logs_removed", job=job.name, attempt=None, job_id=job.id, bytes=size,
                     dirs=outcome.value, logs_max_bytes=self.settings.logs_max_bytes)
        return done

    # --- what /metrics shows ------------------------------------------------------------------------

    def samples(self) -> list[tuple[str, dict[str, str], float]]:
        out: list[tuple[str, dict[str, Any], float]] = [
            ("spx_retention_removed_jobs_total", {}, self.removed_jobs),
            ("spx_retention_removed_logs_total", {}, self.logs_removed),
            ("spx_retention_removed_rejected_total", {}, self.rejected_removed),
        ]
        if self.finished_log_bytes is not None:
            out.append(("spx_retention_finished_logs_bytes", {}, self.finished_log_bytes))
        return out
