"""Every file the daemon touches for one attempt, made safe (docs/security.md, "What root does with user
paths, and how").

Where each lives and who makes it:

- `log/NAME/` — root's (0755, never the user's: a user who could write there could plant a link at
  the next `attempt-N.log`). Marked with `.job-id` (root's, 0600); a reused name moves the earlier
  job's directory aside as `NAME.job-<id>`. Anything at `log/NAME` that root did not make is moved
  aside, not used.
- `log/NAME/attempt-N.log` (and its rotated `.1`) — created by root in that directory with
  O_EXCL|O_NOFOLLOW on its fd, fchown'd to the owner (who reads it with `spx logs`), readable by them
  alone (0600) or, with the config's `log_group`, by that group too (0640): `core.users.log_access`.
  `attempt-N.exit` (attempt_monitor.py) is root's alone (0600): only the daemon reads it.
- `log/NAME/attempt-N.ranks/` (torchrun's --log-dir, 0700, or 0750 with `log_group`) and
  `run/jobs/ID-NAME/` (the heartbeat's directory) — made by root inside those root-only parents and
  handed to the owner with fchown on the fd: the owner cannot create anything in the parent, so
  nothing there is theirs to swap.
- the checkpoint dir — in the user's tree: created and checked *as the user* (`as_user`), so root
  never mkdirs or chowns through a path the user can rearrange. Below `checkpoints_root` (root's),
  root makes the one component the user cannot — `checkpoints_root/OWNER` of the default
  `checkpoints_root/OWNER/NAME`, or the one-component `checkpoints_root/NAME` of a job accepted
  before defaults were per owner — and gives it away; one that exists must be the owner's.
- the heartbeat and the log tail are read through `fsafe` (no link, no FIFO, capped).

Every failure is a `UserPathError` whose message is the job's reason.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from spx.daemon.contract.checkpoint_layout import CheckpointRef
from spx.daemon.contract.worker_env import Heartbeat
from spx.daemon.core import bounded
from spx.daemon.core.config import DaemonConfig
from spx.daemon.core.log import get_logger
from spx.daemon.core.spec import root_made
from spx.daemon.core.users import LogAccess, log_access
from spx.daemon.intake import job_record
from spx.daemon.run import local_tier
from spx.daemon.state import jobviews
from spx.daemon.state.jobs_table import JobRow
from spx.daemon.userfs import as_user, fsafe
from spx.daemon.userfs import heartbeat as heartbeat_reader
from spx.daemon.userfs.fsafe import UserPathError

log = get_logger()

__all__ = ["AttemptFiles", "LeaseTaken", "UserPathError", "job_log_dir_fd", "latest_checkpoint", "note", "open_log_dir",
           "paths", "prepare", "read_marker", "remove_attempt_logs", "read_heartbeat", "read_log_tail", "staging_log"]

# Held while an entry of log_dir is renamed or made (a reused name's dir set aside, the job's own
# made), and by retention while it takes a finished job's dir away (run/retention_files.py): lanes of
# different owners do both, and neither may move the directory the other just checked.
LOG_DIRS = threading.Lock()
MARKER = ".job-id"
MARKER_MAX_BYTES = 64
LOG_DIR_MODE = 0o755
MARKER_MODE = 0o600  # the daemon's alone: it reads the marker, nobody else needs to


@dataclass(frozen=True)
class AttemptFiles:
    log_dir: Path          # cfg.log_dir / job.name — created and owned by ROOT (0755), never the user's
    log_name: str          # f"attempt-{number}.log"
    rank_log_dir: Path     # log_dir / f"attempt-{number}.ranks" — the owner's (torchrun --log-dir)
    heartbeat_file: Path   # jobviews.heartbeat_path(cfg.run_dir, job); its parent dir is the owner's
    checkpoint_dir: Path   # job.spec.checkpoint_dir(cfg.checkpoints_root); created as the owner if missing
    readers: LogAccess = LogAccess()  # who the log files are handed to, and who else reads them
    local_checkpoint_dir: Path | None = None  # local_tier: host RAM, the owner's (None: the tier is off)
    fence: int | None = None  # the generation of the job's `.spx/lease` taken for this attempt (SPX_FENCE)

    @property
    def log_file(self) -> Path:
        return self.log_dir / self.log_name


def paths(cfg: DaemonConfig, job: JobRow, number: int) -> AttemptFiles:
    """Where attempt `number`'s files are; creates nothing (an adopted attempt's files exist)."""
    log_dir = cfg.log_dir / job.name
    return AttemptFiles(
        log_dir=log_dir,
        log_name=attempt_log_names(number)[0],
        rank_log_dir=log_dir / f"attempt-{number}.ranks",
        heartbeat_file=jobviews.heartbeat_path(cfg.run_dir, job),
        checkpoint_dir=job.spec.checkpoint_dir(cfg.checkpoints_root),
        readers=log_access(job.owner_uid, cfg.log_group),
        local_checkpoint_dir=local_tier.path(cfg, job),
    )


def attempt_log_names(number: int) -> tuple[str, ...]:
    """The files attempt `number` has in its job's log dir: its log, the log's rotated part, its
    exit record (attempt_monitor.py)."""
    return f"attempt-{number}.log", f"attempt-{number}.log.1", f"attempt-{number}.exit"


def remove_attempt_logs(cfg: DaemonConfig, job: JobRow, number: int) -> None:
    """Remove what attempt `number` left in its job's root-owned log dir (by the dir's fd): for a
    standby launcher that never became its attempt, whose import may have written a line."""
    try:
        fd = open_log_dir(paths(cfg, job, number))
    except OSError:  # no log dir: nothing to remove
        return
    try:
        for name in attempt_log_names(number):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=fd)
    finally:
        os.close(fd)


def prepare(cfg: DaemonConfig, job: JobRow, number: int) -> AttemptFiles:
    """Create or verify everything attempt `number` needs (see the module doc). Raises
    UserPathError with the reason — also when the owner has no account any more."""
    user = as_user.owner(job.owner_uid)
    files = paths(cfg, job, number)
    log_fd = job_log_dir_fd(cfg, job)
    try:
        os.close(fsafe.ensure_owned_dir_at(log_fd, files.rank_log_dir.name, files.readers.dir_mode, user.uid,
                                           files.readers.gid))
    finally:
        os.close(log_fd)
    jobs_fd = fsafe.open_root_dir(files.heartbeat_file.parent.parent, 0o755)
    try:
        os.close(fsafe.ensure_owned_dir_at(jobs_fd, files.heartbeat_file.parent.name, 0o755, user.uid, user.gid))
    finally:
        os.close(jobs_fd)
    _prepare_checkpoint_dir(cfg, user, files.checkpoint_dir)
    if job.spec.replay is not None:
        # A replay reads the checkpoints of the job it verifies and writes none: it takes no lease
        # in that job's dir (it would fence that job's saves, or be refused as "in use") and needs
        # no host-local tier.
        return files
    fence = _publish_record(cfg, user, job, files.checkpoint_dir)
    return replace(files, local_checkpoint_dir=local_tier.prepare(cfg, job, user.uid, user.gid), fence=fence)


class LeaseTaken(UserPathError):
    """Another host holds this very job's lease: it adopted the job, which lives on there."""

    def __init__(self, holder: str, why: str) -> None:
        super().__init__(errno.EBUSY, why)
        self.holder = holder


