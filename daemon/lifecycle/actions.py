"""What the executor must do: the outputs of the job's state machine (machine.advance).

Each is a frozen value the executor performs and answers with observations (at once, or later for
work done off the loop). Store writes are actions like any other (`STORE_ACTIONS`): one the store
refuses comes back as a retryable `ActionFailed` and waits in the job's `pending` queue. `ACTIONS`
lists them all, in the order docs/architecture.md names them (tests/unit/test_lifecycle_doc.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from spx.daemon.contract.replay_verdict import ReplayVerdict
from spx.daemon.contract.worker_env import StepRanges
from spx.daemon.core.causes import ReasonClass, StopCause
from spx.daemon.lifecycle.record import GangTurn, WorkerExit
from spx.daemon.lifecycle.resume_fallback import Avoid
from spx.daemon.lifecycle.rollback import Rollback
from spx.daemon.state.states import JobState


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
    loop, as the user), passing over `avoid` (the crash-loop fallback), and with `rollback` (after a
    divergence) every checkpoint at or after its step. With `standby`, the attempt's
    launcher is started meanwhile (StartStandby). With `join`, a job across hosts first joins the
    generation after `generation` (its last). Answers CheckpointFound."""

    number: int
    avoid: Avoid | None = None
    standby: bool = False
    join: bool = False
    generation: int | None = None
    rollback: Rollback | None = None


@dataclass(frozen=True)
class StartStandby:
    """Start attempt `number`'s launcher ahead (run/standby.py), as the current attempt trains: a
    relaunch then does not wait for its interpreter and imports. Answers nothing: without one, the
    attempt launches cold."""

    number: int


@dataclass(frozen=True)
class Spawn:
    """Store the attempt row, then launch it off the loop (through its standby if one fits, else
    cold). Answers Spawned, or ActionFailed."""

    number: int
    resume_from: str | None
    resume_step: int | None
    skip_steps: StepRanges = ()  # a divergence rollback's skipped data (SPX_SKIP_STEPS)
    extra_args: tuple[str, ...] = ()  # restart.on_failure.divergence.args, once the job diverged


@dataclass(frozen=True)
class RecordRunning:
    """Store: the attempt's process-group leader (boot id, start time) and the job → running."""

    number: int
    pgid: int
    boot_id: str | None
    start_ticks: int | None
    reason: str
    wall: float


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
    """Root cause from the log tail and/or the kernel's OOM record (off the loop). Answers Diagnosed.
    `worker`: the worker whose death made the daemon kill the attempt — its rank, pid and end stand in
    for the launcher's failure summary, which a launcher killed with it never printed."""

    number: int
    root_cause: bool
    oom: bool
    worker: WorkerExit | None = None


@dataclass(frozen=True)
class BeatGang:
    """Across hosts, while attempt `number` runs in `generation`: say so in the shared dir (off the
    loop, as the user). `since_wall`: the attempt's start, from when a silent host counts as gone.
    Answers GangSeen."""

    number: int
    generation: int
    step: int | None
    since_wall: float


@dataclass(frozen=True)
class AgreeGeneration:
    """Across hosts, at the end of attempt `number` (run in `generation`): say this host's share
    ended, and with `bump` (the decision, its `gen` the next one) begin the next generation unless
    another host already did (off the loop, as the user). Answers GenerationAgreed."""

    number: int
    generation: int | None
    bump: GangTurn | None
    step: int | None = None


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
    reason_class: ReasonClass | None = None
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
    cause: StopCause


@dataclass(frozen=True)
class RecordExit:
    """Store: the launcher's exit status, as soon as seen (a daemon restarted before the attempt's
    end is recorded then decides on the real status, not "daemon restarted")."""

    number: int
    code: int | None
    signal: int | None
    stop_cause: StopCause | None


@dataclass(frozen=True)
class RecordVerdict:
    """Store a replay job's verdict on the job it verified (`of`); when it differs, that job is rolled
    back and the GPUs that trained the step are suspect (run/verification.py). `verdict` None: the
    replay ended without one (`reason` says how)."""

    number: int
    of: str
    verdict: ReplayVerdict | None
    reason: str


@dataclass(frozen=True)
class SaveBackoff:
    """Store the backoff's remaining seconds (the daemon stops mid-backoff; the next one resumes it)."""

    remaining: float


Action = (MarkStarting | StartStaging | StopStaging | FindCheckpoint | StartStandby | Spawn | RecordRunning
          | SignalTerm | SignalKill | DumpStacks | Diagnose | BeatGang | AgreeGeneration | RemoveCgroup | Note | Log
          | RecordStop | RecordExit | FinishAttempt | RecordVerdict | SaveBackoff)
ACTIONS: tuple[type, ...] = (
    MarkStarting, StartStaging, StopStaging, FindCheckpoint, StartStandby, Spawn, RecordRunning, SignalTerm,
    SignalKill, DumpStacks, Diagnose, BeatGang, AgreeGeneration, RemoveCgroup, Note, Log, RecordStop, RecordExit,
    FinishAttempt, RecordVerdict, SaveBackoff)
# Writes to the store: a refused one (disk full, locked) is retried, and later ones wait behind it.
STORE_ACTIONS = (MarkStarting, Spawn, RecordRunning, RecordStop, RecordExit, FinishAttempt, RecordVerdict, SaveBackoff)
