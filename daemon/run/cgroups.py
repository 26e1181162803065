"""Per-attempt cgroup v2 containment, where the daemon's own cgroup is ours to manage.

A cgroup is the one container a process cannot leave on its own: not by `setsid()`, not by scrubbing
its environment, not by double-forking. So where the daemon may manage sub-cgroups, each attempt
runs in its own (`OWN/attempts/JOB-N-ID`), "every process of the attempt" is `cgroup.procs`, and
"all gone" is `populated 0` in `cgroup.events`. The daemon itself moves into the leaf
`OWN/supervisor` first: cgroup v2 lets only leaves hold processes once controllers are enabled,
and systemd's delegation documentation asks for exactly this split.

Whether the daemon may manage its cgroup (`cgroups:` in the config):
- `auto` (default): only when systemd delegated it (`Delegate=yes`), which systemd marks with the
  `user.delegate` xattr (v252+, readable without CAP_SYS_ADMIN; `trusted.delegate` since v251).
  Elsewhere — a login session's scope, a container's root — the cgroup is someone else's, and the
  daemon falls back to finding processes by tag and process group (proctree.py).
- `on`: the operator says the cgroup is the daemon's (a non-systemd init, a test); failing to use
  it is then an error at start-up, not a silent fallback.
- `off`: never.

The attempt cgroup's name comes from the store's attempt row (job name, number, attempt id), so a
restarted daemon finds and kills the leftovers of its predecessor in the same way.
"""

from __future__ import annotations

import errno
import os
import signal
from dataclasses import dataclass
from pathlib import Path

from spx.daemon.core.config import CgroupMode

SUPERVISOR_LEAF = "supervisor"
ATTEMPTS_DIR = "attempts"
DELEGATE_XATTRS = ("user.delegate", "trusted.delegate")


class CgroupError(Exception):
    """`cgroups: on`, but the daemon cannot manage its cgroup; the message says why and the fix."""


# --- where the daemon's cgroup is ------------------------------------------------------------------


def own_cgroup(mountinfo: str, proc_cgroup: str) -> Path | None:
    """The directory of a process's cgroup v2, from its /proc/PID/mountinfo and /proc/PID/cgroup.

    The `0::` line is relative to the cgroup namespace's root; a cgroup2 mount shows the part of
    the hierarchy under its own root (mountinfo field 4), so a mount whose root is an ancestor of
    that path holds the directory. None where no cgroup2 is mounted (pure v1) or visible.
    """
    rel = next((ln[3:] for ln in proc_cgroup.splitlines() if ln.startswith("0::")), None)
    if rel is None:
        return None
    rel = rel.removesuffix(" (deleted)")
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        if not right or right.split()[0] != "cgroup2":
            continue
        fields = left.split()
        root, mount_point = fields[3], fields[4]
        if rel == root or rel.startswith(root.rstrip("/") + "/"):
            return Path(mount_point) / rel[len(root):].lstrip("/")
    return None


def delegated(cgroup: Path) -> bool:
    """Did systemd delegate this cgroup (`Delegate=yes`)? It marks it with a `delegate` xattr."""
    for name in DELEGATE_XATTRS:
        try:
            if os.getxattr(cgroup, name) == b"1":
                return True
        except OSError:  # ENODATA: not set; EPERM/EOPNOTSUPP: trusted.* without CAP_SYS_ADMIN
            continue
    return False


def is_root(cgroup: Path, mountinfo: str) -> bool:
    """The root of the hierarchy (the host's, or a container's namespace root): never ours. That is
    where a cgroup2 mount of "/" is mounted — not a bind mount of a subtree, such as the writable
    one of the unit's own cgroup that ReadWritePaths= makes under ProtectControlGroups=."""
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields = left.split()
        if right.split()[:1] == ["cgroup2"] and fields[3] == "/" and Path(fields[4]) == cgroup:
            return True
    return False


# --- the managed tree --------------------------------------------------------------------------------


@dataclass(frozen=True)
class CgroupTree:
    """The daemon's own cgroup, managed: the daemon in `supervisor/`, attempts in `attempts/`."""

    root: Path

    @property
    def supervisor(self) -> Path:
        return self.root / SUPERVISOR_LEAF

    @property
    def attempts(self) -> Path:
        return self.root / ATTEMPTS_DIR

    def prepare(self) -> None:
        self.supervisor.mkdir(exist_ok=True)
        self.attempts.mkdir(exist_ok=True)

    def enable_memory_accounting(self) -> str | None:
        """Enable the memory controller down to the attempt cgroups (after `enter`: a cgroup with
        processes of its own cannot enable controllers for its children), so each attempt's
        `memory.peak` exists (`spx history`). None when done, else why not: the attempts run on
        unmeasured (a host whose memory controller is bound to cgroup v1, one not delegated)."""
        for cg in (self.root, self.attempts):
            try:
                if "memory" not in (_read(cg / "cgroup.controllers") or "").split():
                    return f"no memory controller in {cg}/cgroup.controllers"
                if "memory" not in (_read(cg / "cgroup.subtree_control") or "").split():
                    (cg / "cgroup.subtree_control").write_text("+memory")
            except OSError as e:
                return f"cannot enable memory in {cg}/cgroup.subtree_control: {e.strerror}"
        return None

    def enter(self, pid: int) -> None:
        """Move `pid` (the daemon, all its threads) into the supervisor leaf."""
        (self.supervisor / "cgroup.procs").write_text(str(pid))

    def attempt(self, job: str, number: int, attempt_id: str) -> Path:
        """The cgroup of one attempt, named from what the store keeps about it. Job names are
        `[a-z0-9][a-z0-9-_.]*`, so this is a single path element that cannot clash with a
        `cgroup.*` interface file."""
        return self.attempts / f"{job}-{number}-{attempt_id[:12]}"

    def attempt_cgroups(self) -> list[Path]:
        try:
            return sorted(Path(e.path) for e in os.scandir(self.attempts) if e.is_dir(follow_symlinks=False))
        except FileNotFoundError:
            return []