def _publish_record(cfg: DaemonConfig, user: as_user.Owner, job: JobRow, ckpt_dir: Path) -> int | None:
    """Host loss: take the job's lease and write `.spx/job.yaml` in its checkpoint dir, as the owner
    (intake/job_record.py); the lease's new generation is the attempt's fencing token (SPX_FENCE).
    A lease another live daemon holds means that daemon runs a job in this dir now: this attempt does
    not start — LeaseTaken when it runs this job (it adopted it), else the dir is in use.
    Not for a job across hosts: every host's daemon runs it in this dir (docs/multinode.md)."""
    if not job.uid or job.spec.nodes.count > 1:
        return None
    host, now = job_record.host_id(cfg.state_dir), time.time()
    lease = job_record.lease_doc(host, job.uid, cfg.adopt_lease_seconds, now, job_record.host_label(cfg.state_dir))
    reply = as_user.run(user, "spx_publish", {"dir": str(ckpt_dir), "record": job_record.render(job, host), "now": now,
                                              "lease": lease}, session=True)
    if not isinstance(reply, dict):
        raise UserPathError(errno.EIO, f"taking the lease in {ckpt_dir} gave an odd answer")
    if reply.get("held"):
        gen = reply.get("gen")
        return gen if isinstance(gen, int) and not isinstance(gen, bool) else None
    holder = reply.get("holder") or {}
    label = str(holder.get("label") or holder.get("host"))[:300]
    until = job_record.lease_until(holder)
    if holder.get("ended"):
        raise LeaseTaken(label, f"this job ended on {label} ({holder['ended']}), which had taken it over")
    if holder.get("job") == job.uid:
        raise LeaseTaken(label, f"this job runs on {label} now (its lease lasts until {until})")
    raise UserPathError(errno.EBUSY, f"checkpoint dir {ckpt_dir} is in use: job {holder.get('job')} runs on {label} "
                                     f"(its lease lasts until {until})")


