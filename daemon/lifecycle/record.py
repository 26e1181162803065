"""What the machine knows of one tracked job: `TrackedJob`, a nested immutable value.

Its top level is what belongs together, each part changed as a whole:
- `job`: which job and what its spec and the config fix for its whole life (`Limits`);
- `phase` and its `clock` (a fresh clock at each phase change: when it began, when its slow work
  started in its owner's lane, whether that work answered);
- `ledger`: what outlives an attempt (the stored state, GPUs, attempt number, restarts and their
  classes, backoff, the little attempt history the crash-loop fallback needs);
- `attempt`: the current (or last) attempt, made fresh when it is spawned or adopted, so no field of
  an earlier attempt survives into the next one by being forgotten;
- `hang`: what the attempt's step intervals taught about its hang timeout (fresh per attempt too);
- `share`: a job across hosts, its place in the generation the hosts share;
- `pending`: store writes the store refused, re-emitted in order on the next tick.

All frozen dataclasses and enums, stdlib, core and state types only: tests build any value directly.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spx.daemon.contract.replay_verdict import ReplayVerdict
from spx.daemon.contract.worker_env import Divergence
from spx.daemon.core.causes import ReasonClass, StopCause, signal_name
from spx.daemon.core.restart_spec import Restart
from spx.daemon.lifecycle.resume_fallback import PastAttempt
from spx.daemon.state.states import JobState

if TYPE_CHECKING:
    from spx.daemon.lifecycle.actions import Action


class Phase(str, enum.Enum):
    BACKOFF = "backoff"          # between attempts: waiting out `backoff_remaining`
    READY = "ready"              # may start once the scheduler says Go (its GPUs are free)
    STAGING = "staging"          # copying the working set before the first attempt
    PREPARING = "preparing"      # the attempt's files made and its checkpoint found, then its launch (off the loop)
    RUNNING = "running"          # an attempt is alive
    DUMPING = "dumping"          # hung: its stacks being dumped (off the loop) before the stop
    STOPPING = "stopping"        # SIGTERM sent; SIGKILL once the grace is over
    EXITED = "exited"            # the launcher exited; leftovers get SIGKILL until none remain
    DIAGNOSING = "diagnosing"    # all gone; root cause / OOM being read (off the loop)
    AGREEING = "agreeing"        # a job across hosts: its end told to the other hosts (off the loop)
    DONE = "done"                # nothing left to supervise: the supervisor forgets the job

    @property
    def has_processes(self) -> bool:
        return self in (Phase.RUNNING, Phase.DUMPING, Phase.STOPPING, Phase.EXITED)

    @property
    def ending(self) -> bool:
        """The attempt's processes are gone and its end is being read or agreed (not yet recorded)."""
        return self in (Phase.DIAGNOSING, Phase.AGREEING)


@dataclass(frozen=True)
class Limits:
    """What the job's spec and the daemon's config fix for the whole job."""

    grace_seconds: float
    hang_timeout_seconds: float | None  # None: calibrated from the observed step intervals (running.hang_timeout)
    healthy_seconds: float
    restart: Restart
    stages: bool = False
    gang: bool = False      # the job spans hosts: attempt ends and restarts are agreed with the others
    standby: bool = False   # its launcher may be started ahead of its attempt (torchrun, DeepSpeed; the config allows)
    replay_of: str | None = None  # it replays this job's checkpoints (spec `replay:`): its end carries a verdict
    # A worker's abnormal death ends its attempt at once when it writes no heartbeat (a launcher
    # with rank workers, on one host, whose exit codes all restart: stopping.worker_died).
    worker_deaths_end: bool = False


@dataclass(frozen=True)
class WorkerExit:
    """One worker of an attempt ended abnormally: killed by `signal`, or exited with nonzero `code`.
    `rank`: its RANK, as its environment says (None: not readable)."""

    pid: int
    rank: int | None
    code: int | None
    signal: int | None

    def describe(self) -> str:
        """"worker rank 1 (pid 4242) killed by SIGKILL", "worker rank 0 (pid 4241) exited with code 3"."""
        who = f"worker rank {self.rank}" if self.rank is not None else "a worker"
        how = f"killed by {signal_name(self.signal)}" if self.signal is not None else f"exited with code {self.code}"
        return f"{who} (pid {self.pid}) {how}"


@dataclass(frozen=True)
class Identity:
    """Which job, and its limits."""

    id: int
    name: str
    limits: Limits


@dataclass(frozen=True)
class PhaseClock:
    """Monotonic times of the phase. Deadlines of the phase's slow work count from when that work
    *started* in its owner's lane (`work_since`; the phase's start until a later start is seen), never
    while it waits for one of its owner's slots (`waiting`)."""

    now: float = 0.0                 # the last observation
    since: float = 0.0               # the phase began
    work_since: float | None = None  # the phase's slow work started (after waiting for a slot)
    waiting: bool = False            # the phase's slow work waits for a slot of its owner's lane
    answered: bool = False           # PREPARING: the checkpoint was found; the launch is under way

    def overdue(self, now: float, seconds: float) -> bool:
        """The phase's slow work ran past `seconds` at `now` (from its start; never while it waits)."""
        if self.waiting or self.answered:
            return False
        return now - (self.work_since if self.work_since is not None else self.since) > seconds