def manage(mode: CgroupMode, own: Path | None, mountinfo: str, daemon_pid: int) -> tuple[CgroupTree | None, str]:
    """Decide whether to manage `own` (the daemon's cgroup); if so, make its two subdirectories
    and move the daemon into the supervisor leaf. Returns the tree (or None) and the reason, for
    the log. Raises CgroupError for `on` when that cannot be done."""
    if mode == "off":
        return None, "cgroups: off in the config"
    if own is not None and own.name == SUPERVISOR_LEAF:
        own = own.parent  # started in the leaf already (systemd >= 254: DelegateSubgroup=supervisor)
    why_not = None
    if own is None:
        why_not = "no cgroup v2 hierarchy is mounted (or this process is not in it)"
    elif is_root(own, mountinfo):
        why_not = f"the daemon runs in the root cgroup ({own}), which is not its own"
    elif mode == "auto" and not delegated(own):
        return None, f"{own} is not delegated to the daemon (no user.delegate xattr; systemd sets it with Delegate=yes)"
    else:
        tree = CgroupTree(own)
        try:
            tree.prepare()
            tree.enter(daemon_pid)
            unmeasured = tree.enable_memory_accounting()
            memory = f"; attempts' memory.peak not measured: {unmeasured}" if unmeasured else ""
            return tree, f"{own} is {'delegated' if mode == 'auto' else 'ours (cgroups: on)'}{memory}"
        except OSError as e:
            why_not = f"cannot manage sub-cgroups of {own}: {e}"
    if mode == "on":
        raise CgroupError(f"cgroups: on, but {why_not}; start the daemon in a cgroup of its own "
                          "(systemd: Delegate=yes) or set cgroups: auto")
    return None, why_not


def manage_own(mode: CgroupMode) -> tuple[CgroupTree | None, str]:
    """`manage` for the calling process (the daemon, at start-up, before it starts any thread)."""
    mountinfo = Path("/proc/self/mountinfo").read_text()
    own = own_cgroup(mountinfo, Path("/proc/self/cgroup").read_text())
    return manage(mode, own, mountinfo, os.getpid())


# --- one attempt's cgroup --------------------------------------------------------------------------


def _read(interface_file: Path) -> str | None:
    """An interface file's text; None once its cgroup is gone (ENOENT, or ENODEV mid-removal)."""
    try:
        return interface_file.read_text()
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENODEV):
            return None
        raise


def procs(cgroup: Path) -> list[int]:
    """Pids in the cgroup itself (the kernel lists no zombies); empty once it is gone."""
    return [int(p) for p in (_read(cgroup / "cgroup.procs") or "").split()]


def memory_peak(cgroup: Path) -> int | None:
    """The cgroup's `memory.peak` (bytes, the kernel's high-water mark of its memory: Linux 5.19+),
    or None where it has none (no memory controller there, an older kernel, the cgroup gone)."""
    try:
        text = _read(cgroup / "memory.peak")
    except OSError:
        return None
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def populated(cgroup: Path) -> bool:
    """Any live process in it or below it? `cgroup.events` is the kernel's own answer."""
    return "populated 1" in (_read(cgroup / "cgroup.events") or "").splitlines()


def signal_all(cgroup: Path, sig: int) -> list[int]:
    """Send `sig` to every process in the cgroup; returns the pids it went to."""
    pids = procs(cgroup)
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    return pids


def kill(cgroup: Path) -> None:
    """SIGKILL everything in the cgroup and below. `cgroup.kill` (Linux 5.14+) does it atomically,
    forks in flight included; without it, each listed pid gets SIGKILL and the caller repeats
    until `populated` turns 0."""
    kill_file = cgroup / "cgroup.kill"
    try:
        if kill_file.exists():  # opening a missing interface file gives EACCES, not ENOENT
            kill_file.write_text("1")
            return
    except FileNotFoundError:  # removed meanwhile: nothing left to kill
        return
    signal_all(cgroup, signal.SIGKILL)


def remove(cgroup: Path) -> bool:
    """rmdir an emptied attempt cgroup. False while processes remain (EBUSY) or on any error."""
    try:
        cgroup.rmdir()
        return True
    except FileNotFoundError:
        return True
    except OSError:
        return False


def sweep(tree: CgroupTree, keep: set[Path]) -> tuple[list[Path], list[Path]]:
    """Attempt cgroups that belong to no live attempt: kill what is in them, remove the empty ones.
    Everything under `attempts/` is the daemon's by construction, so a populated stray (a lost
    store, a process that outlived an attempt) is killed, not left holding GPUs. Returns (killed,
    removed); a killed one is removed by a later sweep, once the kernel has emptied it."""
    killed, removed = [], []
    for cg in tree.attempt_cgroups():
        if cg in keep:
            continue
        if populated(cg):
            kill(cg)
            killed.append(cg)
        elif remove(cg):
            removed.append(cg)
    return killed, removed
