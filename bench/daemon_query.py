"""A bench's look at a daemon's jobs over its control socket, from the bench's own process.

Not `spx ls` (tests/harness.py's `Daemon.job`): that starts an interpreter per look, ~0.35 s of CPU
on the 2-core bench host, and a bench that looks every second or faster takes a third of a core or
more from the jobs it measures — from their CPU-bound start-ups most of all, which is what the
recovery and goodput figures are made of.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from spx.daemon.core.config import DaemonConfig
from spx.daemon.service import control


def job(root: Path, name: str) -> dict[str, Any] | None:
    """NAME's row of `spx ls --json` from the daemon rooted at `root`; None when it has no such job
    or does not answer this time (a bench asks again)."""
    try:
        reply = control.request(DaemonConfig.rooted(root).socket_path, "ls", None)
    except OSError:
        return None
    jobs = reply.get("result") if reply.get("ok") else None
    return next((j for j in jobs or [] if isinstance(j, dict) and j.get("name") == name), None)
