"""Each running attempt's progress record (state/attempt_progress.py), kept from the heartbeats the
supervisor reads anyway and written to the attempt's store row for the goodput ledger.

A write is one small transaction; it is made when the record gains what the ledger cannot do
without — the attempt's first beat, a checkpoint it published, a status other than "running" (its
last word) — and otherwise at most every `WRITE_EVERY_SECONDS` while its step moves, and once more
when its launcher's exit is seen. A daemon killed between two writes loses at most that much of
the attempt's last progress (the ledger counts it as `daemon` time if the attempt was lost with it);
one restarted while the attempt runs adopts it and carries the stored record on (`load`). As the
timeline, this is a diagnostic: a write the store refuses is retried with the next one, and nothing
is ever decided on it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from spx.daemon.contract.worker_env import Heartbeat
from spx.daemon.core.log import get_logger
from spx.daemon.state import attempt_progress
from spx.daemon.state.attempt_progress import Progress
from spx.daemon.state.db import StoreUnavailable
from spx.daemon.state.store import Store

log = get_logger()

WRITE_EVERY_SECONDS = 5.0


@dataclass
class _Kept:
    since: float           # the attempt's start (wall): beats and saves before it are the last attempt's
    progress: Progress
    written: Progress | None
    written_at: float = float("-inf")  # monotonic


class ProgressLog:
    """The progress of the attempts the supervisor watches, by store row."""

    def __init__(self, store: Store, clock: Callable[[], float]):
        self.store = store
        self.clock = clock
        self._rows: dict[int, _Kept] = {}

    def beat(self, job_id: int, row: int | None, beat: Heartbeat) -> None:
        """A heartbeat read for the job's attempt of store row `row` (None: no row, nothing kept)."""
        if row is None:
            return
        kept = self._rows.get(row) or self._load(job_id, row)
        if kept is None:
            return
        kept.progress = kept.progress.seen(beat.step, beat.time, beat.last_checkpoint_step,
                                           beat.last_checkpoint_time, beat.checkpoint_stall_seconds, kept.since)
        old, new = kept.written, kept.progress
        if new == old or new.first is None:
            return
        urgent = old is None or old.first is None or new.saves != old.saves or beat.status != "running"
        if urgent or self.clock() - kept.written_at >= WRITE_EVERY_SECONDS:
            self._write(row, kept)

    def exited(self, row: int | None) -> None:
        """The attempt's launcher exited: its record is written as it stands."""
        kept = self._rows.get(row) if row is not None else None
        if kept is not None and kept.progress != kept.written:
            self._write(row, kept)

    def forget(self, row: int | None) -> None:
        if row is not None:
            self._rows.pop(row, None)

    def _load(self, job_id: int, row: int) -> _Kept | None:
        """The stored record of the job's open attempt `row` (one a daemon before this one kept, for
        an adopted attempt), or a fresh one."""
        found = self.store.attempts.open_for(job_id)
        if found is None or found.id != row:
            return None
        stored = attempt_progress.stored(found.progress)
        kept = _Kept(since=found.start, progress=stored or Progress(), written=stored)
        self._rows[row] = kept
        return kept

    def _write(self, row: int | None, kept: _Kept) -> None:
        assert row is not None
        try:
            self.store.attempts.set_progress(row, kept.progress.to_json())
        except StoreUnavailable as e:
            log.warning("progress_not_recorded", job=None, attempt=None, attempt_row=row, error=str(e))
            return
        kept.written, kept.written_at = kept.progress, self.clock()
