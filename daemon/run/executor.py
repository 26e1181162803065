"""Performs the step function's actions and turns what happens into observations.

The executor holds what a pure state cannot: per attempt, the launcher's Popen, the log relay, the
process group, the cgroup, the attempt's files and its store row (`Handles`). It runs on the main
loop's thread (it writes the store), and never blocks it on slow work: checkpoint discovery (as the
user, perhaps over a network volume), py-spy stack dumps and root-cause / OOM diagnosis run on a
small thread pool with their own deadlines, and their results come back through `results()` as
observations. Every action is one call to `perform`, which returns the observations it produced at
once (a spawn's result) and never raises: an error becomes `ActionFailed` — retryable when the
store could not take a write now — for the step function to decide on.
"""

from __future__ import annotations

import json
import os
import pwd
import queue
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from spx.daemon.contract.checkpoint_layout import CheckpointRef
from spx.daemon.core.causes import ReasonClass
from spx.daemon.core.config import DaemonConfig
from spx.daemon.core.log import get_logger
from spx.daemon.run import (
    attempt_files,
    cgroups,
    checkpoint_report,
    exit_wake,
    gang,
    launcher,
    local_tier,
    proctree,
    resume_fallback,
    standby,
    step_types,
    timeline,
)
from spx.daemon.run.attempt_files import AttemptFiles
from spx.daemon.run.oom import oom_killed
from spx.daemon.run.rootcause import TAIL_BYTES, root_cause_of
from spx.daemon.staging.runner import StagingRun, start_staging
from spx.daemon.state.states import JobState
from spx.daemon.state.store import JobRow, Store, StoreUnavailable

log = get_logger()

SLOW_WORKERS = 4
CHECKPOINT_TIMEOUT_SECONDS = 90.0   # below step.CHECKPOINT_DEADLINE_SECONDS
PYSPY_TIMEOUT_SECONDS = 15.0        # per process; all of them stay below step.DUMP_DEADLINE_SECONDS
DUMP_BUDGET_SECONDS = 45.0
PIDS_EVERY_SECONDS = 2.0
ACTIVITY_EVERY_SECONDS = 5.0  # how often an attempt without heartbeat progress is looked at
# Across hosts, how long a relaunch waits for the other hosts to leave the last generation (their
# agent may still serve its store); within the step's checkpoint deadline with discovery's timeout.
GANG_JOIN_WAIT_SECONDS = 25.0
_WITH_PROCESSES = ("leftover_processes", "adopted_after_restart")


@dataclass
class Handles:
    """The live side of one attempt (or of a job's staging)."""

    number: int
    files: AttemptFiles | None = None
    row_id: int | None = None
    attempt_id: str | None = None
    proc: subprocess.Popen | None = None     # None: adopted after a daemon restart (not our child)
    relay: subprocess.Popen | None = None
    pgid: int | None = None
    cgroup: Path | None = None
    port: int = 0
    pids: list[int] = field(default_factory=list)
    seen_pids: set[int] = field(default_factory=set)  # every pid ever seen, for the OOM check
    pids_checked: float = 0.0
    activity_checked: float = 0.0
    log_size: int | None = None
    exit_reported: bool = False
    staging: StagingRun | None = None
    staging_text: str | None = None
    deferred: list[Callable[[], None]] = field(default_factory=list)  # store writes the store refused
    discovery: dict | None = None  # checkpoint discovery's answer for this attempt (stored with its row)
    standby_age: float | None = None  # seconds its launcher waited as a standby (None: launched cold)
    spawned_wall: float = 0.0  # when this daemon spawned it (0: adopted; any heartbeat is then its own)
    gang_beat_at: float = 0.0  # across hosts: when its last beat was sent (gang.beat), monotonic
    gang_beating: bool = False  # one beat at a time: a slow shared dir must not pile them up

    @property
    def procs(self) -> proctree.AttemptProcesses:
        return proctree.AttemptProcesses(self.attempt_id or "-", self.pgid, self.cgroup)