@dataclass(frozen=True)
class Ledger:
    """What outlives an attempt."""

    job_state: JobState                  # as stored (or being stored by this step's actions)
    gpus: tuple[int, ...] = ()
    number: int = 0                      # the current / last attempt's number
    restarts: int = 0                    # earlier attempts that ended by the job's own fault
    class_counts: tuple[tuple[str, int], ...] = ()  # those, by failure class (restart.on_failure)
    backoff_level: int = 0
    no_progress_streak: int = 0
    backoff_remaining: float = 0.0
    staged: bool = False
    daemon_stopping: bool = False
    history: tuple[PastAttempt, ...] = ()  # what the crash-loop fallback reads (resume_fallback.remember)
    # A replay of its checkpoints differed at this step ("what" differed): the next attempt's discovery
    # sets aside every checkpoint at or after it (a GPU computed them wrong) and resumes from before it.
    reject: tuple[int, str] | None = None


@dataclass(frozen=True)
class Resume:
    """Where an attempt starts from: the checkpoint discovery chose (None: fresh)."""

    path: str | None = None
    step: int | None = None
    fell_back: bool = False  # discovery passed over the newest checkpoint (the crash-loop fallback)


@dataclass(frozen=True)
class Attempt:
    """The current (or last) attempt. PREPARING fills in `resume`; the spawn makes a fresh one."""

    resume: Resume = Resume()
    started: float | None = None         # monotonic
    started_wall: float = 0.0            # heartbeats older than this are a previous attempt's
    last_step: int | None = None
    last_progress: float | None = None
    last_activity: float | None = None   # monotonic: last ActivitySeen(active) (no-heartbeat hang clock)
    last_beat_time: float = 0.0
    beat_status: str | None = None
    standby_asked: bool = False          # the next attempt's launcher was asked for (StartStandby)
    stop_cause: StopCause | None = None
    cancelled_by: str | None = None      # who cancelled (the attempt's reason says so, not "a failure")
    hang_idle: float | None = None
    gpu_fault: str | None = None         # stop_cause gpu-fault: the fault seen (e.g. "XID 79 on GPU 3 (...)")
    handed_to: str | None = None         # stop_cause lease-lost: the host that took the job's lease
    worker: WorkerExit | None = None     # stop_cause worker-died: the worker whose death ended it
    term_at: float | None = None
    kill_at: float | None = None
    exited_at: float | None = None
    exited_wall: float | None = None     # the monitor's recorded end, for an exit no daemon saw
    warned_at: float | None = None
    exit_code: int | None = None
    exit_signal: int | None = None
    root_cause: str | None = None
    oom: bool = False
    diverged: Divergence | None = None   # its "diverged" heartbeat's (or the daemon's NaN rule's) evidence
    corrupted: tuple[int, str] | None = None  # stop_cause corruption: (step, what) the replay found different
    replay: ReplayVerdict | None = None  # a replay job's verdict, from its last heartbeat

    @property
    def progressed(self) -> bool:
        if self.last_step is None:
            return False
        return self.resume.step is None or self.last_step > self.resume.step


@dataclass(frozen=True)
class HangCalibration:
    """The attempt's step intervals as seen through its heartbeat (running.hang_timeout reads them)."""

    step_changes: int = 0                # step changes seen this attempt (the first two are warm-up)
    intervals: tuple[float, ...] = ()    # the recent seconds between step changes
    longest: float = 0.0                 # the longest of them this attempt


@dataclass(frozen=True)
class GangTurn:
    """A generation of a job across hosts (userfs/gang_dir.py): the round every host's share runs
    in, and why it began — the decision of the host whose attempt ended the round before."""

    gen: int
    by: str = ""                       # the host that began it (its label)
    reason: str = ""
    counted: bool = False              # that host counted the failure (the others never do)
    delay: float = 0.0                 # seconds (from when it was read) until a relaunch may start
    final: JobState | None = None      # the job ended for good there (failed, cancelled): here too


@dataclass(frozen=True)
class Share:
    """A job across hosts (limits.gang): this host's share of the generation the hosts run in."""

    generation: int | None = None        # the generation the current / last attempt ran in
    peer: GangTurn | None = None         # the newer generation another host began, which ends this attempt
    agreed: bool = False                 # AGREEING is over for this attempt (answered, or given up on)
    missing_host: str | None = None      # the last beat found a host gone past nodes.host_timeout_seconds
    beat_at: float | None = None         # monotonic: the last beat was asked for (None: none this attempt)
    beating: bool = False                # a beat is under way (one at a time: a slow shared dir must not pile them up)

    def fresh(self) -> Share:
        """The share of a new attempt: its generation stays (the attempt joined it), the rest is new."""
        return Share(generation=self.generation)


@dataclass(frozen=True)
class TrackedJob:
    """One tracked job (see the module doc for its parts)."""

    job: Identity
    phase: Phase
    ledger: Ledger
    clock: PhaseClock = PhaseClock()
    attempt: Attempt = Attempt()
    hang: HangCalibration = HangCalibration()
    share: Share = Share()
    pending: tuple[Action, ...] = ()     # store writes (actions.STORE_ACTIONS) to re-emit on the next tick

    @property
    def ready(self) -> bool:
        """May the scheduler start it now? (Backoff over, no write pending.)"""
        return self.phase is Phase.READY and not self.pending

    @property
    def number(self) -> int:
        return self.ledger.number

    @property
    def limits(self) -> Limits:
        return self.job.limits


def counted_classes(counts: tuple[tuple[str, int], ...], cls: ReasonClass) -> tuple[tuple[str, int], ...]:
    """`counts` with one more attempt of class `cls`."""
    out = dict(counts)
    out[cls] = out.get(cls, 0) + 1
    return tuple(sorted((str(k), v) for k, v in out.items()))
