"""The executor: performs the machine's actions and turns what happens into observations.

A small dispatcher over effects, each holding one kind of what a value of the machine cannot:
- attempt_runtime: per attempt, its files, row, monitor and relay, process group, cgroup, pids;
  what is seen of it each turn (heartbeat, activity, a worker's death, exit, nothing left); signals,
  notes, logs; exit_wake's one thread polls every pidfd (launchers, workers: worker_watch);
- launching: Spawn — the row, then the launch through a standby or cold (off the loop);
- standby_pool: launchers started ahead for coming attempts;
- attempt_prep, postmortem, gang_link: FindCheckpoint; DumpStacks and Diagnose; BeatGang and
  AgreeGeneration — all in the job owner's lane (user_work, over core.lanes);
- store_writes: the machine's store writes; staging_runs: the copier; adoption: at daemon start;
- incidents: an incident per failed attempt, gathered when its end is recorded;
- verification: a replay job's verdict, stored on the job it verified (which hears when it differs).
It decides nothing: what to do, when, and what a failure means is the machine's. It runs on the
main loop's thread; `perform` never raises (an error is ActionFailed, retryable when the store
could not take a write now; lifecycle.failures.in_order: later writes of the same batch are then
not made, so the store sees them in the machine's order).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spx.daemon.core.config import DaemonConfig
from spx.daemon.core.lanes import Lanes
from spx.daemon.lifecycle import actions as act
from spx.daemon.lifecycle.failures import in_order
from spx.daemon.lifecycle.observations import ActionFailed, LauncherExited, Observation, Tick
from spx.daemon.lifecycle.record import Phase, TrackedJob
from spx.daemon.run import adoption, cgroups, device_filter, local_tier, postmortem, timeline
from spx.daemon.run.attempt_prep import AttemptPrep
from spx.daemon.run.attempt_runtime import AttemptRuntime
from spx.daemon.run.exit_wake import ExitWatch
from spx.daemon.run.gang_link import GangLink
from spx.daemon.run.incidents import GpuSources, Incidents
from spx.daemon.run.launching import Launches
from spx.daemon.run.staging_runs import StagingRuns
from spx.daemon.run.standby_pool import StandbyPool
from spx.daemon.run.store_writes import StoreWrites
from spx.daemon.run.user_work import UserWork
from spx.daemon.run.verification import Verifications
from spx.daemon.run.worker_watch import WorkerWatch
from spx.daemon.state.attempts_table import AttemptRow
from spx.daemon.state.db import StoreUnavailable
from spx.daemon.state.jobs_table import JobRow
from spx.daemon.state.store import Store

# Each performer takes the action type its table entry names (the table is what guarantees it).
Perform = Callable[[JobRow, TrackedJob, Any], object]
# A running attempt with nothing new this turn (no beat, no exit, no answer) is told of time passing
# this often rather than every turn: what a running attempt's Tick decides (a hang, a gang's beat) is
# counted in seconds, and a Tick every turn for every running job was most of what they cost the loop.
# Anything observed brings its Tick along at once, as does a store write waiting to be retried.
RUNNING_TICK_SECONDS = 1.0


class Executor:
    def __init__(self, cfg: DaemonConfig, store: Store, lanes: Lanes, cgroup_tree: cgroups.CgroupTree | None,
                 wake: Callable[[], None] = lambda: None, wall: Callable[[], float] = time.time,
                 clock: Callable[[], float] = time.monotonic,
                 gpu_computing: Callable[[int], bool | None] | None = None,
                 device_filters: device_filter.DeviceFilters | None = None,
                 gpu_sources: GpuSources | None = None,
                 quarantine: Callable[[int, str], None] | None = None):
        self.cfg = cfg
        self.cgroups = cgroup_tree
        self.clock = clock
        self._running_ticks: dict[int, float] = {}  # job → when its running attempt's next Tick is due
        self.timeline = timeline.Recorder(store, wall)  # per-attempt phase times (spx status --timeline)
        self.work = UserWork(lanes, clock)
        exits = ExitWatch(clock)  # one thread for every pidfd: launchers' exits, workers' deaths
        self.runtime = AttemptRuntime(cfg, self.timeline, clock, gpu_computing, exits=exits,
                                      workers=WorkerWatch(exits, wake, wall, clock))
        self.standbys = StandbyPool(cfg, store, cgroup_tree, clock, device_filters)
        self.staging = StagingRuns(cfg, store, wall)
        self.writes = StoreWrites(store, self.runtime.row_of, wall)
        self.gang = GangLink(cfg, self.work, wall)
        self.incidents = Incidents(store, self.work, gpu_sources or GpuSources(), wall)
        self.verifications = Verifications(store, quarantine or (lambda gpu, reason: None), wall)
        self.prep = AttemptPrep(cfg, self.runtime, self.standbys, self.work, self.timeline)
        self.launches = Launches(cfg, store, self.runtime, self.standbys, self.work, self.timeline, cgroup_tree,
                                 wall, clock, wake, device_filters)
        r, w = self.runtime, self.writes
        self.performers: dict[type, Perform] = {
            act.MarkStarting: lambda job, s, a: w.mark_starting(job, a),
            act.StartStaging: lambda job, s, a: self.staging.start(job),
            act.StopStaging: lambda job, s, a: self.staging.stop(job),
            act.FindCheckpoint: self.prep.find_checkpoint,
            act.StartStandby: lambda job, s, a: self.standbys.start(job, s.ledger.gpus, a.number),
            act.Spawn: self.launches.spawn,
            act.RecordRunning: lambda job, s, a: w.record_running(job, a),
            act.SignalTerm: lambda job, s, a: r.signal(job, a),
            act.SignalKill: lambda job, s, a: r.signal(job, a),
            act.DumpStacks: lambda job, s, a: postmortem.dump(self.work, job, r.handles[job.id], a),
            act.Diagnose: lambda job, s, a: postmortem.diagnose(self.work, job, r.handles.get(job.id), a),
            act.BeatGang: lambda job, s, a: self.gang.beat(job, a),
            act.AgreeGeneration: lambda job, s, a: self.gang.agree(job, a),
            act.RemoveCgroup: lambda job, s, a: r.remove_cgroup(job, a),
            act.Note: lambda job, s, a: r.note(job, a.text),
            act.Log: lambda job, s, a: r.log(job, s, a),
            act.RecordStop: self._record_stop,
            act.RecordExit: lambda job, s, a: w.record_exit(job, a),
            act.FinishAttempt: self._finish,
            act.RecordVerdict: self.verifications.record,
            act.SaveBackoff: lambda job, s, a: w.save_backoff(job, a),
        }

    # --- the loop's questions ------------------------------------------------------------------------

    def begin_turn(self) -> None:
        self.runtime.begin_turn()

    def results(self) -> list[tuple[int, Observation]]:
        """Observations from work done off the loop, and a verdict's news for the job it verified."""
        return [*self.work.results(), *self.verifications.results()]

    def observe(self, job: JobRow, s: TrackedJob) -> list[Observation]:
        """What changed for this job since the last turn, ending with a Tick (for a running attempt
        with nothing new, one every RUNNING_TICK_SECONDS)."""
        staged = self.staging.observe(job) if s.phase is Phase.STAGING else []
        obs = [*staged, *self.runtime.observe(job, s), *self.work.observe(job.id)]
        now = self.clock()
        if obs or s.phase is not Phase.RUNNING or s.pending or now >= self._running_ticks.get(job.id, now):
            self._running_ticks[job.id] = now + RUNNING_TICK_SECONDS
            obs.append(Tick())
        return obs

    def perform(self, job: JobRow, s: TrackedJob, actions: list[act.Action]) -> list[Observation]:
        """Do `actions` in order (failures.in_order: no write after one the store refused); never raises."""
        return in_order(actions, lambda a: self._one(job, s, a))

    def _one(self, job: JobRow, s: TrackedJob, a: act.Action) -> list[Observation]:
        try:
            answer = self.performers[type(a)](job, s, a)
        except StoreUnavailable as e:
            self.writes.store_error = str(e)
            return [ActionFailed(a, str(e), retry=True)]
        except Exception as e:  # noqa: BLE001 — contained: the machine decides what it means
            return [ActionFailed(a, f"{type(e).__name__}: {e}")]
        return answer if isinstance(answer, list) else []

    def _finish(self, job: JobRow, s: TrackedJob, a: act.FinishAttempt) -> None:
        row = self.writes.finish(job, a, self.runtime.memory_peak(job.id, a.number))
        if a.state.terminal:
            local_tier.remove(self.cfg, job)  # host RAM; the persistent copy outlives the job
        self.timeline.phase(row, "end_recorded")
        h = self.runtime.handles.get(job.id)
        mine = h is not None and h.number == a.number
        self.incidents.failed(job, a, s.ledger.gpus, h.files if mine and h else None, h.spawned_wall if mine and h else 0.0)
        self.runtime.attempt_over(job.id, a.number)

    def _record_stop(self, job: JobRow, s: TrackedJob, a: act.RecordStop) -> None:
        self.writes.record_stop(job, a)
        self.incidents.stop_began(job.id, a.number, str(a.cause))

    # --- tracking ------------------------------------------------------------------------------------

    def adopt(self, job: JobRow, row: AttemptRow) -> LauncherExited | None:
        return adoption.adopt(self.cfg, self.runtime, self.cgroups, job, row)

    def adopt_lost(self, job: JobRow, number: int) -> None:
        adoption.adopt_lost(self.runtime, job, number)

    def forget(self, job_id: int) -> None:
        """The supervisor is done with the job: everything held for it goes."""
        self.runtime.forget(job_id)
        self._running_ticks.pop(job_id, None)
        self.timeline.forget(job_id)
        self.gang.forget(job_id)
        self.incidents.forget(job_id)
        self.standbys.forget(job_id)
        self.work.forget(job_id)

    def close(self) -> None:
        """Standbys end (a next daemon starts its own); work off the loop finishes on its own deadline;
        the exit thread ends (a next daemon watches its adopted attempts' launchers by polling)."""
        self.standbys.close()
        self.runtime.exits.close()

    # --- views ---------------------------------------------------------------------------------------

    def child_pids(self) -> set[int]:
        """Our own children whose status Popen reads (launchers, relays, copiers, standbys): not for the reaper."""
        return self.runtime.children() | self.standbys.children() | self.staging.children()

    def attempt_cgroups(self) -> set[Path]:
        return self.runtime.cgroups() | self.standbys.cgroups_held()

    def live_pids(self, names: dict[int, str]) -> dict[str, list[int]]:
        return self.runtime.live_pids(names)

    def standby_pids(self) -> dict[int, tuple[int, ...]]:
        """job → its standby's monitor and relay (what its view reads the standby's memory from)."""
        return dict(self.standbys.processes())

    def gang_hosts(self, job_id: int) -> list[dict] | None:
        return self.gang.hosts.get(job_id)

    @property
    def last_restart(self) -> tuple[str, float, str] | None:
        return self.writes.last_restart

    @property
    def store_error(self) -> str | None:
        return self.writes.store_error

    @store_error.setter
    def store_error(self, error: str | None) -> None:
        self.writes.store_error = error
