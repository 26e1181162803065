"""What a job's standby costs the host in memory, read when a view is built (`spx status`, /metrics).

A standby (run/standby.py) is the next attempt's launcher started ahead: its attempt monitor and log
relay (root's, stdlib only: a few MiB each) and, the monitor's child, the agent — the job's user's
interpreter with the launcher's modules (torch) imported, most of the figure. The supervisor's
snapshot (run/snapshot.py) names the monitor and the relay as the loop last saw them; the reader
adds their descendants as it finds them now (/proc/PID/task/*/children), so the figure is the whole
standby at the read, whatever the agent started.

The figure is the sum of each process's Pss (/proc/PID/smaps_rollup), not of its VmRSS. The agent
maps the same torch libraries as the job's running workers, and the relay and the monitor the same
interpreter as the daemon: RSS counts a shared page in full in every process that maps it, so it
tells what the standby touches, and a sum of RSS over a host's standbys can exceed what turning
`launch_standby` off gives back. Pss charges each shared page to its mappers in equal shares, so the
figures of all processes add up to the memory in use, and a standby's figure is its fair part of it
(its private pages whole, which is most of an imported torch's heap). Here, a torchrun standby next
to its 2-worker DDP job: RSS 243 MiB, Pss 171 MiB; a standby alone, with no worker sharing its
torch, Pss 219 MiB. It costs the kernel a walk of each process's mappings: ~3 ms a standby here.

These are the daemon's own children, read as root: nothing of a user's path is touched. A process can
end between the snapshot and the read (its standby was taken by its attempt, or discarded): it adds
nothing, and a standby none of whose processes is left has no figure (None), never an exception. A
pid freed and reused in that window (at most one loop turn) would be read as the standby's: the
kernel hands out pids in turn up to pid_max before it reuses one, so that is rare, and it lasts one
read.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

PROC = Path("/proc")
# At most this many processes per standby are read: an agent is one process, but it runs the user's
# interpreter and could start any number — a read must not follow a fork bomb.
MAX_PROCESSES = 64


def pss_bytes(pid: int, proc: Path = PROC) -> int | None:
    """The process's proportional set size, or None when it is gone (or is a zombie: no mappings)."""
    try:
        rollup = (proc / str(pid) / "smaps_rollup").read_bytes()
    except OSError:
        return None
    for line in rollup.splitlines():
        if line.startswith(b"Pss:"):
            fields = line.split()
            return int(fields[1]) * 1024 if len(fields) >= 2 and fields[1].isdigit() else None
    return None


def children(pid: int, proc: Path = PROC) -> list[int]:
    """The process's children now (every thread's), none when it is gone."""
    found: list[int] = []
    try:
        threads = list((proc / str(pid) / "task").iterdir())
    except OSError:
        return found
    for task in threads:
        try:
            found.extend(int(c) for c in (task / "children").read_bytes().split() if c.isdigit())
        except OSError:
            continue
    return found


def tree_bytes(pids: Iterable[int], proc: Path = PROC) -> int | None:
    """The summed Pss of `pids` and their descendants (at most MAX_PROCESSES of them); None when no
    process of them is left."""
    todo, seen, total, read = list(pids), set[int](), 0, False
    while todo and len(seen) < MAX_PROCESSES:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        size = pss_bytes(pid, proc)
        if size is None:
            continue
        total, read = total + size, True
        todo.extend(children(pid, proc))
    return total if read else None