def staging_log(cfg: DaemonConfig, job: JobRow) -> Path:
    """`log/NAME/staging.log`, its root-owned directory made ready (as for an attempt)."""
    os.close(job_log_dir_fd(cfg, job))
    return cfg.log_dir / job.name / "staging.log"


def job_log_dir_fd(cfg: DaemonConfig, job: JobRow) -> int:
    """fd of the root-owned `log/NAME` of this job, the earlier job of a reused name moved aside."""
    base = fsafe.open_trusted_dir(cfg.log_dir)  # the admin's choice (mode and all); made at start
    try:
        with LOG_DIRS:
            _retire_other_job(base, job)
            fd = fsafe.ensure_root_dir_at(base, job.name, LOG_DIR_MODE)
    finally:
        os.close(base)
    try:
        if read_marker(fd) != job.id:
            try:
                mfd = fsafe.create_excl(fd, MARKER, MARKER_MODE)
            except FileExistsError:  # an odd marker in our own directory: replace it
                os.unlink(MARKER, dir_fd=fd)
                mfd = fsafe.create_excl(fd, MARKER, MARKER_MODE)
            try:
                fsafe.write_all(mfd, f"{job.id}\n".encode())
            finally:
                os.close(mfd)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_marker(dir_fd: int) -> int | None:
    """The job id in `.job-id`, or None if absent, odd, too large, a link or not a file."""
    try:
        return bounded.whole_text(fsafe.read_at(dir_fd, MARKER, MARKER_MAX_BYTES), MARKER, 1)
    except (OSError, bounded.Garbage):
        return None


