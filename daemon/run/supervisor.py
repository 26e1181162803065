"""The supervisor: one loop that feeds each tracked job's observations to the step function and
hands the actions it returns to the executor — and contains every fault to its job.

Runs on the daemon's main loop thread only (it is the store's writer). A job is tracked from the
moment the scheduler starts it (or, at daemon start, from the store) until its step reaches DONE.
`tick` asks the executor what changed for each job (results of slow work, heartbeats, exits), and
runs `step` → actions → observations until nothing is left to do. An exception anywhere in one
job's turn — a bug in the step function, an error the executor did not expect — is logged once with
`job` and `attempt`, and the job fails with the error as its reason (`step.fault`); the other jobs,
and the daemon, go on.
"""

from __future__ import annotations

import functools
import time
import traceback
from collections import deque
from collections.abc import Callable

from spx.daemon.core.config import DaemonConfig
from spx.daemon.core.log import get_logger
from spx.daemon.run import cgroups, step, step_types
from spx.daemon.run.device_filter import DeviceFilters
from spx.daemon.run.executor import Executor
from spx.daemon.run.scheduler import Start, Waiting
from spx.daemon.staging.runner import staging_done
from spx.daemon.state.db import StoreUnavailable
from spx.daemon.state.jobs_table import JobRow
from spx.daemon.state.states import JobState
from spx.daemon.state.store import Store

log = get_logger()
# Observations one job may cause in one turn: a step function that keeps answering itself is a bug.
MAX_CHAIN = 64


def limits_of(job: JobRow, cfg: DaemonConfig) -> step_types.Limits:
    return step_types.Limits(grace_seconds=job.spec.stop.grace_seconds,
                       hang_timeout_seconds=job.spec.restart.hang_timeout_seconds,
                       healthy_seconds=cfg.healthy_seconds, restart=job.spec.restart,
                       stages=job.spec.data.stage is not None, gang=job.spec.nodes.count > 1)


