"""`spx adopt DIR` and `adopt_checkpoint_roots`: queue the jobs a lost host left on a checkpoint volume.

    spx adopt /checkpoints          # root; asks the daemon over its control socket (op "adopt")

For each record `adopt_scan` finds (owner = the file's owner, checked there), in order:
- a job this daemon already has (same uid in its store): nothing to do — so adopting twice, or a
  rescan of the configured roots, queues nothing twice;
- a job whose `.spx/state` says it ended (succeeded, failed, cancelled): never run again;
- a job whose lease another host holds and has not let expire: that host runs it;
- otherwise the owner's rights are checked as at intake (submit_group, workdir, script, checkpoint
  dir — as the owner), the lease is taken as the owner (`spx_dir.claim`: one of two daemons racing
  wins), and the job is queued with its uid and submission time, its `checkpoints.dir` set to where
  the record was found on this host. The normal start then resumes it from its latest complete
  checkpoint.

The slow part (the walk, one helper process per job as its owner) runs on the caller's thread (a
control-socket client, or this module's own thread for the configured roots); only the store writes
go to the main loop (`drain`), the store's one writer.
"""

from __future__ import annotations

import collections
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from spx.daemon.core.config import DaemonConfig
from spx.daemon.core.log import get_logger
from spx.daemon.core.spec import JobSpec
from spx.daemon.intake import accepted_copy, job_record
from spx.daemon.intake.accept import Intake
from spx.daemon.intake.access import access_problem
from spx.daemon.intake.adopt_scan import Found, Refused, scan
from spx.daemon.state.jobs_table import DuplicateJob
from spx.daemon.state.store import Store
from spx.daemon.userfs import as_user
from spx.daemon.userfs.fsafe import UserPathError

log = get_logger()
MAIN_LOOP_SECONDS = 60.0  # for the main loop to record a batch (it turns at least once a second)
CLAIM_TIMEOUT_SECONDS = 10.0


@dataclass
class _Batch:
    """Jobs whose lease this daemon took, for the main loop to queue; `results` and `done` are its answer."""

    jobs: list[tuple[Found, JobSpec]]
    results: list[dict[str, Any]] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)


