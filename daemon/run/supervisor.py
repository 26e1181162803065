"""The supervisor: launches attempts, watches them, stops them, and applies the restart policy.

Runs on the daemon's main loop thread only (it is the store's writer). Each `tick` advances every
live attempt one step — heartbeat, hang check, stop escalation, exit — and launches jobs that are
due. Decisions after an exit come from `policy.decide`; process I/O from `launcher`, `proctree` and
`cgroups`.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from spx.daemon.contract import checkpoint_layout
from spx.daemon.contract.worker_env import EXIT_PREEMPTED
from spx.daemon.run import cgroups, launcher, proctree
from spx.daemon.run.attempt import LEFTOVER_KILL_SECONDS, LiveAttempt
from spx.daemon.run.oom import oom_killed
from spx.daemon.run.policy import AttemptOutcome, decide
from spx.daemon.run.rootcause import find_root_cause
from spx.daemon.service.config import DaemonConfig
from spx.daemon.service.log import get_logger
from spx.daemon.staging.runner import StagingRun, staging_done, start_staging
from spx.daemon.state import jobviews
from spx.daemon.state.states import JobState
from spx.daemon.state.store import JobRow, Store

log = get_logger()


def _chown_dir(path: Path, uid: int, gid: int, mode: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, uid, gid)
    path.chmod(mode)


class Supervisor:
    def __init__(self, cfg: DaemonConfig, store: Store, gpu_free, clock=time.monotonic, wall=time.time,
                 cgroup_tree: cgroups.CgroupTree | None = None):
        self.cfg = cfg
        self.store = store
        self.cgroups = cgroup_tree  # None: attempts are found by tag and process group only
        self._gpu_free = gpu_free  # callable(list[int]) -> bool: no compute processes on them
        self.clock = clock
        self.wall = wall
        self.live: dict[int, LiveAttempt] = {}
        self.staging: dict[int, StagingRun] = {}
        self.last_restart: tuple[str, float, str] | None = None  # (job, wall time, reason) for STATUS

    # --- paths ----------------------------------------------------------------------------------

    def heartbeat_file(self, job: JobRow) -> Path:
        return jobviews.heartbeat_path(self.cfg.run_dir, job)

    def log_dir(self, job: JobRow) -> Path:
        return self.cfg.log_dir / job.name

    def checkpoint_dir(self, job: JobRow) -> Path:
        return job.spec.checkpoint_dir(self.cfg.checkpoints_root)

    # --- launching ------------------------------------------------------------------------------

    def launch(self, job: JobRow) -> None:
        """Start the next attempt of `job` (state starting): resolve the checkpoint to resume from,
        prepare its directories as the owner, spawn, and record it."""
        now = self.wall()
        number = len(self.store.attempts(job.id)) + 1
        attempt_id = uuid.uuid4().hex
        blog = log.bind(job=job.name, attempt=number)
        user = pwd.getpwuid(job.owner_uid)
        ckpt_dir = self.checkpoint_dir(job)
        try:
            self._prepare_dirs(job, user, ckpt_dir, number)
        except OSError as e:
            self._launch_failed(job, number, attempt_id, f"cannot prepare directories: {e}", now)
            return
        latest = checkpoint_layout.find_latest(ckpt_dir, job.spec.checkpoints.pattern)
        port = launcher.free_port()
        log_file = self.log_dir(job) / f"attempt-{number}.log"
        ctx = launcher.LaunchContext(
            attempt=number,
            attempt_id=attempt_id,
            gpus=job.gpus,
            port=port,
            checkpoint_dir=ckpt_dir,
            resume_from=latest.path if latest else None,
            heartbeat_file=self.heartbeat_file(job),
            rank_log_dir=self.log_dir(job) / f"attempt-{number}.ranks",
            home=user.pw_dir,
            user=user.pw_name,
        )
        plan = launcher.plan_launch(job.spec, ctx)
        resumed = f"resuming from {latest.path} (step {latest.step})" if latest else f"no complete checkpoint in {ckpt_dir}; starting fresh"
        with log_file.open("a") as f:
            f.write(f"spx: attempt {number} of job {job.name} at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(now))}; {resumed}\n")
            f.write(f"spx: gpus {job.gpus or 'none'}, port {port}, argv {plan.argv}\n")
        os.chown(log_file, user.pw_uid, user.pw_gid)
        row_id = self.store.start_attempt(
            job.id, number=number, attempt_id=attempt_id, now=now,
            resumed_from=str(latest.path) if latest else None,
            resumed_from_step=latest.step if latest else None, port=port,
        )
        cgroup = self._make_attempt_cgroup(job, number, attempt_id)
        try:
            log_dir_fd = os.open(log_file.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            try:
                proc = launcher.spawn(plan, job.owner_uid, log_dir_fd, log_file.name, cgroup,
                                      self.cfg.log_max_bytes).proc
            finally:
                os.close(log_dir_fd)
        except OSError as e:
            if cgroup is not None:
                cgroups.remove(cgroup)
            self._end_attempt_row(row_id, now, None, None, f"launch failed: {e}", "launch", None, None)
            self.store.transition(job.id, JobState.FAILED, f"launch failed: {e}", now, gpus=[])
            blog.error("launch_failed", error=str(e))
            return
        self.store.set_attempt_pgid(row_id, proc.pid)
        self.live[job.id] = LiveAttempt(
            job_id=job.id, name=job.name, number=number, row_id=row_id, attempt_id=attempt_id,
            proc=proc, pgid=proc.pid, started_mono=self.clock(), started_wall=now,
            grace_seconds=job.spec.stop.grace_seconds,
            hang_timeout_seconds=job.spec.restart.hang_timeout_seconds,
            heartbeat_file=ctx.heartbeat_file, log_file=log_file,
            resumed_from_step=latest.step if latest else None, cgroup=cgroup,
        )
        self.store.transition(job.id, JobState.RUNNING, resumed, now)
        blog.info("attempt_started", pid=proc.pid, gpus=job.gpus, port=port, cgroup=str(cgroup) if cgroup else None,
                  resumed_from=str(latest.path) if latest else None,
                  resumed_from_step=latest.step if latest else None)

    def _make_attempt_cgroup(self, job: JobRow, number: int, attempt_id: str) -> Path | None:
        """The attempt's own cgroup, where cgroups are managed. If it cannot be made, the attempt
        still runs, found by tag and process group only, as where cgroups are not managed."""
        if self.cgroups is None:
            return None
        cgroup = self.cgroups.attempt(job.name, number, attempt_id)
        try:
            cgroup.mkdir()
            return cgroup
        except OSError as e:
            log.warning("attempt_cgroup_failed", job=job.name, attempt=number, cgroup=str(cgroup), error=str(e))
            return None

    def _prepare_dirs(self, job: JobRow, user: pwd.struct_passwd, ckpt_dir: Path, number: int) -> None:
        """Log, heartbeat and checkpoint dirs, owned by the job's user (workers run as them).
        A reused job name keeps the earlier job's logs, moved aside."""
        ldir = self.log_dir(job)
        marker = ldir / ".job-id"
        if ldir.exists() and marker.exists() and marker.read_text().strip() != str(job.id):
            ldir.rename(ldir.with_name(f"{job.name}.job-{marker.read_text().strip()}"))
        _chown_dir(ldir, user.pw_uid, user.pw_gid, 0o750)
        marker.write_text(f"{job.id}\n")
        _chown_dir(self.heartbeat_file(job).parent, user.pw_uid, user.pw_gid, 0o755)
        if not ckpt_dir.exists():
            _chown_dir(ckpt_dir, user.pw_uid, user.pw_gid, 0o750)

    def _launch_failed(self, job: JobRow, number: int, attempt_id: str, why: str, now: float) -> None:
        row = self.store.start_attempt(job.id, number=number, attempt_id=attempt_id, now=now,
                                       resumed_from=None, resumed_from_step=None, port=None)
        self._end_attempt_row(row, now, None, None, why, "launch", None, None)
        self.store.transition(job.id, JobState.FAILED, why, now, gpus=[])
        log.error("launch_failed", job=job.name, attempt=number, error=why)

    # --- watching -------------------------------------------------------------------------------

    def tick(self) -> None:
        now = self.clock()
        for att in list(self.live.values()):
            self._advance(att, now)

    def _advance(self, att: LiveAttempt, now: float) -> None:
        att.observe_heartbeat(now)
        att.refresh_pids(now)
        if att.exited_mono is None:
            idle = att.hung_for(now)
            if idle is not None:
                log.warning("hang_detected", job=att.name, attempt=att.number, idle_seconds=round(idle, 1),
                            step=att.last_step)
                self._dump_stacks(att)
                att.hang_idle = idle
                att.begin_stop("hang", now)
            if att.launcher_exited():
                att.exited_mono = now
        if att.exited_mono is not None or att.term_sent_mono is not None:
            att.advance_stop(now)
        if att.exited_mono is not None:
            if att.all_gone():
                self._finish(att)
            elif now - att.exited_mono > LEFTOVER_KILL_SECONDS:
                log.warning("leftover_processes", job=att.name, attempt=att.number, pids=att.pids)
                att.exited_mono = now  # keep killing; never declare it over while any remain

    def _dump_stacks(self, att: LiveAttempt) -> None:
        """Worker stacks into the attempt log (py-spy, where installed), before the kill."""
        pyspy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        if not Path(pyspy).exists():
            with att.log_file.open("a") as f:
                f.write("spx: hang detected; py-spy is not installed, no stack dump\n")
            return
        with att.log_file.open("a") as f:
            for pid in att.procs.pids():
                f.write(f"spx: hang detected; stack of pid {pid}:\n")
                f.flush()
                try:
                    subprocess.run([pyspy, "dump", "--pid", str(pid)], stdout=f, stderr=subprocess.STDOUT,
                                   timeout=20, check=False)
                except subprocess.TimeoutExpired:
                    f.write(f"spx: py-spy timed out on pid {pid}\n")

    def _finish(self, att: LiveAttempt) -> None:
        """The attempt's processes are all gone: classify, decide, record."""
        del self.live[att.job_id]
        if att.cgroup is not None and not cgroups.remove(att.cgroup):
            log.warning("attempt_cgroup_not_removed", job=att.name, attempt=att.number, cgroup=str(att.cgroup))
        now = self.wall()
        job = self.store.job(att.job_id)
        code, sig = att.exit_status()
        preempted = att.beat_status == "preempted" or code == EXIT_PREEMPTED
        ran = self.clock() - att.started_mono
        progressed = att.progressed or (att.last_step is None and ran >= self.cfg.healthy_seconds)
        oom = code != 0 and att.stop_cause is None and oom_killed(att.seen_pids)
        outcome = AttemptOutcome(
            exit_code=code, signal=sig, preempted=preempted, oom=oom, stop_cause=att.stop_cause,
            hang_seconds=att.hang_idle, progressed=progressed, ran_seconds=ran,
        )
        decision = decide(outcome, job.spec.restart, att.number, job.backoff_level,
                          job.no_progress_streak, self.cfg.healthy_seconds)
        root = None if code == 0 else find_root_cause(att.log_file)
        self._end_attempt_row(att.row_id, now, code, sig, decision.reason, decision.reason_class,
                              att.last_step, root)
        fields: dict = {"backoff_level": decision.backoff_level, "no_progress_streak": decision.no_progress_streak}
        if decision.state is JobState.RESTARTING:
            fields["next_start_at"] = now + decision.delay_seconds
            if att.stop_cause not in ("daemon-stop", "daemon-restart"):
                self.last_restart = (job.name, now, decision.reason_class or "")
        else:
            fields["gpus"] = []
        self.store.transition(job.id, decision.state, decision.reason, now, **fields)
        log.info("attempt_ended", job=job.name, attempt=att.number, exit_code=code,
                 signal=proctree.signal_name(sig) if sig else None, reason=decision.reason,
                 next_state=decision.state.value, delay_seconds=decision.delay_seconds,
                 last_step=att.last_step, root_cause=root)

    def _end_attempt_row(self, row, now, code, sig, reason, cls, max_step, root) -> None:
        self.store.end_attempt(row, end=now, exit_code=code, signal=sig, reason=reason,
                               reason_class=cls, max_step=max_step, root_cause=root)

    # --- due launches ---------------------------------------------------------------------------

    def start_due(self, job: JobRow) -> None:
        """Launch a starting job, or a restarting one whose backoff is over and whose GPUs show no
        compute processes any more."""
        if job.id in self.live:
            return
        now = self.wall()
        if job.state is JobState.RESTARTING:
            if job.next_start_at is not None and now < job.next_start_at:
                return
            if job.gpus and not self._gpu_free(job.gpus):
                return
            self.store.transition(job.id, JobState.STARTING, "relaunching", now)
            job = self.store.job(job.id)
        if job.state is JobState.STARTING:
            if job.spec.data.stage is not None and not staging_done(job.staging):
                self._advance_staging(job)
            else:
                self.launch(job)

    def _advance_staging(self, job: JobRow) -> None:
        """Before the first attempt: copy the working set to local disk as the job's user."""
        run = self.staging.get(job.id)
        stage = job.spec.data.stage
        assert stage is not None
        if run is None:
            user = pwd.getpwuid(job.owner_uid)
            ldir = self.log_dir(job)
            _chown_dir(ldir, user.pw_uid, user.pw_gid, 0o750)
            run = self.staging[job.id] = start_staging(job.id, stage.source, stage.to, job.owner_uid,
                                                       ldir / "staging.log")
            log.info("staging_started", job=job.name, source=str(stage.source), to=str(stage.to))
        exited = run.poll()
        now = self.wall()
        if run.text() != job.staging:
            self.store.update_job(job.id, now, staging=run.text())
        if not exited:
            return
        del self.staging[job.id]
        if run.proc.stdout is not None:
            run.proc.stdout.close()
        if run.succeeded:
            log.info("staging_done", job=job.name, detail=run.text())
            self.launch(self.store.job(job.id))
        else:
            why = run.text() if run.text().startswith("staging failed") else f"staging failed: copier exited {run.proc.returncode}"
            self.store.transition(job.id, JobState.FAILED, why, now, gpus=[])
            log.error("staging_failed", job=job.name, reason=why)

    # --- stopping -------------------------------------------------------------------------------

    def cancel(self, job: JobRow, by: str) -> str:
        """Cancel: a job without processes ends at once; a live attempt gets its grace period."""
        now = self.wall()
        att = self.live.get(job.id)
        if att is not None:
            att.begin_stop("cancel", self.clock())
            log.info("cancel_requested", job=job.name, attempt=att.number, by=by)
            return f"cancelling {job.name}: SIGTERM sent, {att.grace_seconds:.0f} s grace to checkpoint"
        self._stop_staging(job.id)
        self.store.transition(job.id, JobState.CANCELLED, f"cancelled by {by}", now, gpus=[])
        log.info("cancelled", job=job.name, by=by)
        return f"cancelled {job.name}"

    def _stop_staging(self, job_id: int) -> None:
        """Staging is resumable, so stopping it is just a kill; the next start continues it."""
        run = self.staging.pop(job_id, None)
        if run is not None:
            try:
                os.killpg(run.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            run.proc.wait()
            if run.proc.stdout is not None:
                run.proc.stdout.close()

    def stop_all(self) -> float:
        """Daemon shutdown: every attempt gets SIGTERM and its grace. Returns the longest grace."""
        for job_id in list(self.staging):
            self._stop_staging(job_id)
        now = self.clock()
        for att in self.live.values():
            att.begin_stop("daemon-stop", now)
        return max((a.grace_seconds for a in self.live.values()), default=0.0)

    # --- recovery -------------------------------------------------------------------------------

    def adopt_after_restart(self, job: JobRow) -> None:
        """A job that was live when the daemon died: its open attempt (if any) is stopped —
        SIGTERM, grace, SIGKILL, as for any stop — and then relaunched from its checkpoint."""
        open_att = self.store.open_attempt(job.id)
        now = self.wall()
        if open_att is None:
            if job.state is JobState.RUNNING:
                self.store.transition(job.id, JobState.RESTARTING, "daemon restarted", now, next_start_at=now)
            return
        att = LiveAttempt(
            job_id=job.id, name=job.name, number=open_att.number, row_id=open_att.id,
            attempt_id=open_att.attempt_id, proc=None, pgid=open_att.pgid,
            started_mono=self.clock(), started_wall=open_att.start,
            grace_seconds=job.spec.stop.grace_seconds,
            hang_timeout_seconds=job.spec.restart.hang_timeout_seconds,
            heartbeat_file=self.heartbeat_file(job),
            log_file=self.log_dir(job) / f"attempt-{open_att.number}.log",
            resumed_from_step=open_att.resumed_from_step,
            cgroup=self._old_attempt_cgroup(job.name, open_att.number, open_att.attempt_id),
        )
        if job.state is JobState.STARTING:
            self.store.transition(job.id, JobState.RUNNING, "adopted after daemon restart", now)
        att.begin_stop("daemon-restart", self.clock())
        self.live[job.id] = att
        log.info("adopted_after_restart", job=job.name, attempt=att.number, pids=att.procs.pids(),
                 cgroup=str(att.cgroup) if att.cgroup else None)

    def _old_attempt_cgroup(self, name: str, number: int, attempt_id: str) -> Path | None:
        """The cgroup a previous daemon made for this attempt, derived from the store's row."""
        if self.cgroups is None:
            return None
        cgroup = self.cgroups.attempt(name, number, attempt_id)
        return cgroup if cgroup.is_dir() else None

    def sweep_cgroups(self) -> None:
        """Attempt cgroups of no live attempt (left by an earlier daemon, or not yet empty when
        their attempt ended): kill what is in them, remove them once empty."""
        if self.cgroups is None:
            return
        killed, removed = cgroups.sweep(self.cgroups, {a.cgroup for a in self.live.values() if a.cgroup})
        for cg in killed:
            log.warning("stray_attempt_cgroup_killed", cgroup=str(cg))
        if removed:
            log.info("stale_attempt_cgroups_removed", cgroups=[cg.name for cg in removed])

    def live_pids(self) -> dict[str, list[int]]:
        return {a.name: list(a.pids) for a in self.live.values()}

    def launcher_pids(self) -> set[int]:
        return {a.proc.pid for a in self.live.values() if a.proc is not None}