class Executor:
    def __init__(self, cfg: DaemonConfig, store: Store, cgroup_tree: cgroups.CgroupTree | None,
                 wake: Callable[[], None] = lambda: None, wall: Callable[[], float] = time.time,
                 clock: Callable[[], float] = time.monotonic,
                 gpu_computing: Callable[[int], bool | None] | None = None):
        self.cfg = cfg
        self.store = store
        self.cgroups = cgroup_tree
        self.wall = wall
        self.clock = clock
        self._wake = wake
        self.gpu_computing = gpu_computing  # backend.computing: None means "cannot say" (busy)
        self._pool = ThreadPoolExecutor(max_workers=SLOW_WORKERS, thread_name_prefix="spx-slow")
        self._done: queue.SimpleQueue[tuple[int, Callable[[], step_types.Observation]]] = queue.SimpleQueue()
        self.handles: dict[int, Handles] = {}
        self.last_restart: tuple[str, float, str] | None = None  # (job, wall time, reason) for STATUS
        self.store_error: str | None = None  # the store's last refusal of a write
        self._index: dict[str, list[int]] | None = None  # this turn's tagged pids (proctree.tag_index)
        self.timeline = timeline.Recorder(store, wall)  # per-attempt phase times (spx status --timeline)
        self.standbys: dict[int, standby.Standby] = {}  # job → its next attempt's launcher, started ahead
        self._standby_refused: dict[int, int] = {}  # job → the attempt whose standby could not start (not retried)
        self.gang_hosts: dict[int, list[dict]] = {}  # job across hosts → every host's line, as last read (spx status)

    def close(self, wait: bool = False) -> None:
        """Nothing new starts; slow work still running finishes on its own deadline (`wait`: for it).
        Standbys end: a next daemon starts its own."""
        self._pool.shutdown(wait=wait, cancel_futures=True)
        for job_id in list(self.standbys):
            self._discard_standby(job_id)

    # --- slow work ---------------------------------------------------------------------------------

    def _off_loop(self, job_id: int, work: Callable[[], Callable[[], step_types.Observation]],
                  failed: Callable[[BaseException], step_types.Observation]) -> None:
        """Run `work` on the pool. It returns a completion that runs back on the loop's thread (so
        it may touch `handles`) and gives the observation; an exception gives `failed(e)`."""
        def run() -> None:
            try:
                done = work()
            except Exception as e:  # noqa: BLE001 — every failure is an observation, never lost
                err = e
                done = lambda: failed(err)  # noqa: E731
            self._done.put((job_id, done))
            self._wake()
        self._pool.submit(run)

    def results(self) -> list[tuple[int, step_types.Observation]]:
        """Observations from finished slow work (on the loop's thread)."""
        out: list[tuple[int, step_types.Observation]] = []
        while True:
            try:
                job_id, done = self._done.get_nowait()
            except queue.Empty:
                return out
            try:
                out.append((job_id, done()))
            except Exception as e:  # noqa: BLE001
                log.error("slow_work_result_failed", job=job_id, attempt=None, error=f"{type(e).__name__}: {e}")

    # --- observing -----------------------------------------------------------------------------------

    def observe(self, job: JobRow, s: step_types.JobStep) -> list[step_types.Observation]:
        """What changed for this job since the last turn, ending with a Tick."""
        h = self.handles.get(job.id)
        obs: list[step_types.Observation] = []
        if h is not None:
            self._flush_deferred(h)
            if s.phase is step_types.Phase.STAGING and h.staging is not None:
                obs += self._observe_staging(job, h)
            if s.phase.has_processes and h.number == s.number:
                obs += self._observe_attempt(job, s, h)
            if h.relay is not None and h.relay.poll() is not None:
                h.relay = None
        obs.append(step_types.Tick())
        return obs

    def _observe_attempt(self, job: JobRow, s: step_types.JobStep, h: Handles) -> list[step_types.Observation]:
        obs: list[step_types.Observation] = []
        if h.files is not None:
            beat = attempt_files.read_heartbeat(h.files.heartbeat_file)
            if beat is not None:
                obs.append(step_types.HeartbeatSeen(beat.step, beat.time, beat.status))
                self.timeline.beat(s.job_id, h.row_id, beat)
                # The next attempt's launcher starts once this one has trained a step — its own
                # beat, not the last attempt's still in the file — so it never slows this start.
                if (beat.step is not None and beat.time >= h.spawned_wall and s.phase is step_types.Phase.RUNNING
                        and h.row_id is not None and s.job_id not in self.standbys
                        and job.spec.restart.max_restarts > 0):
                    self._start_standby(job, s, s.number + 1)
        now = self.clock()
        if now - h.pids_checked >= PIDS_EVERY_SECONDS or h.exit_reported or h.proc is None:
            h.pids_checked = now
            h.pids = h.procs.pids(self._tag_index())
            h.seen_pids.update(h.pids)
        if (s.phase is step_types.Phase.RUNNING and s.last_progress is None and s.gpus and h.files is not None
                and self.gpu_computing is not None and now - h.activity_checked >= ACTIVITY_EVERY_SECONDS):
            obs.append(self._activity(s, h, now))
        if (s.phase is step_types.Phase.RUNNING and s.limits.gang and s.generation is not None and not h.gang_beating
                and now - h.gang_beat_at >= gang.BEAT_SECONDS):
            self._gang_beat(job, s, h, now)
        if not h.exit_reported:
            ended = self._launcher_status(h)
            if ended is not None:
                h.exit_reported = True
                obs.append(ended)
                self._timeline_exit(h)
                h.pids = h.procs.pids()  # a fresh look (the turn's index may predate the exit): all gone now?
        if h.exit_reported and h.procs.gone(h.pids):
            obs.append(step_types.AllGone())
            self.timeline.phase(h.row_id, "group_dead")
        return obs

    def _timeline_exit(self, h: Handles) -> None:
        """The failure phases known at the exit: when the monitor recorded it, when we saw it."""
        record = (launcher.recorded_exit(h.files.log_dir, h.files.log_name, h.attempt_id)
                  if h.files is not None and h.attempt_id and h.row_id is not None else None)
        if record is not None and record.ended is not None:
            self.timeline.phase(h.row_id, "launcher_exit", record.ended)
        self.timeline.phase(h.row_id, "failure_seen")

    def _activity(self, s: step_types.JobStep, h: Handles, now: float) -> step_types.ActivitySeen:
        """Did any of the attempt's GPUs compute, or its log grow, since the last look?"""
        assert h.files is not None and self.gpu_computing is not None
        h.activity_checked = now
        size = attempt_files.log_size(h.files)
        grew, h.log_size = size != h.log_size, size
        return step_types.ActivitySeen(grew or any(self.gpu_computing(g) is not False for g in s.gpus))

    def _tag_index(self) -> dict[str, list[int]]:
        """This turn's one scan of /proc (see `begin_turn`)."""
        if self._index is None:
            self._index = proctree.tag_index()
        return self._index

    def begin_turn(self) -> None:
        """A new loop turn: the next pid lookup scans /proc afresh (once for all attempts)."""
        self._index = None

    @staticmethod
    def _launcher_status(h: Handles) -> step_types.LauncherExited | None:
        """How the launcher ended, or None while it runs. Ours: Popen's status (negative codes are
        signals). Adopted (not our child): what its monitor recorded (`_adopted_end`)."""
        if h.proc is None:
            return _adopted_end(h)
        rc = h.proc.poll()
        if rc is None:
            return None
        return step_types.LauncherExited(None, -rc) if rc < 0 else step_types.LauncherExited(rc, None)

    def _observe_staging(self, job: JobRow, h: Handles) -> list[step_types.Observation]:
        run = h.staging
        assert run is not None
        exited = run.poll()
        if run.text() != h.staging_text:
            try:
                self.store.update_job(job.id, self.wall(), staging=run.text())
                h.staging_text = run.text()
            except StoreUnavailable:
                pass  # progress text only; the next poll writes it
        if not exited:
            return []
        h.staging = None
        if run.proc.stdout is not None:
            run.proc.stdout.close()
        if run.succeeded:
            return [step_types.StagingEnded(True, run.text())]
        why = run.text() if run.text().startswith("staging failed") else f"staging failed: copier exited {run.proc.returncode}"
        return [step_types.StagingEnded(False, why)]

    def _flush_deferred(self, h: Handles) -> bool:
        """Writes the store refused earlier, in order; False while it still refuses them."""
        while h.deferred:
            try:
                h.deferred[0]()
            except StoreUnavailable as e:
                self.store_error = str(e)
                return False
            h.deferred.pop(0)
        return True

    # --- performing ----------------------------------------------------------------------------------

    def perform(self, job: JobRow, s: step_types.JobStep, action: step_types.Action) -> list[step_types.Observation]:
        """Do one action; never raises (errors come back as ActionFailed)."""
        try:
            return _PERFORM[type(action)](self, job, s, action)
        except StoreUnavailable as e:
            self.store_error = str(e)
            return [step_types.ActionFailed(action, str(e), retry=True)]
        except Exception as e:  # noqa: BLE001 — contained: the step function decides what it means
            return [step_types.ActionFailed(action, f"{type(e).__name__}: {e}")]

    def _mark_starting(self, job: JobRow, s: step_types.JobStep, a: step_types.MarkStarting) -> list[step_types.Observation]:
        self.store.transition(job.id, JobState.STARTING, a.reason, self.wall(), gpus=list(a.gpus))
        return []

    def _start_staging(self, job: JobRow, s: step_types.JobStep, a: step_types.StartStaging) -> list[step_types.Observation]:
        stage = job.spec.data.stage
        assert stage is not None
        h = self.handles[job.id] = Handles(number=s.number, staging_text=job.staging)
        h.staging = start_staging(job.id, stage.source, stage.to, job.owner_uid, attempt_files.staging_log(self.cfg, job))
        self._log(job, s, step_types.Log("staging_started", "info", (("source", str(stage.source)), ("to", str(stage.to)))))
        return []

    def _stop_staging(self, job: JobRow, s: step_types.JobStep, a: step_types.StopStaging) -> list[step_types.Observation]:
        """Staging is resumable, so stopping it is just a kill; the next start continues it."""
        h = self.handles.get(job.id)
        run = h.staging if h is not None else None
        if run is None:
            return []
        assert h is not None
        h.staging = None
        try:
            os.killpg(run.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        run.proc.wait()
        if run.proc.stdout is not None:
            run.proc.stdout.close()
        return []

    def _find_checkpoint(self, job: JobRow, s: step_types.JobStep, a: step_types.FindCheckpoint) -> list[step_types.Observation]:
        cfg = self.cfg
        self.timeline.before_spawn(job.id, "gpus_free")
        # The launcher starts importing while the checkpoint is looked for (a relaunch's was started
        # during the attempt before).
        self._start_standby(job, s, a.number)

        # The crash-loop fallback is decided here, from the stored history (resume_fallback is pure).
        avoid = resume_fallback.checkpoint_to_avoid(self.store.attempts(job.id))

        last = s.generation

        def work() -> Callable[[], step_types.Observation]:
            files = attempt_files.prepare(cfg, job, a.number)
            joined = None
            if s.limits.gang:
                # Across hosts: the round this attempt joins, once no host runs in an older one.
                joined = gang.join(cfg, job, str(files.checkpoint_dir), last, GANG_JOIN_WAIT_SECONDS)
                if joined.final is not None:
                    return lambda: step_types.CheckpointFound(None, None, a.number, final=joined.final)
            ref, found = attempt_files.latest_checkpoint(job, files, CHECKPOINT_TIMEOUT_SECONDS,
                                                         {avoid.path: avoid.why} if avoid else None)
            if avoid is not None and resume_fallback.fell_back(avoid, found):
                found = {**found, "fallback_from": avoid.path, "fallback_why": avoid.why}
            if joined is not None:
                found = {**found, "generation": joined.gen, "join_waited_seconds": joined.waited,
                         "join_waited_for": joined.waited_for}
            return lambda: self._checkpoint_found(job, a.number, files, ref, found,
                                                  joined.gen if joined is not None else None)

        self._off_loop(job.id, work, lambda e: step_types.ActionFailed(a, str(e)))
        return []

    def _checkpoint_found(self, job: JobRow, number: int, files: AttemptFiles,
                          ref: CheckpointRef | None, found: dict, generation: int | None) -> step_types.Observation:
        self.timeline.before_spawn(job.id, "checkpoint_found")
        current = self.handles.get(job.id)
        if current is None or current.number != number or current.row_id is None:
            self.handles[job.id] = Handles(number=number, files=files)
        self.handles[job.id].discovery = found
        checkpoint_report.say(job.name, number, files, ref, found)
        return step_types.CheckpointFound(str(ref.path) if ref else None, ref.step if ref else None, number,
                                          generation=generation)

    def _spawn(self, job: JobRow, s: step_types.JobStep, a: step_types.Spawn) -> list[step_types.Observation]:
        h = self.handles[job.id]
        files = h.files
        assert files is not None and h.number == a.number
        now = self.wall()
        ready = self.standbys.get(job.id)
        if h.row_id is None:  # a retried Spawn (the store refused the row) must not add a second one
            h.attempt_id = ready.attempt_id if ready is not None and ready.number == a.number else uuid.uuid4().hex
            h.port = launcher.free_port()
            h.row_id = self.store.start_attempt(job.id, number=a.number, attempt_id=h.attempt_id, now=now,
                                                resumed_from=a.resume_from, resumed_from_step=a.resume_step,
                                                port=h.port, checkpoint_discovery=json.dumps(h.discovery)
                                                if h.discovery is not None else None, generation=s.generation)
        port = h.port
        try:
            user = pwd.getpwuid(job.owner_uid)
        except KeyError:
            raise OSError(f"the job's owner (uid {job.owner_uid}) has no account any more") from None
        ctx = launcher.LaunchContext(
            attempt=a.number, attempt_id=h.attempt_id or "", gpus=list(s.gpus), port=port,
            checkpoint_dir=files.checkpoint_dir, resume_from=Path(a.resume_from) if a.resume_from else None,
            heartbeat_file=files.heartbeat_file, rank_log_dir=files.rank_log_dir, home=user.pw_dir, user=user.pw_name,
            local_checkpoint_dir=files.local_checkpoint_dir, generation=s.generation if s.limits.gang else None,
        )
        plan = launcher.plan_launch(job.spec, ctx)
        resumed = (f"resuming from {a.resume_from} (step {a.resume_step})" if a.resume_from
                   else f"no complete checkpoint in {files.checkpoint_dir}; starting fresh")
        attempt_files.note(files, f"attempt {a.number} of job {job.name} at "
                                  f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(now))}; {resumed}\n"
                                  f"gpus {list(s.gpus) or 'none'}, port {port}, argv {plan.argv}")
        spawned = self._go_standby(job, a.number, h, plan)
        if spawned is None:
            h.cgroup = self._make_attempt_cgroup(job, a.number, h.attempt_id or "")
            try:
                fd = attempt_files.open_log_dir(files)
                try:
                    spawned = launcher.spawn(plan, job.owner_uid, fd, files.log_name, h.cgroup, self.cfg.log_max_bytes)
                finally:
                    os.close(fd)
            except BaseException:
                if h.cgroup is not None:
                    cgroups.remove(h.cgroup)
                    h.cgroup = None
                raise
        h.proc, h.relay, h.pgid, h.spawned_wall = spawned.proc, spawned.relay, spawned.proc.pid, now
        exit_wake.watch(spawned.proc.pid, self._wake)
        self.timeline.spawned(job.id, h.row_id, now)
        boot, ticks = proctree.boot_id(), proctree.start_ticks(spawned.proc.pid)
        row_id = h.row_id

        def running() -> None:
            self.store.attempt_running(job.id, row_id, pgid=spawned.proc.pid, boot_id=boot, start_ticks=ticks,
                                       reason=resumed, now=now)
        try:
            running()
        except StoreUnavailable as e:  # the attempt runs: the row catches up once the store takes writes
            self.store_error = str(e)
            h.deferred.append(running)
            self._log(job, s, step_types.Log("store_write_deferred", "warning", (("error", str(e)),)))
        self._log(job, s, step_types.Log("attempt_started", "info", (
            ("pid", spawned.proc.pid), ("gpus", list(s.gpus)), ("port", port),
            ("cgroup", str(h.cgroup) if h.cgroup else None), ("resumed_from", a.resume_from),
            ("resumed_from_step", a.resume_step), ("standby", h.standby_age))), number=a.number)
        return [step_types.Spawned(spawned.proc.pid, now)]

    # --- standbys (standby.py) ---------------------------------------------------------------------

    def _start_standby(self, job: JobRow, s: step_types.JobStep, number: int) -> None:
        """Start attempt `number`'s launcher ahead (where the config and the launcher allow), unless
        one is ready; one for another attempt goes. Never fails the job: without it, the attempt
        launches cold."""
        ready = self.standbys.get(s.job_id)
        if ready is not None and ready.number == number:
            return
        self._discard_standby(s.job_id)
        if (not self.cfg.launch_standby or job.spec.launcher not in ("torchrun", "deepspeed")
                or self._standby_refused.get(s.job_id) == number):
            return
        attempt_id, cgroup = uuid.uuid4().hex, None
        try:
            user = pwd.getpwuid(job.owner_uid)
            files = attempt_files.paths(self.cfg, job, number)
            plan = launcher.plan_launch(job.spec, launcher.LaunchContext(
                attempt=number, attempt_id=attempt_id, gpus=list(s.gpus), port=0, checkpoint_dir=files.checkpoint_dir,
                resume_from=None, heartbeat_file=files.heartbeat_file, rank_log_dir=files.rank_log_dir,
                home=user.pw_dir, user=user.pw_name, local_checkpoint_dir=files.local_checkpoint_dir))
            cgroup = self._make_attempt_cgroup(job, number, attempt_id)
            fd = attempt_files.job_log_dir_fd(self.cfg, job)
            try:
                ready = standby.start(number, attempt_id, plan, job.owner_uid, fd, files.log_name, cgroup,
                                      self.cfg.log_max_bytes)
            finally:
                os.close(fd)
        except (OSError, KeyError) as e:
            log.warning("standby_not_started", job=job.name, attempt=number, error=f"{type(e).__name__}: {e}")
            self._standby_refused[s.job_id] = number
            ready = None
        if ready is None:
            if cgroup is not None:
                cgroups.remove(cgroup)
            return
        self.standbys[s.job_id] = ready

    def _go_standby(self, job: JobRow, number: int, h: Handles, plan: launcher.LaunchPlan) -> launcher.Spawned | None:
        """Attempt `number` through its standby, if one is ready and fits the plan; None: launch cold
        (a standby that failed is discarded, and the cold launch says why, if it fails too)."""
        ready = self.standbys.get(job.id)
        h.standby_age = None
        if ready is None or ready.number != number or ready.attempt_id != h.attempt_id or not ready.fits(plan):
            self._discard_standby(job.id)
            return None
        del self.standbys[job.id]
        try:
            spawned = ready.go(plan)
        except OSError as e:
            log.warning("standby_failed", job=job.name, attempt=number, error=str(e))
            self._end_standby(ready)
            return None
        h.cgroup, h.standby_age = ready.cgroup, round(self.clock() - ready.started, 3)
        return spawned

    def _discard_standby(self, job_id: int) -> None:
        """End the job's standby unlaunched, with what it left: its cgroup, and the log its import
        may have written to (no attempt of its number has run: it was started for the next one)."""
        ready = self.standbys.pop(job_id, None)
        if ready is None:
            return
        ready.discard()
        self._end_standby(ready)
        try:
            attempt_files.remove_attempt_logs(self.cfg, self.store.job(job_id), ready.number)
        except (KeyError, StoreUnavailable):  # the job's row is gone: so is its log dir's owner
            pass

    @staticmethod
    def _end_standby(ready: standby.Standby) -> None:
        if ready.cgroup is not None:
            cgroups.remove(ready.cgroup)

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

    def _signal(self, job: JobRow, s: step_types.JobStep, a: step_types.SignalTerm | step_types.SignalKill) -> list[step_types.Observation]:
        h = self.handles.get(job.id)
        if h is not None and h.attempt_id is not None:
            h.procs.signal(signal.SIGTERM if isinstance(a, step_types.SignalTerm) else signal.SIGKILL)
        return []

    def _dump_stacks(self, job: JobRow, s: step_types.JobStep, a: step_types.DumpStacks) -> list[step_types.Observation]:
        h = self.handles[job.id]
        files, procs = h.files, h.procs
        assert files is not None

        def work() -> Callable[[], step_types.Observation]:
            dump_stacks(files, procs.pids())
            return lambda: step_types.StacksDumped(a.number)

        self._off_loop(job.id, work, lambda e: step_types.ActionFailed(a, str(e)))
        return []

    def _diagnose(self, job: JobRow, s: step_types.JobStep, a: step_types.Diagnose) -> list[step_types.Observation]:
        h = self.handles[job.id]
        files, seen = h.files, set(h.seen_pids)

        def work() -> Callable[[], step_types.Observation]:
            root = root_cause_of(attempt_files.read_log_tail(files, TAIL_BYTES)) if a.root_cause and files else None
            oom = oom_killed(seen) if a.oom else False
            return lambda: step_types.Diagnosed(a.number, root, oom)

        self._off_loop(job.id, work, lambda e: step_types.ActionFailed(a, str(e)))
        return []

    # --- across hosts (gang.py) -------------------------------------------------------------------

    def _agree_generation(self, job: JobRow, s: step_types.JobStep,
                          a: step_types.AgreeGeneration) -> list[step_types.Observation]:
        """Tell the other hosts this share's attempt ended (and begin the next generation with its
        decision, unless another host did first). Off the loop: the shared dir may be slow."""
        cfg, ckpt_dir, step = self.cfg, str(job.spec.checkpoint_dir(self.cfg.checkpoints_root)), s.last_step
        generation = a.generation if a.generation is not None else 0

        def work() -> Callable[[], step_types.Observation]:
            won, turn = gang.advance(cfg, job, ckpt_dir, generation, a.bump, step)
            return lambda: step_types.GenerationAgreed(a.number, won, turn)

        self._off_loop(job.id, work, lambda e: step_types.ActionFailed(a, str(e)))
        return []

    def _gang_beat(self, job: JobRow, s: step_types.JobStep, h: Handles, now: float) -> None:
        """This host's share runs in its generation (a beat, off the loop); comes back as GangSeen with
        the generation now, and every host's line for `spx status`. A beat that fails is logged: the
        share goes on, and the next beat tries again."""
        h.gang_beat_at, h.gang_beating = now, True
        cfg, ckpt_dir, generation, step = self.cfg, str(job.spec.checkpoint_dir(self.cfg.checkpoints_root)), s.generation, s.last_step
        assert generation is not None

        nodes = job.spec.nodes

        def done(turn: step_types.GangTurn | None, hosts: list[dict] | None) -> step_types.Observation:
            h.gang_beating = False
            if hosts is not None:
                self.gang_hosts[job.id] = hosts
            if turn is None:
                return step_types.Tick()
            gone = gang.missing(hosts or [], gang.me(cfg).label, nodes.count, nodes.host_timeout_seconds, self.wall(),
                                s.started_wall)
            return step_types.GangSeen(turn, gone)

        def work() -> Callable[[], step_types.Observation]:
            turn, hosts = gang.beat(cfg, job, ckpt_dir, generation, step)
            return lambda: done(turn, hosts)

        def failed(e: BaseException) -> step_types.Observation:
            log.warning("gang_beat_failed", job=job.name, attempt=s.number, error=str(e))
            return done(None, None)

        self._off_loop(job.id, work, failed)

    def _remove_cgroup(self, job: JobRow, s: step_types.JobStep, a: step_types.RemoveCgroup) -> list[step_types.Observation]:
        h = self.handles.get(job.id)
        if h is not None and h.cgroup is not None:
            if not cgroups.remove(h.cgroup):  # the sweep retries it
                log.warning("attempt_cgroup_not_removed", job=job.name, attempt=h.number, cgroup=str(h.cgroup))
            h.cgroup = None
        return []

    def _note(self, job: JobRow, s: step_types.JobStep, a: step_types.Note) -> list[step_types.Observation]:
        h = self.handles.get(job.id)
        if h is not None and h.files is not None:
            attempt_files.note(h.files, a.text)
        return []

    def _log(self, job: JobRow, s: step_types.JobStep, a: step_types.Log, number: int | None = None) -> list[step_types.Observation]:
        fields = dict(a.fields)
        if a.event in _WITH_PROCESSES:  # the step knows no pids or cgroups: the executor adds them
            h = self.handles.get(job.id)
            fields["pids"] = list(h.pids) if h else []
            fields["cgroup"] = str(h.cgroup) if h and h.cgroup else None
        getattr(log, a.level)(a.event, job=job.name, attempt=number or s.number or None, **fields)
        return []

    def _finish(self, job: JobRow, s: step_types.JobStep, a: step_types.FinishAttempt) -> list[step_types.Observation]:
        now = a.ended_wall if a.ended_wall is not None else self.wall()
        h = self.handles.get(job.id)
        if h is not None and not self._flush_deferred(h):
            raise StoreUnavailable(self.store_error or "state store refuses writes")
        row = h.row_id if (h is not None and a.number and h.number == a.number) else None
        attempt_fields: dict[str, object] = {}
        if row is not None:
            attempt_fields = {"end": now, "exit_code": a.exit_code, "signal": a.signal, "reason": a.reason,
                              "reason_class": a.reason_class, "max_step": a.max_step, "root_cause": a.root_cause}
        job_fields: dict[str, object] = {"backoff_level": a.backoff_level, "no_progress_streak": a.no_progress_streak,
                                         "backoff_remaining": a.backoff_remaining}
        if a.release_gpus:
            job_fields["gpus"] = []
        self.store.finish_attempt(job.id, row, a.state, a.reason, now, attempt_fields, job_fields)
        if a.state.terminal or a.release_gpus:
            self._discard_standby(job.id)  # no next attempt here soon: its standby would only hold memory
        if a.state.terminal:
            local_tier.remove(self.cfg, job)  # host RAM; the persistent copy outlives the job
        self.timeline.phase(row, "end_recorded")
        if a.state is JobState.RESTARTING and a.reason_class not in (ReasonClass.DAEMON_RESTART, None):
            self.last_restart = (job.name, now, a.reason_class or "")
        if h is not None and h.number == a.number:
            h.row_id, h.proc, h.pids = None, None, []  # the attempt is over; its relay is polled until it exits
        return []

    def _record_stop(self, job: JobRow, s: step_types.JobStep, a: step_types.RecordStop) -> list[step_types.Observation]:
        h = self.handles.get(job.id)
        if h is not None and h.row_id is not None and h.number == a.number:
            if not self._flush_deferred(h):
                raise StoreUnavailable(self.store_error or "state store refuses writes")
            self.store.attempt_stopping(h.row_id, a.cause)
        return []

    def _record_exit(self, job: JobRow, s: step_types.JobStep, a: step_types.RecordExit) -> list[step_types.Observation]:
        h = self.handles.get(job.id)
        if h is not None and h.row_id is not None and h.number == a.number:
            if not self._flush_deferred(h):
                raise StoreUnavailable(self.store_error or "state store refuses writes")
            self.store.attempt_exited(h.row_id, a.code, a.signal, a.stop_cause, self.wall())
        return []

    def _save_backoff(self, job: JobRow, s: step_types.JobStep, a: step_types.SaveBackoff) -> list[step_types.Observation]:
        self.store.update_job(job.id, self.wall(), backoff_remaining=a.remaining)
        return []

    # --- adoption ------------------------------------------------------------------------------------

    def adopt(self, job: JobRow, number: int, row_id: int, attempt_id: str, pgid: int | None,
              boot_id: str | None, start_ticks: int | None) -> step_types.LauncherExited | None:
        """The open attempt of a previous daemon, taken on: None while its launcher runs, else how it
        ended (`_adopted_end`). Its group is signalled only if the stored pgid's leader is provably
        the process that daemon started (same boot, same start time); the tag and the cgroup find
        the rest either way."""
        same = pgid is not None and proctree.same_process(pgid, boot_id, start_ticks)
        if pgid is not None and not same:
            log.warning("stored_pgid_not_ours", job=job.name, attempt=number, pgid=pgid,
                        detail="its leader is gone or another process now; only the tag and cgroup are used")
        cgroup = None
        if self.cgroups is not None:
            old = self.cgroups.attempt(job.name, number, attempt_id)
            cgroup = old if old.is_dir() else None
        h = self.handles[job.id] = Handles(number=number, files=attempt_files.paths(self.cfg, job, number),
                                           row_id=row_id, attempt_id=attempt_id, pgid=pgid if same else None,
                                           cgroup=cgroup)
        h.pids = h.procs.pids()
        h.seen_pids.update(h.pids)
        return _adopted_end(h)

    def adopt_lost(self, job: JobRow, number: int) -> None:
        """A job stored as running without an open attempt (its row never made it): nothing to find
        or signal; its step ends the empty stop at once and relaunches it."""
        self.handles[job.id] = Handles(number=number)

    def forget(self, job_id: int) -> None:
        """The supervisor is done with the job: its handles go (a relay still draining, no longer
        ours to poll, is collected by the orphan reaper)."""
        self.handles.pop(job_id, None)
        self.timeline.forget(job_id)
        self.gang_hosts.pop(job_id, None)
        self._discard_standby(job_id)
        self._standby_refused.pop(job_id, None)

    # --- views ---------------------------------------------------------------------------------------

    def live_pids(self, names: dict[int, str]) -> dict[str, list[int]]:
        return {names[j]: list(h.pids) for j, h in list(self.handles.items()) if j in names and h.attempt_id}

    def child_pids(self) -> set[int]:
        """Our own children whose status Popen reads (launchers, relays, copiers): not for the reaper."""
        out = set()
        for h in list(self.handles.values()):
            for p in (h.proc, h.relay, h.staging.proc if h.staging else None):
                if p is not None:
                    out.add(p.pid)
        for ready in list(self.standbys.values()):
            out.update((ready.monitor.proc.pid, ready.monitor.relay.pid))
        return out

    def attempt_cgroups(self) -> set[Path]:
        return ({h.cgroup for h in list(self.handles.values()) if h.cgroup is not None}
                | {r.cgroup for r in list(self.standbys.values()) if r.cgroup is not None})


