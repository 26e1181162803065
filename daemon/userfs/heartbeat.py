"""The daemon's read of a job's heartbeat file, which lives in a directory the job's user writes.

`contract.worker_env.read_heartbeat` is the trainer's reader (and test helper); the daemon reads
through here instead: no link followed below the root-owned `run/jobs`, a FIFO never blocks, at most
64 KiB, and anything odd at the path (garbage, a directory, a link to a root-only file) is "no
heartbeat", never an exception.
"""

from __future__ import annotations

import json
from pathlib import Path

from spx.daemon.contract.worker_env import Heartbeat
from spx.daemon.userfs import fsafe

MAX_HEARTBEAT_BYTES = 64 * 1024


def read_heartbeat(path: Path, base: Path | None = None) -> Heartbeat | None:
    """The heartbeat at `path`, walked from `base` (default: two levels up, `run/jobs`, the last
    directory only root writes); None if absent, unreadable, odd or not a heartbeat."""
    try:
        raw = json.loads(fsafe.read_file(path, base or path.parent.parent, MAX_HEARTBEAT_BYTES))
        if not isinstance(raw, dict):
            return None
        beat = Heartbeat(**{k: raw[k] for k in Heartbeat.__dataclass_fields__ if k in raw})
    except (OSError, ValueError, TypeError, RecursionError):
        return None
    if not _sane(beat):
        return None
    return beat


def _sane(beat: Heartbeat) -> bool:
    """Types the daemon computes with (a string step would break hang detection's arithmetic)."""
    def num(v: object) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf")
    return (isinstance(beat.step, int) and not isinstance(beat.step, bool) and isinstance(beat.epoch, int)
            and num(beat.samples_per_second) and num(beat.time) and isinstance(beat.status, str)
            and (beat.last_checkpoint_step is None or (isinstance(beat.last_checkpoint_step, int)
                                                       and not isinstance(beat.last_checkpoint_step, bool)))
            and (beat.last_checkpoint_time is None or num(beat.last_checkpoint_time)))
