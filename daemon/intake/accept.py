"""From spool file to queued job: claim, check against the host and the store, record durably.

The loop never waits on a user here: it claims at most a budget of entries per turn, fairly by owner
(claim_queue.py); the parse and the checks made as the owner (which a user can stall: a helper run as
them can be SIGSTOPped, their mount can hang) run in the owner's lane off the loop (core/lanes.py),
with a deadline from their start; only the store writes come back to the loop. An entry rewritten
while it was checked is claimed again, not taken out of the spool with its old verdict.

Order matters for "loses nothing": the accepted content is copied into the root-only state dir and
fsynced (its name records the owner's uid), then the spool entry is removed, then the job row is
committed. A daemon killed before the removal finds the spool entry again on its start-up rescan;
one killed after it finds the copy without a row and records it (`recover_unrecorded`). Nothing is
queued twice and nothing is lost.
"""

from __future__ import annotations

import dataclasses
import functools
import pwd
import queue
import time
from pathlib import Path

from spx.daemon.core.config import DaemonConfig
from spx.daemon.core.lanes import Lanes, Outcome
from spx.daemon.core.log import get_logger
from spx.daemon.core.spec import JobSpec, SpecError, parse_spec
from spx.daemon.intake import accepted_copy
from spx.daemon.intake.access import ACCESS_CHECK_TIMEOUT_SECONDS, access_problem
from spx.daemon.intake.claim_queue import ClaimQueue
from spx.daemon.intake.dependencies import dependency_problem
from spx.daemon.intake.spool import Accepted, Claimed, Rejected, SpoolClaimer, SpoolWatcher, parse_claimed
from spx.daemon.state.jobs_table import DuplicateJob
from spx.daemon.state.store import Store

log = get_logger()

CHECK_DEADLINE_SECONDS = 2 * ACCESS_CHECK_TIMEOUT_SECONDS


