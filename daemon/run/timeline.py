"""Where an attempt's (re)start spends its time: per-phase timestamps, stored per attempt.

The names, in order, are `state.phases`'s. A restart runs through these phases, in this order (Unix seconds each, `spx status --timeline`):

- on the attempt that failed (`FAILURE_PHASES`): `worker_exit` (a worker died abnormally — killed by a
  signal, or a nonzero exit — seen at once through its pidfd, run/worker_watch.py; an attempt without a
  heartbeat is killed there and then, so its monitor records no `launcher_exit`), `launcher_exit` (the
  attempt monitor's exit record: when torchrun/deepspeed ended), `failure_seen` (the daemon observed that exit), `group_dead` (none
  of the attempt's processes is left), `end_recorded` (diagnosed, the policy decided, the end stored);
- on the next attempt (`START_PHASES`): `placed` (the scheduler placed it: its GPUs, if it has any, are free and
  healthy), `joined` (across hosts: the generation it joins is known — after waiting for any host still
  in an older one; `join_waited_seconds` in its checkpoint report says how long), `checkpoint_found`
  (the resume checkpoint was chosen, as the job's owner), `spawn`;
- from the worker, through rank 0's heartbeat (`contract.worker_env.WORKER_PHASES`, written by
  `spx.trainer`): `interpreter_up`, `torch_imported`, `rendezvous`, `checkpoint_loaded`,
  `first_step`; and `first_beat`, when the first heartbeat of the attempt was written — the one
  phase a script not on `spx.trainer` reports too (any heartbeat writer gives it).

The `Recorder` is the executor's: it is told of each phase as the executor sees it and writes it
to the attempt's row (`store.attempts.add_phases`), each phase once. A timeline is a diagnostic:
a store that refuses the write loses that phase (the next beat retries worker phases), and nothing
is ever decided on it. The heartbeat's phases come from a file the job's user writes: only known
names with finite times pass the contract's parser, and a beat older than the attempt's spawn (the
previous attempt's, still in the file) is not this attempt's.
"""

from __future__ import annotations

from collections.abc import Callable

from spx.daemon.contract.worker_env import WORKER_PHASES, Heartbeat
from spx.daemon.core.log import get_logger
from spx.daemon.state.db import StoreUnavailable
from spx.daemon.state.store import Store

log = get_logger()


def from_beat(beat: Heartbeat, spawned: float) -> dict[str, float]:
    """The worker phases a heartbeat reports for the attempt spawned at `spawned`: none from a beat
    written before it (the previous attempt's file content)."""
    if beat.time < spawned:
        return {}
    out = {k: v for k, v in (beat.phases or {}).items() if k in WORKER_PHASES}
    out["first_beat"] = beat.time
    return out


class Recorder:
    """Phases as the executor sees them, written once each to the attempt's store row."""

    def __init__(self, store: Store, wall: Callable[[], float]):
        self.store = store
        self.wall = wall
        self._pending: dict[int, dict[str, float]] = {}   # job → START_PHASES seen before its row exists
        self._spawned: dict[int, tuple[int, float]] = {}  # job → (its attempt's row, spawn time)
        self._written: dict[int, set[str]] = {}           # row → phases stored

    def before_spawn(self, job_id: int, phase: str, at: float | None = None) -> None:
        """A start phase of the job's next attempt (its row does not exist yet), now or `at` (seen off
        the loop, told here after); first one counts."""
        self._pending.setdefault(job_id, {}).setdefault(phase, self.wall() if at is None else at)

    def spawned(self, job_id: int, row: int, when: float) -> None:
        """The attempt of `row` was spawned at `when`: its start phases are stored now."""
        old = self._spawned.pop(job_id, None)
        if old is not None:
            self._written.pop(old[0], None)
        self._spawned[job_id] = (row, when)
        self._write(row, {**self._pending.pop(job_id, {}), "spawn": when})

    def phase(self, row: int | None, phase: str, when: float | None = None) -> None:
        """A failure phase of the attempt of `row` (None: no row, nothing to record)."""
        if row is not None and phase not in self._written.get(row, ()):
            self._write(row, {phase: self.wall() if when is None else when})

    def beat(self, job_id: int, row: int | None, beat: Heartbeat) -> None:
        """The worker phases of a heartbeat of the job's running attempt (spawned by this daemon)."""
        spawned = self._spawned.get(job_id)
        if row is None or spawned is None or spawned[0] != row:
            return  # adopted after a daemon restart: its spawn time is not ours to compare with
        done = self._written.get(row, set())
        new = {k: v for k, v in from_beat(beat, spawned[1]).items() if k not in done}
        if new:
            self._write(row, new)

    def forget(self, job_id: int) -> None:
        self._pending.pop(job_id, None)
        spawned = self._spawned.pop(job_id, None)
        if spawned is not None:
            self._written.pop(spawned[0], None)

    def _write(self, row: int, phases: dict[str, float]) -> None:
        try:
            self.store.attempts.add_phases(row, phases)
        except StoreUnavailable as e:
            log.warning("timeline_not_recorded", job=None, attempt=None, attempt_row=row, phases=sorted(phases),
                        error=str(e))
            return
        self._written.setdefault(row, set()).update(phases)
