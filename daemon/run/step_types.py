"""The values the supervisor's step function works on: a tracked job's state (`JobStep`, its
`Phase`, its `Limits`), what the executor observed (`Observation`) and what it must do (`Action`).

All frozen dataclasses and enums, stdlib and spec types only, so `run/step.py` stays the one place
that changes them and tests can build any state or script any observation without processes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from spx.daemon.core.spec import Restart
from spx.daemon.state.states import JobState


class Phase(str, enum.Enum):
    BACKOFF = "backoff"          # between attempts: waiting out `backoff_remaining`
    READY = "ready"              # may start once the scheduler says Go (its GPUs are free)
    STAGING = "staging"          # copying the working set before the first attempt
    PREPARING = "preparing"      # the attempt's files made, its checkpoint being found (off the loop)
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


@dataclass(frozen=True)
class Limits:
    """What the job's spec and the daemon's config fix for the whole job."""

    grace_seconds: float
    hang_timeout_seconds: float | None  # None: calibrated from the observed step intervals (step.hang_timeout)
    healthy_seconds: float
    restart: Restart
    stages: bool = False
    gang: bool = False  # the job spans hosts: attempt ends and restarts are agreed with the others


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
class JobStep:
    """One tracked job. Attempt fields describe the current (or last) attempt."""

    job_id: int
    name: str
    limits: Limits
    phase: Phase
    job_state: JobState                  # as stored (or being stored by this step's actions)
    gpus: tuple[int, ...] = ()
    number: int = 0                      # the current / last attempt's number
    restarts: int = 0                    # earlier attempts that ended by the job's own fault
    class_counts: tuple[tuple[str, int], ...] = ()  # those, by failure class (restart.on_failure)
    backoff_level: int = 0
    no_progress_streak: int = 0
    backoff_remaining: float = 0.0
    clock: float = 0.0                   # monotonic time of the last observation
    phase_since: float = 0.0
    staged: bool = False
    checkpoint_found: bool = False       # PREPARING: discovery answered (a Spawn may wait on the store)
    daemon_stopping: bool = False
    retry: tuple[Action, ...] = ()       # store writes to re-emit on the next tick
    # --- the attempt ---
    started: float | None = None         # monotonic
    started_wall: float = 0.0            # heartbeats older than this are a previous attempt's
    resumed_from_step: int | None = None
    last_step: int | None = None
    last_progress: float | None = None
    last_activity: float | None = None   # monotonic: last ActivitySeen(active) (no-heartbeat hang clock)
    step_changes: int = 0                # step changes seen this attempt (the first two are warm-up)
    step_intervals: tuple[float, ...] = ()  # the recent seconds between step changes, for hang_timeout
    longest_interval: float = 0.0        # the longest of them this attempt
    last_beat_time: float = 0.0
    beat_status: str | None = None
    stop_cause: str | None = None
    cancelled_by: str | None = None      # who cancelled (the attempt's reason says so, not "a failure")
    hang_idle: float | None = None
    gpu_fault: str | None = None         # stop_cause "gpu-fault": the fault seen (e.g. "XID 79 on GPU 3 (...)")
    term_at: float | None = None
    kill_at: float | None = None
    exited_at: float | None = None
    exited_wall: float | None = None     # the monitor's recorded end, for an exit no daemon saw
    warned_at: float | None = None
    exit_code: int | None = None
    exit_signal: int | None = None
    root_cause: str | None = None
    oom: bool = False
    # --- across hosts (limits.gang) ---
    generation: int | None = None        # the generation the current / last attempt ran in
    peer: GangTurn | None = None         # the newer generation another host began, which ends this attempt
    agreed: bool = False                 # AGREEING is over for this attempt (answered, or given up on)
    missing_host: str | None = None      # the last beat found a host gone past nodes.host_timeout_seconds
    handed_to: str | None = None         # another host took the job's lease (LeaseLost): the job lives on there

    @property
    def ready(self) -> bool:
        """May the scheduler start it now? (Backoff over, no write pending.)"""
        return self.phase is Phase.READY and not self.retry

    @property
    def progressed(self) -> bool:
        if self.last_step is None:
            return False
        return self.resumed_from_step is None or self.last_step > self.resumed_from_step


# --- observations: what the executor saw ----------------------------------------------------------


@dataclass(frozen=True)
class Tick:
    """Time passed (every loop turn)."""


@dataclass(frozen=True)
class Go:
    """The scheduler: start now on `gpus` (the job's own, for a relaunch)."""

    gpus: tuple[int, ...]


@dataclass(frozen=True)
class StagingEnded:
    ok: bool
    reason: str


@dataclass(frozen=True)
class CheckpointFound:
    """Checkpoint discovery (as the user, off the loop) is done; `path` None: start fresh. Across
    hosts, `generation` is the round the attempt joins, or `final` the one that ended the job."""

    path: str | None
    step: int | None
    number: int
    generation: int | None = None
    final: GangTurn | None = None


@dataclass(frozen=True)
class Spawned:
    """The launcher exec'd; `wall` is the attempt's start in Unix time."""

    pid: int
    wall: float


@dataclass(frozen=True)
class HeartbeatSeen:
    step: int
    time: float
    status: str


@dataclass(frozen=True)
class LauncherExited:
    """The launcher (the attempt monitor, process-group leader) exited with `code` or by `signal`.

    For an attempt adopted from an earlier daemon (not our child) this is what its monitor recorded
    (launcher.recorded_exit): `launched` False when the argv was never exec'd (the shim failed, so the
    exit is not the job's), `stopped` when a stop signal reached it before it ended. `lost`: the
    monitor is gone and recorded nothing (it was killed with the attempt) — how it ended is unknown."""

    code: int | None
    signal: int | None
    launched: bool = True
    stopped: bool = False
    lost: bool = False
    ended_wall: float | None = None  # when it ended (Unix seconds), if it ended while no daemon watched


@dataclass(frozen=True)
class ActivitySeen:
    """For an attempt without heartbeat progress: whether any of its GPUs computed, or its log grew,
    since the last look (the executor looks every few seconds)."""

    active: bool


@dataclass(frozen=True)
class AllGone:
    """No process of the attempt is left (cgroup, tag and group all empty)."""


@dataclass(frozen=True)
class StacksDumped:
    number: int


@dataclass(frozen=True)
class Diagnosed:
    number: int
    root_cause: str | None
    oom: bool


@dataclass(frozen=True)
class CancelRequested:
    by: str


@dataclass(frozen=True)
class GpuFault:
    """A fatal fault on one of the attempt's GPUs (an XID seen by the XID thread); the GPU is
    quarantined already. `detail`: what was seen, e.g. "XID 79 on GPU 3 (GPU fell off the bus)"."""

    gpu: int
    detail: str


@dataclass(frozen=True)
class GangSeen:
    """Across hosts, read while the attempt runs: the generation now (a newer one than the
    attempt's: another host ended its round)."""

    turn: GangTurn
    missing: str | None = None  # a host gone (or never come) longer than nodes.host_timeout_seconds: why


@dataclass(frozen=True)
class GenerationAgreed:
    """The answer to AgreeGeneration: `won`, this host began the next generation (its decision
    stands); else `turn` is the one another host began first (its decision applies here too)."""

    number: int
    won: bool
    turn: GangTurn | None


@dataclass(frozen=True)
class LeaseLost:
    """Another host took the job's lease (`.spx/lease`): it adopted the job while this host could
    not renew (a partition, a hung volume, a stopped daemon), and runs it now. `holder`: that host."""

    holder: str


@dataclass(frozen=True)
class DaemonStopping:
    """The daemon shuts down: attempts get SIGTERM and their grace; nothing new starts."""


@dataclass(frozen=True)
class ActionFailed:
    """An action raised. `retry`: the store could not take a write now (re-emit it next tick)."""

    action: Action
    error: str
    retry: bool = False


Observation = (Tick | Go | StagingEnded | CheckpointFound | Spawned | HeartbeatSeen | ActivitySeen | LauncherExited | AllGone
               | StacksDumped | Diagnosed | CancelRequested | GpuFault | GangSeen | GenerationAgreed | LeaseLost
               | DaemonStopping | ActionFailed)


# --- actions: what the executor must do ------------------------------------------------------------


@dataclass(frozen=True)
class MarkStarting:
    """Store: the job → starting on `gpus` (one transaction)."""

    gpus: tuple[int, ...]
    reason: str


@dataclass(frozen=True)
class StartStaging:
    pass


@dataclass(frozen=True)
class StopStaging:
    pass


@dataclass(frozen=True)
class FindCheckpoint:
    """Make attempt `number`'s files (as the user), then find the checkpoint to resume from (off the
    loop, as the user). Answers CheckpointFound."""

    number: int


@dataclass(frozen=True)
class Spawn:
    """Store the attempt row, make its cgroup, spawn it, store its pid (boot id, start time) and the
    job → running. Answers Spawned, or ActionFailed."""

    number: int
    resume_from: str | None
    resume_step: int | None


@dataclass(frozen=True)
class SignalTerm:
    pass


@dataclass(frozen=True)
class SignalKill:
    pass


@dataclass(frozen=True)
class DumpStacks:
    """py-spy on every process of the attempt, into its log (off the loop). Answers StacksDumped."""

    number: int


@dataclass(frozen=True)
class Diagnose:
    """Root cause from the log tail and/or the kernel's OOM record (off the loop). Answers Diagnosed."""

    number: int
    root_cause: bool
    oom: bool


@dataclass(frozen=True)
class AgreeGeneration:
    """Across hosts, at the end of attempt `number` (run in `generation`): say this host's share
    ended, and with `bump` (the decision, its `gen` the next one) begin the next generation unless
    another host already did (off the loop, as the user). Answers GenerationAgreed."""

    number: int
    generation: int | None
    bump: GangTurn | None


@dataclass(frozen=True)
class RemoveCgroup:
    pass


@dataclass(frozen=True)
class Note:
    """A line in the attempt's log, for the user."""

    text: str


@dataclass(frozen=True)
class Log:
    """A structured log line (the executor adds job and attempt)."""

    event: str
    level: str = "info"
    fields: tuple[tuple[str, object], ...] = ()


@dataclass(frozen=True)
class FinishAttempt:
    """Store, ONE transaction: the attempt row ended (its fields) and the job moved to `state` with
    its backoff bookkeeping. `number` 0: no attempt row to end (e.g. a cancel during the backoff)."""

    number: int
    state: JobState
    reason: str
    reason_class: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    max_step: int | None = None
    root_cause: str | None = None
    backoff_remaining: float = 0.0
    backoff_level: int = 0
    no_progress_streak: int = 0
    release_gpus: bool = False
    ended_wall: float | None = None  # the attempt's real end (Unix), when it came before the daemon saw it


@dataclass(frozen=True)
class RecordStop:
    """Store why the daemon stops the attempt, before the SIGTERM: a daemon restarted meanwhile still
    cancels a cancelled attempt, and never counts one the daemon stopped as the job's own failure."""

    number: int
    cause: str


@dataclass(frozen=True)
class RecordExit:
    """Store: the launcher's exit status, as soon as seen (a daemon restarted before the attempt's
    end is recorded then decides on the real status, not "daemon restarted")."""

    number: int
    code: int | None
    signal: int | None
    stop_cause: str | None


@dataclass(frozen=True)
class SaveBackoff:
    """Store the backoff's remaining seconds (the daemon stops mid-backoff; the next one resumes it)."""

    remaining: float


Action = (MarkStarting | StartStaging | StopStaging | FindCheckpoint | Spawn | SignalTerm | SignalKill | DumpStacks
          | Diagnose | AgreeGeneration | RemoveCgroup | Note | Log | RecordStop | RecordExit | FinishAttempt | SaveBackoff)
STORE_ACTIONS = (MarkStarting, Spawn, RecordStop, RecordExit, FinishAttempt, SaveBackoff)