class Intake:
    def __init__(self, cfg: DaemonConfig, store: Store, wake: queue.SimpleQueue, lanes: Lanes):
        self.cfg = cfg
        self.store = store
        self.lanes = lanes
        self.watcher = SpoolWatcher(cfg.spool_dir, wake, cfg.rescan_seconds)
        self.claimer = SpoolClaimer(cfg.spool_dir, cfg.submit_group)
        self.claims = ClaimQueue(self.claimer.owner_of)
        self.jobs_dir = cfg.state_dir / "jobs"
        self.jobs_dir.mkdir(parents=True, exist_ok=True)

    def start(self) -> None:
        self.recover_unrecorded()
        self.watcher.start()

    def stop(self) -> None:
        self.watcher.stop()
        self.claimer.close()

    def claim_due(self, now_mono: float) -> None:
        """On the loop: this turn's share of the spool claimed; each claimed entry checked in its
        owner's lane."""
        self.claims.add(self.watcher.due_names(now_mono))
        for name in self.claims.take():
            try:
                self._claim(name)
            except Exception as e:  # a bad file must never take the daemon down
                self.claims.done(name)
                log.exception("claim_failed", spool_file=name, error=repr(e))
                self._reject(Rejected(name, f"internal error while claiming: {e!r}", None))

    def backlog(self) -> bool:
        """Names wait for a later turn's claim budget (the loop keeps turning often meanwhile)."""
        return bool(self.claims.waiting())

    def _claim(self, name: str) -> None:
        result = self.claimer.claim(name)
        if not isinstance(result, Claimed):
            self.claims.done(name)
            if result is not None:
                self._reject(result)
            return
        self.lanes.submit(result.owner_uid, "intake", functools.partial(self._check, result),
                          CHECK_DEADLINE_SECONDS, functools.partial(self._checked, result))

    def _check(self, claimed: Claimed) -> Accepted | Rejected:
        """Off the loop, in the owner's lane: parse, then what the owner cannot do that the job needs."""
        verdict = parse_claimed(claimed)
        if isinstance(verdict, Rejected):
            return verdict
        # A job without `checkpoints.dir` gets its owner's own default (checkpoints_root/OWNER/NAME).
        verdict = dataclasses.replace(verdict, spec=verdict.spec.with_checkpoint_dir(
            self.cfg.checkpoints_root, claimed.owner, claimed.owner_uid))
        problem = access_problem(self.cfg.checkpoints_root, verdict.spec, verdict.owner_uid)
        return Rejected(claimed.name, problem, claimed.owner_uid) if problem else verdict

    def _checked(self, claimed: Claimed, outcome: Outcome) -> None:
        """Back on the loop: act on the verdict, unless the entry changed (or went) meanwhile."""
        self.claims.done(claimed.name)
        if not self.claimer.unchanged(claimed):
            log.info("spool_file_changed_while_checked", spool_file=claimed.name)
            self.claims.add([claimed.name])  # claimed anew next turn, if it is still there
            return
        if outcome.overdue:
            verdict: Accepted | Rejected = Rejected(
                claimed.name, f"could not be checked in {CHECK_DEADLINE_SECONDS:.0f} s (the checks made as "
                f"{claimed.owner} did not finish: a hung mount or a stopped process in their tree?)", claimed.owner_uid)
        elif outcome.error is not None:
            verdict = Rejected(claimed.name, f"internal error while checking: {outcome.error!r}", claimed.owner_uid)
        else:
            verdict = outcome.value
        if isinstance(verdict, Accepted):
            try:
                rejected = self._accept(verdict)
            except Exception as e:  # a full disk, a refusing store: the file goes back to its owner, said why
                log.exception("accept_failed", spool_file=claimed.name, error=repr(e))
                rejected = Rejected(claimed.name, f"internal error while recording: {e!r}", claimed.owner_uid)
            if rejected is None:
                return
            verdict = rejected
        self._reject(verdict)

    def _reject(self, rejected: Rejected) -> None:
        error_file = self.claimer.reject(rejected)
        log.warning("job_rejected", spool_file=rejected.name, reason=rejected.reason, error_file=str(error_file))

    def _accept(self, acc: Accepted) -> Rejected | None:
        """On the loop: the store's checks (a live job of that name, `after:` names), then the durable
        record. Returns the rejection, or None once the job is queued."""
        spec = acc.spec
        live = self.store.jobs.by_name(spec.name)
        if live is not None and not live.state.terminal:
            return Rejected(
                acc.name,
                f"name: a job named {spec.name!r} is already {live.state.value}; cancel it "
                f"(spx cancel {spec.name}) or choose another name",
                acc.owner_uid,
            )
        problem = dependency_problem(self.store, spec, acc.owner_uid, self.cfg.admin_group)
        if problem:
            return Rejected(acc.name, problem, acc.owner_uid)
        copy = accepted_copy.keep(self.jobs_dir, spec.name, acc.owner_uid, acc.text)
        self.claimer.remove(acc.name)
        self._record(spec, acc.owner_uid, acc.owner, copy, acc.name)
        return None

    def _record(self, spec: JobSpec, uid: int, owner: str, copy: Path, spool_name: str) -> None:
        try:
            job_id = self.store.jobs.add(spec, uid, owner, str(copy), time.time())
        except DuplicateJob:
            # Only reachable in recovery: the name was taken meanwhile. Keep the file for the user.
            self.claimer.reject(Rejected(spool_name, f"name: a job named {spec.name!r} is already live", uid))
            copy.unlink(missing_ok=True)
            return
        log.info("job_queued", job=spec.name, job_id=job_id, owner=owner, spool_file=spool_name,
                 gpus=spec.gpus, launcher=spec.launcher)

    def recover_unrecorded(self) -> None:
        """Copies taken out of the spool by a daemon that died before recording them."""
        known = self.store.jobs.spec_files()
        for copy in sorted(self.jobs_dir.glob("*.yaml")):
            if str(copy) in known:
                continue
            try:
                _name, uid_text, _ns, _ext = copy.name.rsplit(".", 3)
                uid = int(uid_text)
                owner = pwd.getpwuid(uid).pw_name
                spec = parse_spec(copy.read_text()).with_checkpoint_dir(self.cfg.checkpoints_root, owner, uid)
            except (ValueError, KeyError, OSError, SpecError) as e:
                log.error("unrecorded_copy_unreadable", file=str(copy), error=str(e))
                continue
            self._record(spec, uid, owner, copy, copy.name)
