"""The supervisor: the loop over tracked jobs — each job's observations to its state machine
(lifecycle.machine), the actions it returns to the executor — with every fault contained to its job
(job_turns.py).

Runs on the daemon's main loop thread only (it is the store's writer). A job is tracked from the
moment the scheduler starts it (or, at daemon start, from the store: tracking.recovered) until its
machine reaches DONE with no write pending. `tick` first takes the answers of work done off the loop
in the owners' lanes (the executor's `results`), then asks the executor what changed for each job,
and at its end publishes an immutable `snapshot()` for readers on other threads. The executor is
any object with the executor's methods: tests drive this loop with a scripted one and a fake clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from spx.daemon.core.config import DaemonConfig
from spx.daemon.core.lanes import Lanes
from spx.daemon.core.log import get_logger
from spx.daemon.lifecycle.actions import Action
from spx.daemon.lifecycle.observations import (
    CancelRequested,
    DaemonStopping,
    Go,
    GpuFault,
    LauncherExited,
    LeaseLost,
    Observation,
)
from spx.daemon.lifecycle.record import Phase, TrackedJob
from spx.daemon.run import cgroups, snapshot, tracking
from spx.daemon.run.device_filter import DeviceFilters
from spx.daemon.run.executor import Executor
from spx.daemon.run.incidents import GpuSources
from spx.daemon.run.job_turns import JobTurns
from spx.daemon.run.scheduler import Start, Waiting
from spx.daemon.state.attempts_table import AttemptRow
from spx.daemon.state.jobs_table import JobRow
from spx.daemon.state.states import JobState
from spx.daemon.state.store import Store

log = get_logger()


class Effects(Protocol):
    """What the supervisor asks of its executor (run/executor.py is the real one). `perform` does the
    actions as lifecycle.failures.in_order says (in order, no write after a refused one) and never
    raises."""

    store_error: str | None

    @property
    def last_restart(self) -> tuple[str, float, str] | None: ...
    def begin_turn(self) -> None: ...
    def results(self) -> list[tuple[int, Observation]]: ...
    def observe(self, job: JobRow, s: TrackedJob) -> list[Observation]: ...
    def perform(self, job: JobRow, s: TrackedJob, actions: list[Action]) -> list[Observation]: ...
    def adopt(self, job: JobRow, row: AttemptRow) -> LauncherExited | None: ...
    def adopt_lost(self, job: JobRow, number: int) -> None: ...
    def forget(self, job_id: int) -> None: ...
    def close(self) -> None: ...
    def child_pids(self) -> set[int]: ...
    def attempt_cgroups(self) -> set[Path]: ...
    def live_pids(self, names: dict[int, str]) -> dict[str, list[int]]: ...
    def standby_pids(self) -> dict[int, tuple[int, ...]]: ...
    def gang_hosts(self, job_id: int) -> list[dict] | None: ...


class Supervisor:
    def __init__(self, cfg: DaemonConfig, store: Store, cgroup_tree: cgroups.CgroupTree | None = None,
                 wake: Callable[[], None] = lambda: None, clock: Callable[[], float] = time.monotonic,
                 gpu_computing: Callable[[int], bool | None] | None = None, lanes: Lanes | None = None,
                 executor: Effects | None = None, wall: Callable[[], float] = time.time,
                 device_filters: DeviceFilters | None = None, gpu_sources: GpuSources | None = None,
                 quarantine: Callable[[int, str], None] | None = None):
        self.cfg = cfg
        self.store = store
        self.cgroups = cgroup_tree  # None: attempts are found by tag and process group only
        self.clock = clock
        self.wall = wall
        # Lanes made here (none given) are this supervisor's to close.
        self._own_lanes = lanes is None and executor is None
        self.lanes = lanes or Lanes(cfg.user_work.slots_total, cfg.user_work.slots_per_owner, wake, clock)
        self.executor: Effects = executor if executor is not None else Executor(
            cfg, store, self.lanes, cgroup_tree, wake=wake, wall=wall, clock=clock, gpu_computing=gpu_computing,
            device_filters=device_filters, gpu_sources=gpu_sources, quarantine=quarantine)
        self.turns = JobTurns(self.executor, clock)
        self.records = self.turns.records  # job → its machine's value
        self.jobs = self.turns.jobs        # job → the row it was loaded from (its spec, owner)
        self.adopted = 0  # attempts the last `recover` found running and took on as they are
        self._snapshot = snapshot.Snapshot()

    # --- tracking --------------------------------------------------------------------------------------

    def recover(self) -> None:
        """At daemon start: every starting, running or restarting job of the store is tracked again
        (tracking.recovered); `adopted` counts the attempts found running and taken on as they are."""
        now = self.clock()
        self.adopted = 0
        for job in self.store.jobs.live():
            if job.state is JobState.QUEUED:
                continue

            def recover_one(job: JobRow = job) -> None:
                record, actions, running = tracking.recovered(job, self.cfg, self.store, self.executor, now, self.wall)
                self.adopted += running
                self.turns.begin(job, record, actions)

            self.turns.guarded(job, recover_one)

    def start(self, s: Start) -> None:
        """The scheduler's decision: a queued job placed on `s.gpus`, or a waiting one relaunched."""
        if s.job is not None:
            job = s.job
            self.turns.begin(job, tracking.placed(job, self.cfg, self.store, s.gpus, self.clock()), [])
        self.feed(s.job_id, Go(s.gpus))

    def feed(self, job_id: int, obs: Observation) -> None:
        self.turns.feed(job_id, [obs])

    def tick(self) -> None:
        """One turn for every tracked job: answers of work done off the loop first, then what the
        executor sees; then the snapshot readers see."""
        self.executor.begin_turn()
        for job_id, obs in self.executor.results():
            if job_id in self.records:
                self.feed(job_id, obs)
            else:  # the answer to a question of a job no longer tracked (cancelled meanwhile)
                self.executor.forget(job_id)
        for job_id in list(self.records):
            job = self.jobs[job_id]

            def observe(job: JobRow = job) -> None:
                seen = self.executor.observe(job, self.records[job.id])
                if seen:  # nothing seen (a running attempt between its Ticks): nothing to advance
                    self.turns.feed(job.id, seen)

            self.turns.guarded(job, observe)
        pids = self.executor.live_pids({j: job.name for j, job in self.jobs.items()})
        self._snapshot = snapshot.take(self.records, pids, {j: self.executor.gang_hosts(j) for j in self.records},
                                       self.last_restart, self.executor.standby_pids())

    # --- requests --------------------------------------------------------------------------------------

    def cancel(self, job: JobRow, by: str) -> str:
        """Cancel: a job without processes ends at once; a live attempt gets its grace period."""
        s = self.records.get(job.id)
        if s is None:  # queued: never started
            self.store.jobs.transition(job.id, JobState.CANCELLED, f"cancelled by {by}", self.wall(), gpus=[])
            log.info("cancelled", job=job.name, attempt=None, by=by)
            return f"cancelled {job.name}"
        had_processes = s.phase.has_processes
        self.feed(job.id, CancelRequested(by))
        if had_processes:
            return f"cancelling {job.name}: SIGTERM sent, {s.limits.grace_seconds:.0f} s grace to checkpoint"
        after = self.records.get(job.id)
        if after is not None and after.phase is Phase.PREPARING:
            return f"cancelling {job.name}: its launch is under way; killed as it lands"
        return f"cancelled {job.name}"

    def stop_all(self) -> float:
        """Daemon shutdown: every attempt gets SIGTERM and its grace. Returns the longest grace."""
        for job_id in list(self.records):
            self.feed(job_id, DaemonStopping())
        return max((s.limits.grace_seconds for s in self.records.values() if s.phase.has_processes), default=0.0)

    def close(self, wait: bool = False) -> None:
        """Standbys end; lanes made here close (`wait`: for the work still running, up to 30 s)."""
        self.executor.close()
        if self._own_lanes:
            self.lanes.close(30.0 if wait else 0.0)

    def gpu_fault(self, gpu: int, detail: str) -> None:
        """A fatal fault on GPU `gpu` (quarantined already): the attempt running on it is stopped."""
        for job_id, s in list(self.records.items()):
            if gpu in s.ledger.gpus and s.phase in (Phase.RUNNING, Phase.DUMPING):
                self.feed(job_id, GpuFault(gpu, detail))

    def lease_lost(self, job_id: int, holder: str) -> None:
        """Another host took the job's lease (the lease keeper saw it): its attempt here is stopped and
        the job ends here as handed over to `holder` (lifecycle: LeaseLost)."""
        self.feed(job_id, LeaseLost(holder))

    def sweep_cgroups(self) -> None:
        """Attempt cgroups of no live attempt (left by an earlier daemon, or not yet empty when
        their attempt ended): kill what is in them, remove them once empty."""
        if self.cgroups is None:
            return
        killed, removed = cgroups.sweep(self.cgroups, self.executor.attempt_cgroups())
        for cg in killed:
            log.warning("stray_attempt_cgroup_killed", job=None, attempt=None, cgroup=str(cg))
        if removed:
            log.info("stale_attempt_cgroups_removed", job=None, attempt=None, cgroups=[cg.name for cg in removed])

    # --- what others read -------------------------------------------------------------------------------

    def snapshot(self) -> snapshot.Snapshot:
        """The immutable summary published at the end of the last turn: safe on any thread."""
        return self._snapshot

    @property
    def busy(self) -> int:
        """Jobs whose attempt still has processes (or is being recorded): what a shutdown waits for."""
        return sum(1 for s in self.records.values() if s.phase.has_processes or s.phase.ending)

    def settled(self) -> bool:
        """Every tracked job's attempt is running with no store write to retry: what is left to watch
        is polled once a second (the loop may wait that long: service/cadence.py)."""
        return all(s.phase is Phase.RUNNING and not s.pending for s in self.records.values())

    def exiting(self) -> bool:
        """An attempt's launcher has exited and its last processes are awaited: its workers, orphaned
        when their launcher was killed with them, are the daemon's (a subreaper's) to reap, and each
        one's zombie holds its process group alive until then — the loop reaps each turn meanwhile."""
        return any(s.phase is Phase.EXITED for s in self.records.values())

    def waiting(self) -> list[Waiting]:
        out = []
        for s in self.records.values():
            if s.ready:
                want = self.jobs[s.job.id].spec.gpus
                out.append(Waiting(s.job.id, s.ledger.gpus, None if isinstance(want, list) else want))
        return out

    def held_gpus(self) -> set[int]:
        return {g for s in list(self.records.values()) for g in s.ledger.gpus}

    def store_problem(self) -> str | None:
        """The store's last refusal while some job still has a write waiting for it, else None."""
        return self.executor.store_error if any(s.pending for s in self.records.values()) else None

    def tracked(self) -> set[int]:
        return set(self.records)

    @property
    def last_restart(self) -> tuple[str, float, str] | None:
        return self.executor.last_restart

    def child_pids(self) -> set[int]:
        return self.executor.child_pids()
