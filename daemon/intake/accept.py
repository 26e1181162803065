"""From spool file to queued job: claim, check against the host and the store, record durably.

Order matters for "loses nothing": the accepted content is copied into the root-only state dir and
fsynced (its name records the owner's uid), then the spool entry is removed, then the job row is
committed. A daemon killed before the removal finds the spool entry again on its start-up rescan;
one killed after it finds the copy without a row and records it (`recover_unrecorded`). Nothing is
queued twice and nothing is lost.
"""

from __future__ import annotations

import os
import pwd
import queue
import time
from pathlib import Path

from spx.daemon.contract.checkpoint_layout import fsync_dir
from spx.daemon.core.config import DaemonConfig
from spx.daemon.core.log import get_logger
from spx.daemon.core.spec import JobSpec, SpecError, parse_spec, root_made
from spx.daemon.intake.dependencies import dependency_problem
from spx.daemon.intake.spool import Accepted, Rejected, SpoolClaimer, SpoolWatcher
from spx.daemon.state.store import DuplicateJob, Store
from spx.daemon.userfs import as_user
from spx.daemon.userfs.fsafe import UserPathError

log = get_logger()

# Intake runs on the main loop: an access check that outlives this (a hung mount in the user's
# tree) rejects the job instead of stalling the daemon.
ACCESS_CHECK_TIMEOUT_SECONDS = 5.0


class Intake:
    def __init__(self, cfg: DaemonConfig, store: Store, wake: queue.SimpleQueue):
        self.cfg = cfg
        self.store = store
        self.watcher = SpoolWatcher(cfg.spool_dir, wake, cfg.rescan_seconds)
        self.claimer = SpoolClaimer(cfg.spool_dir, cfg.submit_group)
        self.jobs_dir = cfg.state_dir / "jobs"
        self.jobs_dir.mkdir(parents=True, exist_ok=True)

    def start(self) -> None:
        self.recover_unrecorded()
        self.watcher.start()

    def stop(self) -> None:
        self.watcher.stop()
        self.claimer.close()

    def claim_due(self, now_mono: float) -> None:
        for name in self.watcher.due_names(now_mono):
            try:
                self.take(name)
            except Exception as e:  # a bad file must never take the daemon down
                log.exception("claim_failed", spool_file=name, error=repr(e))
                try:
                    self.claimer.reject(Rejected(name, f"internal error while claiming: {e!r}", None))
                except Exception as again:
                    log.exception("reject_failed", spool_file=name, error=repr(again))

    def take(self, name: str) -> None:
        result = self.claimer.claim(name)
        if result is None:
            return
        if isinstance(result, Accepted):
            result = self._accept(result)
        if isinstance(result, Rejected):
            error_file = self.claimer.reject(result)
            log.warning("job_rejected", spool_file=name, reason=result.reason, error_file=str(error_file))

    def _accept(self, acc: Accepted) -> Rejected | None:
        spec = acc.spec.with_checkpoint_dir(self.cfg.checkpoints_root, acc.owner, acc.owner_uid)
        problem = self.access_problem(spec, acc.owner_uid)
        if problem:
            return Rejected(acc.name, problem, acc.owner_uid)
        live = self.store.job_by_name(spec.name)
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
        copy = self.jobs_dir / f"{spec.name}.{acc.owner_uid}.{time.time_ns()}.yaml"
        fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(acc.text)
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(self.jobs_dir)
        self.claimer.remove(acc.name)
        self._record(spec, acc.owner_uid, acc.owner, copy, acc.name)
        return None

    def access_problem(self, spec: JobSpec, uid: int) -> str | None:
        """What the owner cannot do that the job needs, decided by the kernel for the owner — a
        process with their uid, gid and supplementary groups (`as_user`) — never guessed by root:
        enter the workdir, read the script (and DeepSpeed config) there, read the staging source,
        write (or create) the staging target and the checkpoint dir. An existing checkpoint dir must
        be theirs, root's jobs included (else a reused job name would resume from another user's
        checkpoints); below checkpoints_root, the daemon makes `OWNER` (or a one-component dir)
        for them, and an existing one must be theirs too."""
        try:
            user = as_user.owner(uid)
        except UserPathError as e:
            return e.strerror
        ckpt_dir = spec.checkpoint_dir(self.cfg.checkpoints_root)
        checks: list[tuple[str, str, str]] = [
            ("checkpoints.dir", str(ckpt_dir), "owned"),
            ("workdir", str(spec.workdir or user.home), "enter-dir"),
        ]
        below_root = root_made(self.cfg.checkpoints_root, ckpt_dir, user.name, user.uid)
        if below_root is not None and below_root != ckpt_dir:
            checks.append(("checkpoints.dir", str(below_root), "owned"))
        workdir = spec.workdir or Path(user.home)
        if spec.script:  # relative to the workdir, as the launch runs it
            checks.append(("script", str(workdir / spec.script), "read-file"))
        if spec.deepspeed_config:
            checks.append(("deepspeed_config", str(workdir / spec.deepspeed_config), "read-file"))
        if below_root is None:
            checks.append(("checkpoints.dir", str(ckpt_dir), "write-or-create"))
        if spec.data.stage is not None:
            checks.append(("data.stage.from", str(spec.data.stage.source), "read-tree"))
            checks.append(("data.stage.to", str(spec.data.stage.to), "write-or-create"))
        try:
            problems = as_user.check_access(user, [(path, what) for _f, path, what in checks],
                                            ACCESS_CHECK_TIMEOUT_SECONDS)
        except UserPathError as e:
            return f"cannot check access as {user.name}: {e.strerror}"
        for (field, _path, _what), problem in zip(checks, problems, strict=True):
            if problem:
                return f"{field}: {problem} (checked as {user.name})"
        return None

    def _record(self, spec: JobSpec, uid: int, owner: str, copy: Path, spool_name: str) -> None:
        try:
            job_id = self.store.add_job(spec, uid, owner, str(copy), time.time())
        except DuplicateJob:
            # Only reachable in recovery: the name was taken meanwhile. Keep the file for the user.
            self.claimer.reject(Rejected(spool_name, f"name: a job named {spec.name!r} is already live", uid))
            copy.unlink(missing_ok=True)
            return
        log.info("job_queued", job=spec.name, job_id=job_id, owner=owner, spool_file=spool_name,
                 gpus=spec.gpus, launcher=spec.launcher)

    def recover_unrecorded(self) -> None:
        """Copies taken out of the spool by a daemon that died before recording them."""
        known = self.store.spec_files_known()
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

