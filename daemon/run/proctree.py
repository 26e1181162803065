"""Find, signal and reap every process of an attempt, including ones that escaped its group.

An attempt starts as one process group, but a worker may `setsid()` away from it (and ignore
SIGTERM). Where the daemon manages cgroups, the attempt's cgroup holds every process of it, exactly
(cgroups.py). Everywhere, and as a second net there, every process of an attempt inherits
`SPX_ATTEMPT_ID`, so the daemon (root, a child subreaper) also finds them in /proc by that tag —
which misses only a process that scrubs its own environment. Both work after a daemon restart,
when the old processes are no longer its children.
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from spx.daemon.contract import worker_env
from spx.daemon.run import cgroups

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


def read_proc(path: str) -> bytes:
    """A /proc file's content; b"" if it cannot be read (the process is gone, or hides it). Plain
    os calls, no pathlib: the scans below read one file of every process on the host."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError:
        return b""
    finally:
        os.close(fd)


def _environ(pid: int) -> bytes:
    return read_proc(f"/proc/{pid}/environ")


def stat_fields(pid: int) -> list[bytes]:
    """/proc/PID/stat's fields after the command name (which may hold spaces and parentheses): [0] is
    field 3, the state; [] for a process that is gone."""
    return read_proc(f"/proc/{pid}/stat").rsplit(b")", 1)[-1].split()


def _is_zombie(pid: int) -> bool:
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X")


def attempt_pids(attempt_id: str) -> list[int]:
    """Live (non-zombie) pids tagged with this attempt id."""
    return tag_index().get(attempt_id, [])


def tag_index() -> dict[str, list[int]]:
    """Every live (non-zombie) tagged pid, by attempt id: one scan of /proc serves all attempts of a
    loop turn (a scan per attempt would cost jobs × processes reads)."""
    prefix = f"{worker_env.ENV_ATTEMPT_ID}=".encode()
    me = os.getpid()
    index: dict[str, list[int]] = {}
    for entry in os.scandir(_PROC):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        if pid == me:
            continue
        env = _environ(pid)
        if prefix not in env:  # most processes of a host are no attempt's: no split of their environment
            continue
        tag = next((v for v in env.split(b"\0") if v.startswith(prefix)), None)
        if tag is not None and not _is_zombie(pid):
            index.setdefault(tag[len(prefix):].decode(errors="replace"), []).append(pid)
    for pids in index.values():
        pids.sort()
    return index


def signal_attempt(attempt_id: str, pgid: int | None, sig: int, also: Iterable[int] = ()) -> list[int]:
    """Send `sig` once to every process of the attempt: to its process group in one call, then to
    each tagged pid and each pid of `also` (its cgroup's) that is outside that group. Once, because
    a second SIGTERM makes torchrun's agent give up waiting for its workers' checkpoint and exit.
    Returns the pids signalled one by one."""
    if pgid:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    singles = []
    for pid in sorted(set(attempt_pids(attempt_id)) | set(also)):
        try:
            if pgid and os.getpgid(pid) == pgid:
                continue
            os.kill(pid, sig)
            singles.append(pid)
        except (ProcessLookupError, PermissionError):
            pass
    return singles


def boot_id() -> str | None:
    """This boot's id: a pid stored before a reboot names nothing of ours after it."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22): with the boot
    id, what tells a process from a later one that got the same pid. None if it is gone."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    return int(fields[19]) if len(fields) > 19 else None  # fields[0] is field 3 (state)


def same_process(pid: int, boot: str | None, ticks: int | None) -> bool:
    """Is `pid` still the process recorded as (boot id, start ticks)? Unknown records are not the
    same: a stored pgid is never signalled unless its leader is provably the one we started."""
    if boot is None or ticks is None or boot != boot_id():
        return False
    return start_ticks(pid) == ticks


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


@dataclass(frozen=True)
class AttemptProcesses:
    """Every handle on one attempt's processes: its cgroup (None where cgroups are not managed),
    its `SPX_ATTEMPT_ID` tag and its process group. Each net catches what another may miss."""

    attempt_id: str
    pgid: int | None
    cgroup: Path | None = None

    def pids(self, index: dict[str, list[int]] | None = None) -> list[int]:
        """Live pids of the attempt: tagged ones and everything in its cgroup. `index`: a
        `tag_index()` of this moment, to spare a scan of /proc."""
        found = set(index.get(self.attempt_id, []) if index is not None else attempt_pids(self.attempt_id))
        if self.cgroup is not None:
            found.update(cgroups.procs(self.cgroup))
        return sorted(found)

    def signal(self, sig: int) -> None:
        """`sig` once to each process of the group, the tag and the cgroup; SIGKILL to the cgroup
        by `cgroup.kill`, which also catches children forked while it runs."""
        in_cgroup: list[int] = []
        if self.cgroup is not None:
            if sig == signal.SIGKILL:
                cgroups.kill(self.cgroup)
            else:
                in_cgroup = cgroups.procs(self.cgroup)
        signal_attempt(self.attempt_id, self.pgid, sig, also=in_cgroup)

    def renice(self, nice: int, passes: int = 4) -> None:
        """Every thread of the attempt to `nice` (a thread's nice is its own in Linux, and a new one
        takes its creator's). A pass reads the attempt's pids and each one's threads afresh: a thread
        or process made by one not yet reniced is caught by the next; passes end when one changed
        nothing. Root may lower a nice value; nothing of the job's can."""
        for _ in range(passes):
            changed = False
            for pid in self.pids():
                try:
                    tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
                except (FileNotFoundError, ProcessLookupError):
                    continue
                for tid in tids:
                    try:
                        if os.getpriority(os.PRIO_PROCESS, tid) != nice:
                            os.setpriority(os.PRIO_PROCESS, tid, nice)
                            changed = True
                    except (ProcessLookupError, PermissionError):
                        pass
            if not changed:
                return

    def gone(self, pids: list[int] | None = None) -> bool:
        """No process left: no pid tagged or in the cgroup, the cgroup not populated, the group
        empty. `pids`: what `pids()` has just returned, to spare a second scan of /proc."""
        if self.pids() if pids is None else pids:
            return False
        if self.cgroup is not None and cgroups.populated(self.cgroup):
            return False
        return not (self.pgid and group_alive(self.pgid))


def reap_orphans(keep: set[int]) -> None:
    """Collect exit statuses of re-parented descendants (as subreaper) without touching the
    launcher processes in `keep`, whose status the supervisor reads through Popen."""
    for pid in _children() - keep:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass


def _children() -> set[int]:
    return children(os.getpid())


def children(pid: int) -> set[int]:
    """`pid`'s children: each of its threads' `children` list (a child is its forking thread's; an
    orphan re-parented to a subreaper, one of its threads'), a few short reads where a scan of /proc
    reads every process of the host. Without that file (a kernel built without
    CONFIG_PROC_CHILDREN), the scan: every process whose parent is `pid`. Empty for a pid that is gone."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return set()
    if not _children_files():
        return _children_by_scan(pid)
    return {int(c) for tid in tids for c in read_proc(f"/proc/{pid}/task/{tid}/children").split()}


@functools.cache
def _children_files() -> bool:
    return os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def _children_by_scan(me: int) -> set[int]:
    return {int(e.name) for e in os.scandir(_PROC) if e.name.isdigit() and _parent(int(e.name)) == me}


def _parent(pid: int) -> int | None:
    fields = stat_fields(pid)
    return int(fields[1]) if len(fields) > 1 else None