class Supervisor:
    def __init__(self, cfg: DaemonConfig, store: Store, cgroup_tree: cgroups.CgroupTree | None = None,
                 wake: Callable[[], None] = lambda: None, clock: Callable[[], float] = time.monotonic,
                 gpu_computing: Callable[[int], bool | None] | None = None,
                 device_filters: DeviceFilters | None = None):
        self.cfg = cfg
        self.store = store
        self.cgroups = cgroup_tree  # None: attempts are found by tag and process group only
        self.clock = clock
        self.executor = Executor(cfg, store, cgroup_tree, wake=wake, clock=clock, gpu_computing=gpu_computing,
                                 device_filters=device_filters)
        self.steps: dict[int, step_types.JobStep] = {}
        self.jobs: dict[int, JobRow] = {}  # the row each tracked job was loaded from (its spec, owner)
        self.adopted = 0  # attempts the last `recover` found running and took on as they are

    # --- tracking --------------------------------------------------------------------------------------

    def recover(self) -> None:
        """At daemon start: every starting, running or restarting job of the store is tracked again.
        An attempt still running is adopted as it is (`adopted` counts them); one that ended while
        no daemon watched is decided on the exit its monitor recorded; a backoff resumes with its
        stored remaining seconds."""
        now = self.clock()
        self.adopted = 0
        for job in self.store.jobs.live():
            if job.state is JobState.QUEUED:
                continue
            self._guarded(job, functools.partial(self._recover_one, job, now))

    def _recover_one(self, job: JobRow, now: float) -> None:
        attempts = self.store.attempts.for_job(job.id)
        faults = self.store.attempts.faults_by_class(job.id)
        base = step.placed(job.id, job.name, limits_of(job, self.cfg), job.state, tuple(job.gpus),
                           number=len(attempts), restarts=sum(faults.values()), class_counts=faults,
                           backoff_level=job.backoff_level, no_progress_streak=job.no_progress_streak,
                           backoff_remaining=job.backoff_remaining if job.state is JobState.RESTARTING else 0.0,
                           staged=staging_done(job.staging), now=now,
                           generation=attempts[-1].generation if attempts else None)
        self.jobs[job.id] = job
        self.steps[job.id] = base
        open_att = self.store.attempts.open_for(job.id)
        if open_att is None and job.state is JobState.RUNNING:
            # Running without an open attempt (its row never made it): nothing to find; lost, and
            # relaunched through the step (so a store that refuses the write now gets it retried).
            self.executor.adopt_lost(job, base.number)
            state, actions = step.adopted(base, base.number, time.time(), None, now,
                                          ended=step_types.LauncherExited(None, None, lost=True))
            self.steps[job.id] = state
            self._run(job.id, deque(), actions)
            return
        if open_att is None:
            log.info("resumed_after_restart", job=job.name, attempt=None, state=job.state.value,
                     backoff_remaining=round(base.backoff_remaining, 1))
            return
        ended = self.executor.adopt(job, open_att.number, open_att.id, open_att.attempt_id, open_att.pgid,
                                    open_att.boot_id, open_att.start_ticks)
        if open_att.exited is not None:  # the old daemon saw its launcher exit and stored how
            ended = step_types.LauncherExited(open_att.exit_code, open_att.signal, ended_wall=open_att.exited)
        self.adopted += ended is None
        state, actions = step.adopted(base, open_att.number, open_att.start, open_att.resumed_from_step, now,
                                      ran_seconds=time.time() - open_att.start, stop_cause=open_att.stop_cause,
                                      ended=ended, generation=open_att.generation)
        self.steps[job.id] = state
        self._run(job.id, deque(), actions)

    def start(self, s: Start) -> None:
        """The scheduler's decision: a queued job placed on `s.gpus`, or a waiting one relaunched."""
        now = self.clock()
        if s.job is not None:
            job = s.job
            self.jobs[job.id] = job
            faults = self.store.attempts.faults_by_class(job.id)
            self.steps[job.id] = step.placed(job.id, job.name, limits_of(job, self.cfg), job.state, s.gpus,
                                             number=len(self.store.attempts.for_job(job.id)),
                                             restarts=sum(faults.values()), class_counts=faults,
                                             backoff_level=job.backoff_level,
                                             no_progress_streak=job.no_progress_streak,
                                             staged=staging_done(job.staging), now=now)
        self.feed(s.job_id, step_types.Go(s.gpus))

    def feed(self, job_id: int, obs: step_types.Observation) -> None:
        job = self.jobs.get(job_id)
        if job is not None:
            self._guarded(job, lambda: self._run(job_id, deque([obs]), []))

    def tick(self) -> None:
        """One turn for every tracked job: results of slow work first, then what the executor sees."""
        self.executor.begin_turn()
        for job_id, obs in self.executor.results():
            if job_id in self.steps:
                self.feed(job_id, obs)
            else:  # the answer to a question of a job no longer tracked (cancelled meanwhile)
                self.executor.forget(job_id)
        for job_id in list(self.steps):
            job = self.jobs[job_id]
            self._guarded(job, functools.partial(self._turn, job))

    def _turn(self, job: JobRow) -> None:
        self._run(job.id, deque(self.executor.observe(job, self.steps[job.id])), [])

    def _run(self, job_id: int, pending: deque[step_types.Observation], actions: list[step_types.Action]) -> None:
        """Step through `pending` observations, performing each step's actions (whose immediate
        results join the queue), until none is left."""
        job = self.jobs[job_id]
        for _ in range(MAX_CHAIN):
            refused = False
            for a in actions:
                if refused and isinstance(a, step_types.STORE_ACTIONS):
                    # The store just refused a write: later ones wait behind it, in order.
                    pending.append(step_types.ActionFailed(a, "waiting for an earlier write", retry=True))
                    continue
                results = self.executor.perform(job, self.steps[job_id], a)
                refused = refused or any(isinstance(r, step_types.ActionFailed) and r.retry for r in results)
                pending.extend(results)
            if not pending:
                break
            self.steps[job_id], actions = step.step(self.steps[job_id], pending.popleft(), self.clock())
        else:
            raise RuntimeError(f"step function did not settle in {MAX_CHAIN} observations")
        s = self.steps[job_id]
        if s.phase is step_types.Phase.DONE and not s.retry:
            self._forget(job_id)

    def _forget(self, job_id: int) -> None:
        self.steps.pop(job_id, None)
        self.jobs.pop(job_id, None)
        self.executor.forget(job_id)

    def _guarded(self, job: JobRow, turn: Callable[[], None]) -> None:
        """Containment: whatever one job's turn raises fails that job, not the daemon."""
        try:
            turn()
        except StoreUnavailable as e:
            # Not the job's fault: its state is kept and the turn is tried again on the next tick.
            self.executor.store_error = str(e)
            log.warning("store_unavailable_during_turn", job=job.name, attempt=None, error=str(e))
        except Exception as e:  # noqa: BLE001 — the point: no job's fault ends the loop
            s = self.steps.get(job.id)
            error = f"{type(e).__name__}: {e}"
            log.error("job_fault_contained", job=job.name, attempt=s.number if s else None, error=error,
                      traceback=traceback.format_exc(limit=8))
            if s is None or s.phase is step_types.Phase.DONE:
                self._forget(job.id)
                return
            try:
                self.steps[job.id], actions = step.fault(s, error, self.clock())
                self._run(job.id, deque(), actions)
            except Exception as e2:  # noqa: BLE001 — even failing it failed: forget it; the next daemon adopts it
                log.error("job_fault_unrecorded", job=job.name, attempt=s.number, error=f"{type(e2).__name__}: {e2}")
                self._forget(job.id)

    # --- requests --------------------------------------------------------------------------------------

    def cancel(self, job: JobRow, by: str) -> str:
        """Cancel: a job without processes ends at once; a live attempt gets its grace period."""
        s = self.steps.get(job.id)
        if s is None:  # queued: never started
            self.store.jobs.transition(job.id, JobState.CANCELLED, f"cancelled by {by}", time.time(), gpus=[])
            log.info("cancelled", job=job.name, attempt=None, by=by)
            return f"cancelled {job.name}"
        had_processes = s.phase.has_processes
        self.feed(job.id, step_types.CancelRequested(by))
        if had_processes:
            return f"cancelling {job.name}: SIGTERM sent, {s.limits.grace_seconds:.0f} s grace to checkpoint"
        return f"cancelled {job.name}"

    def stop_all(self) -> float:
        """Daemon shutdown: every attempt gets SIGTERM and its grace. Returns the longest grace."""
        for job_id in list(self.steps):
            self.feed(job_id, step_types.DaemonStopping())
        return max((s.limits.grace_seconds for s in self.steps.values() if s.phase.has_processes), default=0.0)

    def close(self, wait: bool = False) -> None:
        self.executor.close(wait)

    # --- what others read -------------------------------------------------------------------------------

    @property
    def busy(self) -> int:
        """Jobs whose attempt still has processes (or is being recorded): what a shutdown waits for."""
        return sum(1 for s in self.steps.values()
                   if s.phase.has_processes or s.phase in (step_types.Phase.DIAGNOSING, step_types.Phase.AGREEING))

    def waiting(self) -> list[Waiting]:
        out = []
        for s in self.steps.values():
            if s.ready:
                want = self.jobs[s.job_id].spec.gpus
                out.append(Waiting(s.job_id, s.gpus, None if isinstance(want, list) else want))
        return out

    def gpu_fault(self, gpu: int, detail: str) -> None:
        """A fatal fault on GPU `gpu` (quarantined already): the attempt running on it is stopped
        (step: GpuFault)."""
        for job_id, s in list(self.steps.items()):
            if gpu in s.gpus and s.phase in (step_types.Phase.RUNNING, step_types.Phase.DUMPING):
                self.feed(job_id, step_types.GpuFault(gpu, detail))

    def lease_lost(self, job_id: int, holder: str) -> None:
        """Another host took the job's lease (the lease keeper saw it): its attempt here is stopped and
        the job ends here as handed over to `holder` (step: LeaseLost)."""
        self.feed(job_id, step_types.LeaseLost(holder))

    def held_gpus(self) -> set[int]:
        return {g for s in list(self.steps.values()) for g in s.gpus}

    def store_problem(self) -> str | None:
        """The store's last refusal while some job still has a write waiting for it, else None."""
        pending = any(s.retry for s in self.steps.values()) or any(h.deferred for h in self.executor.handles.values())
        return self.executor.store_error if pending else None

    def tracked(self) -> set[int]:
        return set(self.steps)

    @property
    def last_restart(self) -> tuple[str, float, str] | None:
        return self.executor.last_restart

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

    def gang_hosts(self, job_id: int) -> list[dict] | None:
        """A job across hosts: every host's line in its shared dir, as last read (run/gang.py)."""
        return self.executor.gang_hosts.get(job_id)

    def live_pids(self) -> dict[str, list[int]]:
        return self.executor.live_pids({j: job.name for j, job in list(self.jobs.items())})

    def child_pids(self) -> set[int]:
        return self.executor.child_pids()
