"""The standbys the executor holds: per job, at most one launcher started ahead for a coming attempt
(run/standby.py), started when the machine asks (FindCheckpoint.standby for a first attempt,
StartStandby during an attempt for the next), taken by that attempt's launch if it fits its plan,
discarded otherwise. Starting one never fails the job: without it, the attempt launches cold.

Discarding never waits: the standby's session is killed and the daemon's orphan reaper collects its
monitor and relay (a relay on a stuck disk must not hold the main loop).
"""

from __future__ import annotations

import os
import pwd
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from spx.daemon.core.config import DaemonConfig
from spx.daemon.core.log import get_logger
from spx.daemon.run import attempt_files, cgroups, device_filter, launcher, standby
from spx.daemon.run.attempt_runtime import make_attempt_cgroup
from spx.daemon.state.db import StoreUnavailable
from spx.daemon.state.jobs_table import JobRow
from spx.daemon.state.store import Store

log = get_logger()


class StandbyPool:
    def __init__(self, cfg: DaemonConfig, store: Store, cgroup_tree: cgroups.CgroupTree | None,
                 clock: Callable[[], float] = time.monotonic,
                 device_filters: device_filter.DeviceFilters | None = None):
        self.cfg = cfg
        self.store = store
        self.cgroups = cgroup_tree
        self.clock = clock
        self.device_filters = device_filters  # which /dev/nvidiaN a cgroup may open (None: no filter)
        self.standbys: dict[int, standby.Standby] = {}  # job → its next attempt's launcher, started ahead
        self._refused: dict[int, int] = {}  # job → the attempt whose standby could not start (not retried)

    def start(self, job: JobRow, gpus: tuple[int, ...], number: int) -> None:
        """Start attempt `number`'s launcher ahead (where the launcher allows), unless one is ready;
        one for another attempt goes."""
        ready = self.standbys.get(job.id)
        if ready is not None and ready.number == number:
            return
        self.discard(job.id)
        if self._refused.get(job.id) == number:
            return
        attempt_id, cgroup, made, devices = uuid.uuid4().hex, None, None, None
        try:
            user = pwd.getpwuid(job.owner_uid)
            files = attempt_files.paths(self.cfg, job, number)
            plan = launcher.plan_launch(job.spec, launcher.LaunchContext(
                attempt=number, attempt_id=attempt_id, gpus=list(gpus), port=0, checkpoint_dir=files.checkpoint_dir,
                resume_from=None, heartbeat_file=files.heartbeat_file, rank_log_dir=files.rank_log_dir,
                home=user.pw_dir, user=user.pw_name, local_checkpoint_dir=files.local_checkpoint_dir))
            cgroup = make_attempt_cgroup(self.cgroups, job, number, attempt_id)
            # Its GPUs are not final until the plan: no GPU node opens before (settled at its launch).
            if cgroup is not None and self.device_filters is not None:
                devices = self.device_filters.pending(cgroup, job.name, number)
            fd = attempt_files.job_log_dir_fd(self.cfg, job)
            try:
                made = standby.start(number, attempt_id, plan, job.owner_uid, fd, files.log_name, cgroup,
                                     self.cfg.log_max_bytes, readers=files.readers,
                                     workers=job.spec.worker_count if job.spec.restart.standby_workers else 0)
            finally:
                os.close(fd)
        except (OSError, KeyError) as e:
            log.warning("standby_not_started", job=job.name, attempt=number, error=f"{type(e).__name__}: {e}")
            self._refused[job.id] = number
        if made is None:
            if devices is not None:
                devices.close()
            if cgroup is not None:
                cgroups.remove(cgroup)
            return
        made.devices = devices
        self.standbys[job.id] = made

    def attempt_id(self, job_id: int, number: int) -> str | None:
        """The tag of attempt `number`'s standby, if one is ready: its attempt takes it as its own."""
        ready = self.standbys.get(job_id)
        return ready.attempt_id if ready is not None and ready.number == number else None

    def take(self, job_id: int, number: int, attempt_id: str, plan: launcher.LaunchPlan) -> standby.Standby | None:
        """The standby that becomes attempt `number` with `plan`, now no longer the pool's; None (any
        other standby discarded) where none fits: the attempt launches cold."""
        ready = self.standbys.get(job_id)
        if ready is None or ready.number != number or ready.attempt_id != attempt_id or not ready.fits(plan):
            self.discard(job_id)
            return None
        del self.standbys[job_id]
        return ready

    @staticmethod
    def end(ready: standby.Standby) -> None:
        """A taken standby that did not become its attempt: its session killed, its cgroup removed
        (the sweep retries one not empty yet). Its log stays: it is its attempt's, launched cold now."""
        ready.discard()
        if ready.devices is not None:
            ready.devices.close()
        if ready.cgroup is not None:
            cgroups.remove(ready.cgroup)

    def discard(self, job_id: int) -> None:
        """End the job's standby unlaunched, with what it left: its cgroup, and the log its import
        may have written to (no attempt of its number has run: it was started for the next one)."""
        ready = self.standbys.pop(job_id, None)
        if ready is None:
            return
        self.end(ready)
        try:
            attempt_files.remove_attempt_logs(self.cfg, self.store.jobs.get(job_id), ready.number)
        except (KeyError, StoreUnavailable):  # the job's row is gone: so is its log dir's owner
            pass

    def forget(self, job_id: int) -> None:
        self.discard(job_id)
        self._refused.pop(job_id, None)

    def close(self) -> None:
        """Standbys end with the daemon: a next daemon starts its own."""
        for job_id in list(self.standbys):
            self.discard(job_id)

    def processes(self) -> dict[int, tuple[int, ...]]:
        """job → its standby's monitor and log relay, the processes the daemon started for it."""
        return {job_id: (r.pid, r.monitor.relay.pid) for job_id, r in list(self.standbys.items())}

    def children(self) -> set[int]:
        return {pid for pids in self.processes().values() for pid in pids}

    def cgroups_held(self) -> set[Path]:
        return {r.cgroup for r in list(self.standbys.values()) if r.cgroup is not None}
