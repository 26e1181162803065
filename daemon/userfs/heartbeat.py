"""The daemon's read of a job's heartbeat file, which lives in a directory the job's user writes.

`contract.worker_env.read_heartbeat` is the trainer's reader (and test helper); the daemon reads
through here instead: no link followed below the root-owned `run/jobs`, a FIFO never blocks, at most
64 KiB, and anything odd at the path (garbage, a directory, a link to a root-only file) is "no
heartbeat", never an exception.
"""

from __future__ import annotations

from pathlib import Path

from spx.daemon.contract.worker_env import Heartbeat, parse_heartbeat
from spx.daemon.userfs import fsafe

MAX_HEARTBEAT_BYTES = 64 * 1024


def read_heartbeat(path: Path, base: Path | None = None) -> Heartbeat | None:
    """The heartbeat at `path`, walked from `base` (default: two levels up, `run/jobs`, the last
    directory only root writes); None if absent, unreadable, odd or not a heartbeat."""
    try:
        return parse_heartbeat(fsafe.read_file(path, base or path.parent.parent, MAX_HEARTBEAT_BYTES))
    except OSError:
        return None