def _retire_other_job(base_fd: int, job: JobRow) -> None:
    """A `log/NAME` that holds another job's logs (a reused name) moves to `NAME.job-<id>`
    (`NAME.job-unknown-<ns>` when its marker is odd). One without a marker is this job's (made
    just before a crash). Untrusted entries are left to `ensure_root_dir_at` to move aside."""
    try:
        fd = fsafe.open_dir_at(base_fd, job.name)
    except OSError:
        return
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            return
        try:
            os.stat(MARKER, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        old = read_marker(fd)
    finally:
        os.close(fd)
    if old == job.id:
        return
    stem = f"{job.name}.job-{old}" if old is not None else f"{job.name}.job-unknown-{time.time_ns()}"
    target, n = stem, 1
    while fsafe.lexists_at(base_fd, target):
        target, n = f"{stem}.{n}", n + 1
    os.rename(job.name, target, src_dir_fd=base_fd, dst_dir_fd=base_fd)
    log.info("log_dir_retired", job=job.name, attempt=None, moved_to=target, earlier_job_id=old)



def _prepare_checkpoint_dir(cfg: DaemonConfig, user: as_user.Owner, ckpt_dir: Path) -> None:
    """The checkpoint dir exists and the owner can write it — decided as the owner. Below
    checkpoints_root (root's), root makes the one directory the owner cannot (`OWNER`, or a
    one-component dir of a job from before per-owner dirs) and gives it to them."""
    below = root_made(cfg.checkpoints_root, ckpt_dir, user.name, user.uid)
    if below is not None:
        root_fd = fsafe.open_trusted_dir(cfg.checkpoints_root)
        try:
            _owned_dir_below_root(root_fd, below, user, job_dir=below == ckpt_dir)
        finally:
            os.close(root_fd)
        if below == ckpt_dir:
            (problem,) = as_user.check_access(user, [(str(ckpt_dir), "write-or-create")], session=True)
            if problem:
                raise UserPathError(errno.EACCES, f"checkpoint dir: {problem} (as {user.name})")
            return
    as_user.mkdirs(user, [str(ckpt_dir)], 0o750, session=True)


def _owned_dir_below_root(root_fd: int, path: Path, user: as_user.Owner, job_dir: bool) -> None:
    """`checkpoints_root/X`: made by root in its own directory and given to the owner; an existing
    one must be a real directory of the owner's — root's own jobs included: no job resumes from, or
    sets aside files in, a directory another user made first. `checkpoints_root/OWNER` must not be
    itself an earlier job's checkpoint dir (one named like its owner, from before per-owner dirs):
    the jobs below it would be hidden from `spx adopt`'s scan, which stops at a `.spx/`."""
    name = path.name
    try:
        os.mkdir(name, 0o750, dir_fd=root_fd)
        created = True
    except FileExistsError:
        created = False
    fd = fsafe.open_dir_at(root_fd, name)
    try:
        st = os.fstat(fd)
        if created and st.st_uid == os.geteuid():
            os.fchown(fd, user.uid, user.gid)
        elif st.st_uid != user.uid:
            raise UserPathError(errno.EPERM, f"checkpoint dir {path} belongs to uid {st.st_uid}, not to {user.name}: "
                                             "another user made it first; refused (give the job its own "
                                             "checkpoints.dir, or have the admin move that directory)")
        if not job_dir and fsafe.lexists_at(fd, ".spx"):
            raise UserPathError(errno.EEXIST, f"{path} is the checkpoint dir of an earlier job named "
                                              f"{name!r} (it holds .spx/), not a directory for {user.name}'s jobs; "
                                              f"move its content into {path}/{name}")
    finally:
        os.close(fd)


def open_log_dir(files: AttemptFiles) -> int:
    """O_DIRECTORY|O_NOFOLLOW fd of `files.log_dir`, verified root-owned; the caller closes it."""
    base = fsafe.open_trusted_dir(files.log_dir.parent)
    try:
        fd = fsafe.open_dir_at(base, files.log_dir.name)
    finally:
        os.close(base)
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        os.close(fd)
        raise UserPathError(errno.EPERM, f"{files.log_dir} is not the daemon's own directory")
    return fd


def note(files: AttemptFiles, text: str) -> None:
    """Append "spx: <text>" to the attempt log (created for its readers if missing); a failure is
    a warning in the daemon's log, never an exception."""
    try:
        fd = open_log_dir(files)
        try:
            lfd = fsafe.open_append(fd, files.log_name, files.readers.file_mode, files.readers.uid, files.readers.gid)
        finally:
            os.close(fd)
        try:
            fsafe.write_all(lfd, "".join(f"spx: {line}\n" for line in text.splitlines() or [""]).encode())
        finally:
            os.close(lfd)
    except OSError as e:
        log.warning("attempt_log_note_failed", job=files.log_dir.name, attempt=files.log_name, error=str(e))


def set_aside_wrong(job: JobRow, files: AttemptFiles, from_step: int, timeout: float) -> list[str]:
    """After a replay differed at `from_step`: move the job's spx.trainer checkpoints of that step and
    later (both tiers) into `.replay-differs-at-STEP/` of their dir, as the owner — never resumed from,
    kept for a person to look at. The paths they were moved to, by step."""
    user = as_user.owner(job.owner_uid)
    into = f".replay-differs-at-{from_step}"
    moved = []
    for where in (files.checkpoint_dir, files.local_checkpoint_dir):
        if where is not None:
            moved += [f"{where}/{into}/{n}" for n in sorted(as_user.set_aside(user, str(where), 0.0, into, timeout, from_step, session=True))]
    if moved:
        log.warning("checkpoints_set_aside", job=job.name, attempt=None, moved=moved, why=f"a replay differs at step {from_step}")
    return moved


def latest_checkpoint(job: JobRow, files: AttemptFiles, timeout: float,
                      exclude: dict[str, str] | None = None,
                      before_step: int | None = None) -> tuple[CheckpointRef | None, dict[str, Any]]:
    """The latest complete checkpoint not in `exclude` (path → why) and, for a divergence rollback,
    before `before_step`, found by a process running as
    the job's owner (root never walks the user's tree), after `checkpoints.resume: never` set aside
    what predates the job; `require` without one is an error (the job fails before an attempt).
    With it, discovery's whole (capped) answer: the layout, the candidates skipped and why.
    UserPathError on timeout or failure. Slow: call it off the main loop."""
    user = as_user.owner(job.owner_uid)
    resume = job.spec.checkpoints.resume
    if resume == "never":  # what an earlier job left there is not this job's to resume
        moved = as_user.set_aside(user, str(files.checkpoint_dir), job.submitted, f".before-job-{job.id}", timeout, session=True)
        if moved:
            log.info("checkpoints_set_aside", job=job.name, attempt=None, moved=moved,
                     into=str(files.checkpoint_dir / f".before-job-{job.id}"))
    local = str(files.local_checkpoint_dir) if files.local_checkpoint_dir else None
    found = as_user.find_latest(user, str(files.checkpoint_dir), job.spec.checkpoints.pattern, timeout, exclude,
                                local_dir=local, before_step=before_step, session=True)
    path, step = found.get("path"), found.get("step")
    if path is None:
        if resume == "require":
            raise UserPathError(errno.ENOENT, f"checkpoints.resume is require, but {files.checkpoint_dir} "
                                              "holds no complete checkpoint")
        return None, found
    try:
        path = bounded.text(path, "checkpoint discovery", 4096, "path")
        # The step goes into the store (resumed_from_step): a whole number SQLite and float() take.
        step = None if step is None else bounded.whole(step, "checkpoint discovery", name="step")
    except bounded.Garbage as e:
        raise UserPathError(errno.EIO, f"checkpoint discovery in {files.checkpoint_dir} gave an odd answer: "
                                       f"{e.detail}") from None
    return CheckpointRef(Path(path), step), found


def read_heartbeat(path: Path) -> Heartbeat | None:
    """The job's heartbeat, read safely (no link, no FIFO, 64 KiB cap); None if none. Never raises."""
    return heartbeat_reader.read_heartbeat(path)


def log_size(files: AttemptFiles) -> int | None:
    """The attempt log's size (its relay writes it in the root-owned log dir; not followed if a
    link), for "is the job still printing"; None if it cannot be read."""
    try:
        return os.stat(files.log_file, follow_symlinks=False).st_size
    except OSError:
        return None


def read_log_tail(files: AttemptFiles, max_bytes: int) -> bytes:
    """The last `max_bytes` of the attempt log, for root cause; b"" if unreadable. Never raises."""
    try:
        return fsafe.read_tail(files.log_file, files.log_dir.parent, max_bytes)
    except OSError:
        return b""
