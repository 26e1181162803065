"""What the executor saw: the inputs of the job's state machine (machine.advance).

Each is a frozen value; a test scripts them in any order, with no processes. `OBSERVATIONS` lists
them all, in the order docs/architecture.md names them (tests/unit/test_lifecycle_doc.py checks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from spx.daemon.contract.replay_verdict import ReplayVerdict
from spx.daemon.contract.worker_env import Divergence
from spx.daemon.lifecycle.record import GangTurn, WorkerExit

if TYPE_CHECKING:
    from spx.daemon.lifecycle.actions import Action


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
    hosts, `generation` is the round the attempt joins, or `final` the one that ended the job.
    `fell_back`: discovery passed over the checkpoint FindCheckpoint said to avoid."""

    path: str | None
    step: int | None
    number: int
    generation: int | None = None
    final: GangTurn | None = None
    fell_back: bool = False


@dataclass(frozen=True)
class Spawned:
    """The launcher exec'd; `wall` is the attempt's start in Unix time. `boot_id` and `start_ticks`
    identify its process-group leader (`pid`) against a later process reusing the pid; `reason` is
    what the job's reason says while it runs ("resuming from …")."""

    pid: int
    wall: float
    boot_id: str | None = None
    start_ticks: int | None = None
    reason: str = ""


@dataclass(frozen=True)
class HeartbeatSeen:
    """The attempt's heartbeat as read (contract.worker_env.Heartbeat, bounded): its step, time and
    status; the loss and gradient norm it reports (None: not reported); why a "diverged" beat is one."""

    step: int
    time: float
    status: str
    loss: float | None = None
    grad_norm: float | None = None
    diverged: Divergence | None = None
    replay: ReplayVerdict | None = None  # a replay job's verdict (its last beat)


@dataclass(frozen=True)
class ActivitySeen:
    """For an attempt without heartbeat progress: whether any of its GPUs computed, or its log grew,
    since the last look (the executor looks every few seconds)."""

    active: bool


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
class WorkerDied:
    """One of the attempt's workers ended abnormally (a signal, a nonzero exit), seen the moment it
    did (run/worker_watch.py), before its launcher noticed. A worker's exit 0 is never one."""

    worker: WorkerExit


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
class ReplayDiffered:
    """A replay of the job's checkpoints on other GPUs (`spx verify`) computed different numbers at
    `step` (`what`: "rank 1's gradient norm 0.8312, recorded 0.8311"): a GPU that trained it the first
    time computes wrong numbers, and every checkpoint from that step on holds them."""

    step: int
    what: str


@dataclass(frozen=True)
class LeaseLost:
    """Another host took the job's lease (`.spx/lease`): it adopted the job while this host could
    not renew (a partition, a hung volume, a stopped daemon), and runs it now. `holder`: that host."""

    holder: str


@dataclass(frozen=True)
class GangSeen:
    """Across hosts, the answer to BeatGang: the generation now (a newer one than the attempt's:
    another host ended its round; None: the shared dir named none)."""

    turn: GangTurn | None
    missing: str | None = None  # a host gone (or never come) longer than nodes.host_timeout_seconds: why


@dataclass(frozen=True)
class GenerationAgreed:
    """The answer to AgreeGeneration: `won`, this host began the next generation (its decision
    stands); else `turn` is the one another host began first (its decision applies here too)."""

    number: int
    won: bool
    turn: GangTurn | None


@dataclass(frozen=True)
class WorkQueued:
    """The slow work `action` asked for waits for a slot of its owner's lane (core.lanes: the owner's
    other work holds them): its deadline does not run while it waits. `detail` says for what."""

    action: Action
    detail: str


@dataclass(frozen=True)
class WorkStarted:
    """The slow work `action` asked for, after waiting (WorkQueued), got its slot: its deadline counts
    from now."""

    action: Action


@dataclass(frozen=True)
class DaemonStopping:
    """The daemon shuts down: attempts get SIGTERM and their grace; nothing new starts."""


@dataclass(frozen=True)
class ActionFailed:
    """An action raised. `retry`: the store could not take a write now (re-emit it next tick)."""

    action: Action
    error: str
    retry: bool = False


Observation = (Tick | Go | StagingEnded | CheckpointFound | Spawned | HeartbeatSeen | ActivitySeen | WorkerDied
               | LauncherExited | AllGone | StacksDumped | Diagnosed | CancelRequested | GpuFault | ReplayDiffered | LeaseLost | GangSeen
               | GenerationAgreed | WorkQueued | WorkStarted | DaemonStopping | ActionFailed)
OBSERVATIONS: tuple[type, ...] = (
    Tick, Go, StagingEnded, CheckpointFound, Spawned, HeartbeatSeen, ActivitySeen, WorkerDied, LauncherExited, AllGone,
    StacksDumped, Diagnosed, CancelRequested, GpuFault, ReplayDiffered, LeaseLost, GangSeen, GenerationAgreed, WorkQueued,
    WorkStarted, DaemonStopping, ActionFailed)
