"""Spawn: an attempt's store row, then its launch — through its standby if one fits, else cold —
with every wait on the job's user off the main loop.

A launch waits on the user twice: a standby's agent must *take* its plan (its imports done: the
user's modules, which may never return; the plan is the job's own argv, which may be larger than a
pipe holds), and a cold launch's status pipe closes only when the exec shim — by then the user, in
the user's working directory (a hung mount) — execs the launcher. Both waits run in the owner's
lane (run/user_work.py) with deadlines; the monitor and relay are started on the loop (they are
root's, and the daemon's children: registered at once, so the orphan reaper never takes their exit
status). A standby that does not take its plan by `user_work.standby_handoff_seconds` is discarded
and the attempt launches cold; a cold launch whose shim does not exec by LAUNCH_STATUS_SECONDS is
killed and the launch fails. The answer is Spawned (or ActionFailed), on the loop; a launch that
lands after its job was forgotten (cancelled meanwhile) is killed there.
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from spx.daemon.core.config import DaemonConfig
from spx.daemon.core.lanes import Outcome
from spx.daemon.core.log import get_logger
from spx.daemon.lifecycle.actions import Spawn
from spx.daemon.lifecycle.observations import ActionFailed, Observation, Spawned
from spx.daemon.lifecycle.record import TrackedJob
from spx.daemon.run import (
    attempt_files,
    cgroups,
    device_filter,
    launcher,
    proctree,
    standby,
    timeline,
)
from spx.daemon.run.attempt_runtime import AttemptHandles, AttemptRuntime, make_attempt_cgroup
from spx.daemon.run.standby_pool import StandbyPool
from spx.daemon.run.user_work import UserWork
from spx.daemon.run.worker_watch import WORKER_LAUNCHERS
from spx.daemon.state.jobs_table import JobRow
from spx.daemon.state.store import Store

log = get_logger()

# A cold launch's shim execs the launcher by then (it only enters the cgroup, becomes the user and
# changes into the working directory), or the launch fails.
LAUNCH_STATUS_SECONDS = 60.0
# The lane answers a launch this much later than its own deadline: the launch's reads end first.
_LANE_MARGIN_SECONDS = 5.0


@dataclass
class Launches:
    cfg: DaemonConfig
    store: Store
    runtime: AttemptRuntime
    pool: StandbyPool
    work: UserWork
    recorder: timeline.Recorder
    cgroup_tree: cgroups.CgroupTree | None
    wall: Callable[[], float] = time.time
    clock: Callable[[], float] = time.monotonic
    wake: Callable[[], None] = lambda: None
    device_filters: device_filter.DeviceFilters | None = None  # which /dev/nvidiaN it may open (None: no filter)

    def spawn(self, job: JobRow, s: TrackedJob, a: Spawn) -> list[Observation]:
        h = self.runtime.handles[job.id]
        files = h.files
        assert files is not None and h.number == a.number
        now = self.wall()
        if h.row_id is None:  # a retried Spawn (the store refused the row) must not add a second one
            h.attempt_id = self.pool.attempt_id(job.id, a.number) or uuid.uuid4().hex
            h.port = launcher.free_port()
            h.row_id = self.store.attempts.start(job.id, number=a.number, attempt_id=h.attempt_id, now=now,
                                                resumed_from=a.resume_from, resumed_from_step=a.resume_step,
                                                port=h.port, checkpoint_discovery=json.dumps(h.discovery)
                                                if h.discovery is not None else None, generation=s.share.generation)
        try:
            user = pwd.getpwuid(job.owner_uid)
        except KeyError:
            raise OSError(f"the job's owner (uid {job.owner_uid}) has no account any more") from None
        ctx = launcher.LaunchContext(
            attempt=a.number, attempt_id=h.attempt_id or "", gpus=list(s.ledger.gpus), port=h.port,
            checkpoint_dir=files.checkpoint_dir, resume_from=Path(a.resume_from) if a.resume_from else None,
            heartbeat_file=files.heartbeat_file, rank_log_dir=files.rank_log_dir, home=user.pw_dir, user=user.pw_name,
            local_checkpoint_dir=files.local_checkpoint_dir, generation=s.share.generation if s.limits.gang else None,
            fence=files.fence, skip_steps=a.skip_steps, extra_args=list(a.extra_args),
        )
        plan = launcher.plan_launch(job.spec, ctx)
        resumed = (f"resuming from {a.resume_from} (step {a.resume_step})" if a.resume_from
                   else f"no complete checkpoint in {files.checkpoint_dir}; starting fresh")
        attempt_files.note(files, f"attempt {a.number} of job {job.name} at "
                                  f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(now))}; {resumed}\n"
                                  f"gpus {list(s.ledger.gpus) or 'none'}, port {h.port}, argv {plan.argv}")
        landed = _Landing(self, job, s, a, h, now, resumed)
        h.launching, h.standby_age = True, None
        ready = self.pool.take(job.id, a.number, h.attempt_id or "", plan)
        if ready is not None:
            self._hand_off(landed, ready, plan)
        else:
            self._cold(landed, plan)
        return []

    def _hand_off(self, landed: _Landing, ready: standby.Standby, plan: launcher.LaunchPlan) -> None:
        """The plan to the standby, off the loop; one that does not take it in time is discarded and
        the attempt launches cold."""
        h = landed.h
        if ready.devices is not None and self.device_filters is not None:
            try:  # before the plan reaches it: from here on it may open the attempt's GPUs, and only those
                ready.devices.settle(self.device_filters.allowed(landed.s.ledger.gpus))
                landed.confined = True
            except OSError as e:  # its cgroup still allows no GPU: a cold launch in a fresh one instead
                log.warning("standby_failed", job=landed.job.name, attempt=landed.a.number, error=str(e))
                self.pool.end(ready)
                self._cold(landed, plan)
                return
        h.proc, h.relay, h.cgroup = ready.monitor.proc, ready.monitor.relay, ready.cgroup
        seconds = self.cfg.user_work.standby_handoff_seconds

        def go() -> launcher.Spawned:
            return ready.go(plan, time.monotonic() + seconds)

        def done(outcome: Outcome) -> Observation | None:
            if outcome.ok:
                return landed.spawned(ready.monitor.proc, round(self.clock() - ready.started, 3))
            log.warning("standby_failed", job=landed.job.name, attempt=landed.a.number, error=_why(outcome),
                        detail="the standby is discarded; the attempt launches cold")
            ready.discard()
            h.proc = h.relay = None
            if landed.abandoned():
                self.pool.end(ready)  # its cgroup too (the sweep retries one not empty yet)
                return None
            try:  # in the same cgroup: it is the same attempt
                self._cold(landed, plan)
            except Exception as e:  # noqa: BLE001 — as the dispatcher's: the machine decides
                return landed.failed(f"{type(e).__name__}: {e}")
            return None

        self.work.submit(landed.job, "standby handoff", go, seconds + _LANE_MARGIN_SECONDS, done, keep=True)

    def _cold(self, landed: _Landing, plan: launcher.LaunchPlan) -> None:
        """The monitor and relay started here (the daemon's children, registered at once); the shim's
        status read off the loop."""
        job, h = landed.job, landed.h
        assert h.files is not None
        if h.cgroup is None:
            h.cgroup = make_attempt_cgroup(self.cgroup_tree, job, landed.a.number, h.attempt_id or "")
        if h.cgroup is not None and self.device_filters is not None and not landed.confined:
            landed.confined = self.device_filters.confine(h.cgroup, landed.s.ledger.gpus, job.name, landed.a.number)
        try:
            fd = attempt_files.open_log_dir(h.files)
            try:
                started = launcher.start_monitor(plan, job.owner_uid, fd, h.files.log_name, h.cgroup,
                                                 self.cfg.log_max_bytes, readers=h.files.readers)
            finally:
                os.close(fd)
        except BaseException:
            if h.cgroup is not None:
                cgroups.remove(h.cgroup)
                h.cgroup = None
            raise
        h.proc, h.relay = started.proc, started.relay

        def status() -> None:
            launcher.raise_launch_failure(started, started.status_r, time.monotonic() + LAUNCH_STATUS_SECONDS)

        def done(outcome: Outcome) -> Observation | None:
            if outcome.ok:
                return landed.spawned(started.proc, None)
            _kill(started.proc)  # one that timed out is still there; one that failed is gone
            if h.cgroup is not None:
                cgroups.remove(h.cgroup)  # the sweep retries one not empty yet
                h.cgroup = None
            h.proc = h.relay = None
            h.launching = False
            return None if landed.abandoned() else landed.failed(_why(outcome))

        self.work.submit(job, "launch", status, LAUNCH_STATUS_SECONDS + _LANE_MARGIN_SECONDS, done, keep=True)


class _Landing:
    """One launch under way: what its answer needs, on the loop."""

    def __init__(self, launches: Launches, job: JobRow, s: TrackedJob, a: Spawn, h: AttemptHandles, wall: float,
                 reason: str):
        self.launches, self.job, self.s, self.a, self.h, self.wall, self.reason = launches, job, s, a, h, wall, reason
        self.confined = False  # its cgroup's device filter allows its GPUs alone (device_filter.py)

    def abandoned(self) -> bool:
        """Its job was forgotten meanwhile (cancelled, failed, the daemon stopping)."""
        return self.launches.runtime.handles.get(self.job.id) is not self.h

    def spawned(self, proc: subprocess.Popen, standby_age: float | None) -> Observation | None:
        h, launches = self.h, self.launches
        if self.abandoned():
            _kill(proc)  # nobody supervises it any more: it must not run
            return None
        h.launching, h.standby_age = False, standby_age
        h.pgid, h.spawned_wall = proc.pid, self.wall
        launches.runtime.exits.watch(proc.pid, launches.wake)
        if self.job.spec.launcher in WORKER_LAUNCHERS and launches.runtime.workers is not None:
            launches.runtime.workers.attempt(self.job.id, self.a.number, proc.pid, self.job.spec.worker_count)
        assert h.row_id is not None  # the Spawn made it before the launch
        launches.recorder.spawned(self.job.id, h.row_id, self.wall)
        log.info("attempt_started", job=self.job.name, attempt=self.a.number, pid=proc.pid,
                 gpus=list(self.s.ledger.gpus), port=h.port, cgroup=str(h.cgroup) if h.cgroup else None,
                 resumed_from=self.a.resume_from, resumed_from_step=self.a.resume_step, standby=standby_age,
                 devices_confined=self.confined)
        return Spawned(proc.pid, self.wall, proctree.boot_id(), proctree.start_ticks(proc.pid), self.reason)

    def failed(self, error: str) -> Observation:
        self.h.launching = False
        return ActionFailed(self.a, error)


def _why(outcome: Outcome) -> str:
    return f"{type(outcome.error).__name__}: {outcome.error}"


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL the session `proc` leads — unless it was reaped and nothing of its group is left (the
    number may be another's now)."""
    if proc.poll() is not None and not proctree.group_alive(proc.pid):
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
