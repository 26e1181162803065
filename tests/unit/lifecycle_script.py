"""Scripts for the job state machine's edge tests (tests/unit/test_lifecycle_*.py): a job placed,
started, hung or ended by feeding `advance` the observations the executor would report — no
processes, no clock but the `now` each call is given.
"""

from __future__ import annotations

from dataclasses import replace

from spx.daemon.core.restart_spec import Restart
from spx.daemon.lifecycle import record
from spx.daemon.lifecycle.actions import FindCheckpoint, Log, Note, Spawn
from spx.daemon.lifecycle.machine import advance, placed
from spx.daemon.lifecycle.observations import (
    AllGone,
    CheckpointFound,
    Go,
    HeartbeatSeen,
    LauncherExited,
    Spawned,
    Tick,
)
from spx.daemon.state.states import JobState

LIMITS = record.Limits(grace_seconds=30, hang_timeout_seconds=60, healthy_seconds=600,
                     restart=Restart(max_restarts=3, backoff_seconds=(10, 300)))
WALL0 = 1_000_000.0


def kinds(actions):
    """The actions that act (logs and notes to the attempt log left out)."""
    return [type(a) for a in actions if not isinstance(a, Log | Note)]


def logs(actions):
    return [a.event for a in actions if isinstance(a, Log)]


def only(actions, kind):
    found = [a for a in actions if isinstance(a, kind)]
    assert len(found) == 1, actions
    return found[0]


def ready(job_state=JobState.QUEUED, **kw):
    return placed(1, "job", kw.pop("limits", LIMITS), job_state, kw.pop("gpus", ()), **kw)


def running(now=0.0, **kw):
    """A job whose attempt 1 (or the next one) is up, launched at `now`."""
    s, _ = advance(ready(**kw), Go((0, 1)), now)
    s, _ = advance(s, CheckpointFound(None, None, s.number), now)
    s, _ = advance(s, Spawned(4242, WALL0 + now), now)
    return s


def ended(s, now, code=1, sig=None):
    """The launcher exits with (code, sig) and nothing is left."""
    s, _ = advance(s, LauncherExited(code, sig), now)
    return advance(s, AllGone(), now)


def hung():
    s = running()
    s, _ = advance(s, HeartbeatSeen(8, WALL0 + 5, "running"), 5.0)
    return advance(s, Tick(), 66.0)[0]


def auto(**kw):
    """A running attempt whose hang timeout is calibrated (restart.hang_timeout_seconds unset)."""
    return running(limits=replace(LIMITS, hang_timeout_seconds=None), **kw)


def beats(s, steps_at, status="running"):
    """Heartbeats: (monotonic time, step) pairs, each written one second after the attempt start + t."""
    for t, step_no in steps_at:
        s, _ = advance(s, HeartbeatSeen(step_no, WALL0 + t, status), t)
    return s


XID79 = "XID 79 on GPU 1 (GPU fell off the bus)"


def relaunch(s, now, found_path, found_step):
    """Backoff over, Go, checkpoint discovery answers (`found_path`, `found_step`): FindCheckpoint and Spawn."""
    s, _ = advance(s, Tick(), now)
    s, actions = advance(s, Go((0, 1)), now)
    find = only(actions, FindCheckpoint)
    s, actions = advance(s, CheckpointFound(found_path, found_step, s.number), now)
    spawn = only(actions, Spawn)
    s, _ = advance(s, Spawned(4243 + s.number, WALL0 + now), now)
    return s, find, spawn
