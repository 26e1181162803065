"""The words for why an attempt stopped and how its end is classed, shared by everyone who writes or
reads them: the job's state machine and its restart policy (lifecycle), root cause (run), the store's
attempt rows, the views and `spx` (state, cli), the spec's `restart.on_failure` keys (core.spec).

Both are str-valued enums: a member *is* its string (`StopCause.CANCEL == "cancel"`), so what the
store holds, what `spx status --json` prints and what a job file names stay the words they always were.
Stdlib only.
"""

from __future__ import annotations

import enum
import re
import signal


class _Word(str, enum.Enum):
    """A str enum whose str() and format() are its value (not `Class.NAME`)."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class StopCause(_Word):
    """Why the daemon stops an attempt (stored before the SIGTERM), or why its end is not the job's.

    `cancel` a user cancelled it; `hang` no step progress for the hang timeout; `gpu-fault` a fatal
    XID on one of its GPUs; `daemon-stop` the daemon shuts down; `daemon-restart` a daemon stopped it
    and died before storing why; `lost` adopted after a daemon restart, its monitor gone without a
    record of how it ended (or a launch that never got going); `peer-restart` across hosts, another
    host began a newer generation; `lease-lost` another host took the job's lease (it adopted the job
    while this host could not renew) and runs it now; `divergence` its heartbeat reported a NaN/Inf
    loss or gradient norm and the job's script did not stop on it itself; `corruption` a replay of one of
    its checkpoint intervals on other GPUs computed different numbers (`spx verify`): a GPU computed
    wrong ones, and the job goes back to the last checkpoint before them; `worker-died` one of its
    workers was killed by a signal or exited nonzero, and the attempt writes no heartbeat (so it has
    no just-in-time checkpoint to wait for): it is killed at once, not after its launcher's teardown."""

    CANCEL = "cancel"
    HANG = "hang"
    GPU_FAULT = "gpu-fault"
    DAEMON_STOP = "daemon-stop"
    DAEMON_RESTART = "daemon-restart"
    LOST = "lost"
    PEER_RESTART = "peer-restart"
    LEASE_LOST = "lease-lost"
    DIVERGENCE = "divergence"
    CORRUPTION = "corruption"
    WORKER_DIED = "worker-died"


# Stop causes that are not the job's fault: its attempt does not count as a restart.
NOT_THE_JOBS = frozenset({StopCause.DAEMON_STOP, StopCause.DAEMON_RESTART, StopCause.LOST, StopCause.PEER_RESTART,
                          StopCause.LEASE_LOST, StopCause.CORRUPTION})
# Stops a daemon may find under way when it adopts an attempt: the stop goes on.
CONTINUED_STOPS = frozenset({StopCause.CANCEL, StopCause.HANG, StopCause.DAEMON_STOP, StopCause.GPU_FAULT,
                             StopCause.PEER_RESTART, StopCause.LEASE_LOST, StopCause.DIVERGENCE, StopCause.CORRUPTION,
                             StopCause.WORKER_DIED})


class ReasonClass(_Word):
    """The class of an attempt's end: the `reason` label of spx_job_restarts_total and the store's
    `reason_class`. The first ten are the job's own failures (`restart.on_failure` sets a rule per
    class); the rest are ends that say nothing about the job's code (`corruption`: a GPU's wrong
    numbers, found by a replay; the job is rolled back, uncounted)."""

    USER_CODE = "user-code"
    COMMUNICATION = "communication"
    OOM = "oom"
    CUDA = "cuda"
    GPU_FAULT = "gpu-fault"
    HANG = "hang"
    PREEMPTED = "preempted"
    SIGNAL = "signal"
    CRASH = "crash"
    DIVERGENCE = "divergence"
    CANCELLED = "cancelled"
    DAEMON_RESTART = "daemon-restart"
    PEER_RESTART = "peer-restart"
    LOST = "lost"
    LAUNCH = "launch"
    HOST_LOST = "host-lost"
    DAEMON_ERROR = "daemon-error"
    LEASE_LOST = "lease-lost"
    CORRUPTION = "corruption"


# The classes `restart.on_failure` may name: the job's own failures.
FAILURE_CLASSES = (ReasonClass.USER_CODE, ReasonClass.COMMUNICATION, ReasonClass.OOM, ReasonClass.CUDA,
                   ReasonClass.GPU_FAULT, ReasonClass.HANG, ReasonClass.PREEMPTED, ReasonClass.SIGNAL,
                   ReasonClass.CRASH, ReasonClass.DIVERGENCE)
# Ends that are no failure of the job's (`spx` does not show them as failures).
NOT_FAILURES = (ReasonClass.CANCELLED, ReasonClass.DAEMON_RESTART, ReasonClass.PEER_RESTART, ReasonClass.LEASE_LOST)
# The classes root cause tags an error line with, most specific first: a GPU fault explains the CUDA
# error that follows it, and an out-of-memory is reported as a CUDA error too.
ERROR_CLASSES = (ReasonClass.GPU_FAULT, ReasonClass.OOM, ReasonClass.CUDA, ReasonClass.COMMUNICATION,
                 ReasonClass.USER_CODE, ReasonClass.SIGNAL)
_CLASS_TAG = re.compile(r" \((" + "|".join(c.value for c in ERROR_CLASSES) + r")\)(?:;|$)")


def cause_class(root_cause: str | None) -> ReasonClass | None:
    """The class root cause tagged the root error with ("… (oom)"), or None (no cause, or untagged)."""
    if not root_cause:
        return None
    m = _CLASS_TAG.search(root_cause)
    return ReasonClass(m.group(1)) if m else None


def class_tag(cls: ReasonClass) -> str:
    """The tag root cause appends to an error line, which `cause_class` reads back."""
    return f" ({cls.value})"


def signal_name(sig: int) -> str:
    """SIGKILL for 9; "signal 77" for a number no signal has."""
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"
