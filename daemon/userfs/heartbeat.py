"""The daemon's read of a job's heartbeat file, which lives in a directory the job's user writes.

`contract.worker_env.read_heartbeat` is the trainer's reader (and test helper); the daemon reads
through here instead: no link followed below the root-owned `run/jobs`, a FIFO never blocks, at most
64 KiB, and every number checked (`contract.worker_env.load_heartbeat`). Anything odd at the path
(garbage, a directory, a link to a root-only file) is "no heartbeat" with the reason why, never an
exception: `spx ls`, `spx top` and `/metrics` read it for every job of every user.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from pathlib import Path

from spx.daemon.contract.worker_env import HEARTBEAT_MAX_BYTES, Heartbeat, load_heartbeat
from spx.daemon.core.bounded import Garbage
from spx.daemon.userfs import fsafe


@dataclass(frozen=True)
class HeartbeatRead:
    """What the heartbeat file holds: a beat, or None with `problem` saying why the file there is no
    heartbeat (None when there is simply none yet). `spx status` shows it: "heartbeat unreadable: …"."""

    beat: Heartbeat | None
    problem: str | None = None


def read(path: Path, base: Path | None = None) -> HeartbeatRead:
    """The heartbeat at `path`, walked from `base` (default: two levels up, `run/jobs`, the last
    directory only root writes). Never raises."""
    try:
        raw = fsafe.read_file(path, base or path.parent.parent, HEARTBEAT_MAX_BYTES)
    except OSError as e:
        return _unreadable(e)
    return _parse(raw)


class HeartbeatFile:
    """One attempt's heartbeat as the supervisor reads it (once a second, `read` as above): its content
    is parsed and its numbers checked only when it differs from the last read's — a worker writes it
    about once a second, and the parse was most of what a running job cost the loop."""

    def __init__(self, path: Path, base: Path | None = None) -> None:
        self.path = path
        self.base = base or path.parent.parent
        self._raw: bytes | None = None
        self._last = HeartbeatRead(None)

    def read(self) -> HeartbeatRead:
        """The heartbeat now (the same object as the last read's while the content is unchanged)."""
        try:
            raw = fsafe.read_file(self.path, self.base, HEARTBEAT_MAX_BYTES)
        except OSError as e:
            self._raw = None
            return _unreadable(e)
        if raw != self._raw:
            self._raw, self._last = raw, _parse(raw)
        return self._last


def _unreadable(e: OSError) -> HeartbeatRead:
    if e.errno == errno.ENOENT:
        return HeartbeatRead(None)
    return HeartbeatRead(None, e.strerror or str(e))


def _parse(raw: bytes) -> HeartbeatRead:
    try:
        return HeartbeatRead(load_heartbeat(raw))
    except Garbage as e:
        return HeartbeatRead(None, e.detail)


def read_heartbeat(path: Path, base: Path | None = None) -> Heartbeat | None:
    """`read`'s beat: None if absent, unreadable, odd or not a heartbeat."""
    return read(path, base).beat