def _adopted_end(h: Handles) -> step_types.LauncherExited | None:
    """How an adopted attempt (not our child) ended, or None while it runs. Its monitor records the
    launcher's end before it exits itself: with a record the launcher is gone, even if workers are
    left (a launcher killed while no daemon watched leaves its workers training, unsupervised:
    they are leftovers now, killed as any), and with none and no process left it is lost."""
    record = (launcher.recorded_exit(h.files.log_dir, h.files.log_name, h.attempt_id)
              if h.files is not None and h.attempt_id else None)
    if record is None:
        return None if h.pids else step_types.LauncherExited(None, None, lost=True)
    return step_types.LauncherExited(record.exit_code, record.signal, launched=record.launched, stopped=record.stopped,
                                     ended_wall=record.ended)


def dump_stacks(files: AttemptFiles, pids: list[int]) -> None:
    """Worker stacks into the attempt log (py-spy, where installed), before the kill. Off the loop."""
    pyspy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(pyspy).exists():
        attempt_files.note(files, "hang detected; py-spy is not installed, no stack dump")
        return
    deadline = time.monotonic() + DUMP_BUDGET_SECONDS
    for pid in pids:
        left = deadline - time.monotonic()
        if left <= 1:
            attempt_files.note(files, f"stack dump budget spent; pid {pid} not dumped")
            continue
        try:
            out = subprocess.run([pyspy, "dump", "--pid", str(pid)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 timeout=min(PYSPY_TIMEOUT_SECONDS, left), check=False).stdout
            text = out.decode("utf-8", "replace")
        except subprocess.TimeoutExpired:
            text = "py-spy timed out"
        attempt_files.note(files, f"hang detected; stack of pid {pid}:\n{text}")


_PERFORM: dict[type, Callable[[Executor, JobRow, step_types.JobStep, object], list[step_types.Observation]]] = {
    step_types.MarkStarting: Executor._mark_starting,
    step_types.StartStaging: Executor._start_staging,
    step_types.StopStaging: Executor._stop_staging,
    step_types.FindCheckpoint: Executor._find_checkpoint,
    step_types.Spawn: Executor._spawn,
    step_types.SignalTerm: Executor._signal,
    step_types.SignalKill: Executor._signal,
    step_types.DumpStacks: Executor._dump_stacks,
    step_types.Diagnose: Executor._diagnose,
    step_types.AgreeGeneration: Executor._agree_generation,
    step_types.RemoveCgroup: Executor._remove_cgroup,
    step_types.Note: Executor._note,
    step_types.Log: Executor._log,
    step_types.RecordStop: Executor._record_stop,
    step_types.RecordExit: Executor._record_exit,
    step_types.FinishAttempt: Executor._finish,
    step_types.SaveBackoff: Executor._save_backoff,
}
