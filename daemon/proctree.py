"""Find, signal and reap every process of an attempt, including ones that escaped its group.

An attempt starts as one process group, but a worker may `setsid()` away from it (and ignore
SIGTERM). Every process of an attempt inherits `SPX_ATTEMPT_ID`, so the daemon (root, a child
subreaper) finds them in /proc by that tag; this also works after a daemon restart, when the old
processes are no longer its children. Where cgroup v2 is delegated, a per-attempt cgroup would make
this exact even for processes that scrub their environment; that is the next step (design §7).
"""

from __future__ import annotations

import ctypes
import os
import signal
from pathlib import Path

from spx.daemon import contract

PR_SET_CHILD_SUBREAPER = 36
_PROC = Path("/proc")


def become_subreaper() -> bool:
    """Orphaned descendants re-parent to the daemon instead of init, so they can be reaped and
    never outlive their attempt unnoticed."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _environ(pid: int) -> bytes:
    try:
        return (_PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return b""


def _is_zombie(pid: int) -> bool:
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X")


def attempt_pids(attempt_id: str) -> list[int]:
    """Live (non-zombie) pids tagged with this attempt id."""
    tag = f"{contract.ENV_ATTEMPT_ID}={attempt_id}".encode()
    me = os.getpid()
    found = []
    for entry in os.scandir(_PROC):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        if pid == me:
            continue
        if tag in _environ(pid).split(b"\0") and not _is_zombie(pid):
            found.append(pid)
    return sorted(found)


def signal_attempt(attempt_id: str, pgid: int | None, sig: int) -> list[int]:
    """Send `sig` to the attempt's process group and to every tagged process. Returns the pids
    that were tagged (for the log)."""
    if pgid:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    pids = attempt_pids(attempt_id)
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    return pids


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def reap_orphans(keep: set[int]) -> None:
    """Collect exit statuses of re-parented descendants (as subreaper) without touching the
    launcher processes in `keep`, whose status the supervisor reads through Popen."""
    me = str(os.getpid())
    for entry in os.scandir(_PROC):
        if not entry.name.isdigit() or int(entry.name) in keep:
            continue
        try:
            stat = (Path(entry.path) / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 1 and fields[1] == me:
            try:
                os.waitpid(int(entry.name), os.WNOHANG)
            except ChildProcessError:
                pass


def signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"