class Adopter:
    def __init__(self, cfg: DaemonConfig, store: Store, intake: Intake, wake: Callable[[], None]):
        self.cfg = cfg
        self.store = store
        self.intake = intake
        self.wake = wake
        self.host = job_record.host_id(cfg.state_dir)
        self._batches: queue.SimpleQueue[_Batch] = queue.SimpleQueue()
        self._one_at_a_time = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    # --- requests (their own threads) --------------------------------------------------------------

    def request(self, path: str | None, uid: int) -> dict:
        """The control op "adopt" (root only): adopt what `path` holds; one result per record found."""
        if uid != 0:
            return {"ok": False, "error": "only root may adopt jobs (spx adopt runs them as their owners)", "code": 1}
        if not path or not os.path.isabs(path):
            return {"ok": False, "error": "spx adopt needs an absolute directory", "code": 2}
        try:
            return {"ok": True, "result": self.adopt(Path(path), "spx adopt")}
        except OSError as e:
            return {"ok": False, "error": f"cannot scan {path}: {e.strerror or e}", "code": 1}

    def adopt(self, root: Path, by: str) -> list[dict[str, Any]]:
        """Scan `root` and queue what may be adopted (see the module doc). One dict per record:
        {"dir", "name"?, "result": queued|known|ended|held|refused, "detail"}."""
        with self._one_at_a_time:  # two requests at once: the second sees the first's jobs as known
            results: list[dict[str, Any]] = []
            take: list[tuple[Found, JobSpec]] = []
            for found in scan(root):
                decision = self._decide(found)
                if isinstance(decision, dict):
                    results.append(decision)
                else:
                    take.append(decision)
            if take:
                results.extend(self._queue(take))
        for r in results:
            if r["result"] in ("queued", "refused"):
                (log.info if r["result"] == "queued" else log.warning)(
                    "job_adopted" if r["result"] == "queued" else "job_not_adopted", job=r.get("name"), attempt=None,
                    dir=r["dir"], detail=r["detail"], by=by)
        # Debug only: every scan, also one that queued nothing (the records it saw, by result).
        log.debug("adopt_scanned", job=None, attempt=None, root=str(root), by=by,
                  results=dict(collections.Counter(r["result"] for r in results)))
        return results

    def _decide(self, found: Found | Refused) -> dict[str, Any] | tuple[Found, JobSpec]:
        if isinstance(found, Refused):
            return {"dir": str(found.dir), "result": "refused", "detail": found.why}
        rec, now = found.record, time.time()
        base = {"dir": str(found.dir), "name": rec.name, "uid": rec.uid}
        known = self.store.jobs.by_uid(rec.uid)
        if known is not None:
            return {**base, "result": "known", "detail": f"already here as job {known.id} ({known.state.value})"}
        if found.ended is not None:
            return {**base, "result": "ended", "detail": f"it {found.ended}; not run again"}
        lease = found.lease
        if lease is not None and lease["host"] != self.host and float(lease["expires"]) > now:
            return {**base, "result": "held", "detail": _held(lease)}
        spec = found.record.spec
        spec = spec.model_copy(update={"checkpoints": spec.checkpoints.model_copy(update={"dir": found.dir})})
        problem = (self.intake.claimer.owner_allowed(found.owner_uid)
                   or access_problem(self.cfg.checkpoints_root, spec, found.owner_uid))
        if problem:
            return {**base, "result": "refused", "detail": problem}
        try:
            reply = as_user.run(as_user.owner(found.owner_uid), "spx_claim", {
                "dir": str(found.dir), "now": now,
                "lease": job_record.lease_doc(self.host, rec.uid, self.cfg.adopt_lease_seconds, now)},
                CLAIM_TIMEOUT_SECONDS)
        except UserPathError as e:
            return {**base, "result": "refused", "detail": f"cannot take its lease: {e.strerror}"}
        if not reply.get("held"):
            holder = reply.get("holder")
            return {**base, "result": "held", "detail": _held(holder) if holder else str(reply.get("why"))}
        return found, spec

    def _queue(self, take: list[tuple[Found, JobSpec]]) -> list[dict[str, Any]]:
        batch = _Batch(take)
        self._batches.put(batch)
        self.wake()
        deadline = time.monotonic() + MAIN_LOOP_SECONDS
        while not batch.done.wait(0.2):
            if self._stopping.is_set() or time.monotonic() > deadline:
                return [{"dir": str(f.dir), "name": f.record.name, "uid": f.record.uid, "result": "refused",
                         "detail": "the daemon did not record it in time (stopping or busy); its lease expires "
                                   f"within {self.cfg.adopt_lease_seconds:g} s"} for f, _s in take]
        return batch.results

    # --- the main loop ---------------------------------------------------------------------------

    def drain(self) -> None:
        """On the main loop: queue the jobs of every batch waiting (store writes happen only here)."""
        while True:
            try:
                batch = self._batches.get_nowait()
            except queue.Empty:
                return
            try:
                for f, spec in batch.jobs:
                    try:
                        batch.results.append(self._record(f, spec))
                    except Exception as e:  # a full disk, a refusing store: this job is not adopted now
                        batch.results.append({"dir": str(f.dir), "name": f.record.name, "uid": f.record.uid,
                                              "result": "refused", "detail": f"cannot record it: {type(e).__name__}: {e}"})
            finally:
                batch.done.set()

    def _record(self, found: Found, spec: JobSpec) -> dict[str, Any]:
        rec = found.record
        base = {"dir": str(found.dir), "name": rec.name, "uid": rec.uid}
        known = self.store.jobs.by_uid(rec.uid)
        if known is not None:
            return {**base, "result": "known", "detail": f"already here as job {known.id} ({known.state.value})"}
        # Kept as intake keeps a spool file (root-only state dir), under a name intake's recovery of
        # unrecorded spool copies does not take.
        text = (f"# adopted from {found.dir}/.spx/job.yaml (uid {rec.uid}, written by {rec.host})\n"
                + yaml.safe_dump(spec.model_dump(mode="json", by_alias=True), sort_keys=False))
        copy = accepted_copy.keep(self.intake.jobs_dir, rec.name, found.owner_uid, text, suffix="adopted")
        try:
            job_id = self.store.jobs.add(spec, found.owner_uid, found.owner, str(copy), time.time(), uid=rec.uid,
                                        submitted=rec.submitted, event=f"adopted from {found.dir} (ran on {rec.host})")
        except DuplicateJob:
            copy.unlink(missing_ok=True)
            return {**base, "result": "refused", "detail": f"a live job named {rec.name!r} exists here; cancel it "
                                                           "or let it end, then adopt again"}
        return {**base, "result": "queued", "detail": f"queued as job {job_id} for {found.owner}; resumes from "
                                                      f"the latest complete checkpoint in {found.dir}"}

    # --- the configured roots --------------------------------------------------------------------

    def start(self) -> None:
        """Scan `adopt_checkpoint_roots` now and every `adopt_lease_seconds` (a lost host's leases
        may not have expired yet when this one starts), on a thread of its own."""
        if self.cfg.adopt_checkpoint_roots:
            self._thread = threading.Thread(target=self._watch_roots, name="spx-adopt", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=MAIN_LOOP_SECONDS)
        while True:  # a batch no loop will drain: answer it
            try:
                self._batches.get_nowait().done.set()
            except queue.Empty:
                return

    def _watch_roots(self) -> None:
        while not self._stopping.is_set():
            for root in self.cfg.adopt_checkpoint_roots:
                try:
                    self.adopt(root, "adopt_checkpoint_roots")
                except Exception as e:  # noqa: BLE001 — a bad volume must not end the watch
                    log.error("adopt_scan_failed", job=None, attempt=None, root=str(root), error=f"{type(e).__name__}: {e}")
            self._stopping.wait(self.cfg.adopt_lease_seconds)


def _held(lease: dict[str, Any]) -> str:
    if lease.get("ended"):
        return f"it {str(lease['ended'])[:32]} on {str(lease.get('label') or lease.get('host'))[:200]}; not run again"
    return f"running on {lease.get('host')} (its lease lasts until {job_record.lease_until(lease)} unless renewed)"
