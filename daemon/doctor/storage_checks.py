"""`spx doctor`'s storage checks: /checkpoints is a separate, persistent, writable mount with free
space whose `flock` works between hosts (the leases and fencing of host loss depend on it); the
dataset staging target is local NVMe and the source is not what training reads."""

from __future__ import annotations

import errno
import fcntl
import os
import pwd
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from spx.daemon.doctor.check import Check
from spx.daemon.doctor.hostprobe import all_disks, block_info, local_nvme_disks, mount_for, root_mount
from spx.daemon.staging.copier import human_bytes

if TYPE_CHECKING:
    from spx.daemon.doctor.report import DoctorContext



def _writable(path: Path) -> str | None:
    """None if a file can be created, written, fsynced and removed in path, else the error."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".spx-doctor-", dir=path)
        try:
            os.write(fd, b"x")
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(tmp)
    except OSError as e:
        return e.strerror or str(e)
    return None


def check_checkpoints(ctx: DoctorContext) -> Check:
    root = ctx.checkpoints_root
    fix_mount = (f"mount a persistent volume at {root} (a disk or network file system of its own that survives "
                 "a reinstall of the host) before training")
    if not root.is_dir():
        return Check("checkpoints", "fail", f"{root} does not exist", fix_mount)
    m = mount_for(root, ctx.mounts)
    top = root_mount(ctx.mounts)
    if m is None:
        return Check("checkpoints", "unknown", f"no mount found for {root} in mountinfo", fix_mount)
    where = f"{m.describe()} at {m.mount_point}"
    if m.kind == "volatile":
        return Check("checkpoints", "fail", f"{root} is on {where}: not persistent (lost on reboot/redeploy)", fix_mount)
    if m.mount_point == "/" or (top is not None and m.dev == top.dev and m.kind == "local"):
        what = "the root filesystem" if m.mount_point == "/" else f"a bind mount of the root filesystem ({where})"
        return Check("checkpoints", "fail", f"{root} is on {what} ({top.describe() if top else m.describe()}), "
                     "not a separate persistent volume", fix_mount)
    if m.read_only:
        return Check("checkpoints", "fail", f"{root} is on {where}, mounted read-only", f"remount {m.mount_point} rw")
    if err := _writable(root):
        return Check("checkpoints", "fail", f"{root} ({where}) is not writable by uid {os.geteuid()}: {err}",
                     f"chmod/chown {root} so the daemon can create per-job directories")
    st = os.statvfs(root)
    free = st.f_bavail * st.f_frsize
    detail = f"{root}: {where}, writable, {human_bytes(free)} free of {human_bytes(st.f_blocks * st.f_frsize)}"
    if free < ctx.checkpoint_fail_free_bytes:
        return Check("checkpoints", "fail", detail + f" (under the {human_bytes(ctx.checkpoint_fail_free_bytes)} minimum)",
                     f"free space on {m.mount_point} or grow the volume")
    if free < ctx.checkpoint_min_free_bytes:
        return Check("checkpoints", "warn", detail + f" (under {human_bytes(ctx.checkpoint_min_free_bytes)})",
                     "a checkpoint with optimizer state is ~16 bytes per parameter; lower checkpoints.keep or grow the volume")
    return Check("checkpoints", "ok", detail)


# Run by a second process: does it see the first one's lock? (Two processes, one lock file: a
# conflict must be seen; a file system that grants both, or refuses flock, cannot hold a lease.)
_LOCK_PROBE = """
import errno, fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_NOFOLLOW)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    print("granted")
except BlockingIOError:
    print("conflict")
except OSError as e:
    print("error", errno.errorcode.get(e.errno, e.errno))
"""
LOCK_PROBE_TIMEOUT_SECONDS = 10.0
_FIX_LOCKS = ("mount the checkpoint volume with working flock between hosts: NFSv4 (or NFSv3 with lockd, "
              "without nolock or local_lock=flock|all), Lustre with -o flock, CephFS, GPFS, or a local file system")


def _mount_lock_problem(fstype: str, options: tuple[str, ...]) -> tuple[str, str] | None:
    """(status, why) when the mount's options say flock is not a lock between hosts; None otherwise."""
    opts = set(options)
    if fstype.startswith("nfs"):
        if "nolock" in opts:
            return "fail", "NFS mounted nolock: flock is local to each host"
        if {"local_lock=flock", "local_lock=all"} & opts:
            return "fail", "NFS mounted local_lock=flock|all: flock is local to each host"
        if {"vers=3", "nfsvers=3"} & opts:
            return "warn", "NFSv3: flock works between hosts only while lockd (NLM) runs on the server and every host"
    if fstype == "lustre" and "flock" not in opts:
        why = "localflock: flock is local to each host" if "localflock" in opts else "no flock option: flock fails"
        return "fail", f"Lustre mounted without -o flock ({why})"
    return None


def _probe_dir(root: Path) -> Path | None:
    """Where the invoking user may make the probe's lock file: the checkpoints root (root), or their
    own `checkpoints_root/USER`."""
    if os.access(root, os.W_OK | os.X_OK):
        return root
    try:
        mine = root / pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return None
    return mine if mine.is_dir() and os.access(mine, os.W_OK | os.X_OK) else None


def _lock_conflict(where: Path) -> str:
    """Hold an exclusive flock on a fresh file in `where` and ask a second process for the same
    lock: "conflict" (locks work), "granted" (they do not), "error …", or why the probe could not run."""
    fd, tmp = tempfile.mkstemp(prefix=".spx-doctor-lock-", dir=where)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            return f"error {errno.errorcode.get(e.errno or 0, e.errno)}"
        try:
            r = subprocess.run([sys.executable, "-I", "-c", _LOCK_PROBE, tmp], capture_output=True, text=True,
                               timeout=LOCK_PROBE_TIMEOUT_SECONDS, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return f"error: the second process hung for {LOCK_PROBE_TIMEOUT_SECONDS:.0f} s"
        return r.stdout.strip() or f"error: the second process said nothing ({r.stderr.strip()[-200:]})"
    finally:
        os.close(fd)
        os.unlink(tmp)


def check_checkpoint_locks(ctx: DoctorContext) -> Check:
    """flock on the checkpoints root is a lock: one process holds it, a second one sees the conflict
    (and the mount's options do not make it local to each host)."""
    root = ctx.checkpoints_root
    if not root.is_dir():
        return Check("checkpoint-locks", "unknown", f"{root} does not exist", f"create {root}, then run spx doctor again")
    m = mount_for(root, ctx.mounts)
    mount_problem = _mount_lock_problem(m.fstype, m.options + m.super_options) if m is not None else None
    where = _probe_dir(root)
    if where is None:
        return Check("checkpoint-locks", "unknown", f"uid {os.geteuid()} cannot create a file in {root} to try flock",
                     "run spx doctor as root")
    try:
        seen = _lock_conflict(where)
    except OSError as e:
        return Check("checkpoint-locks", "unknown", f"cannot try flock in {where}: {e.strerror or e}",
                     "run spx doctor as root")
    fs = f" ({m.describe()})" if m is not None else ""
    if seen != "conflict":
        what = "a second process got the same lock" if seen == "granted" else f"flock failed: {seen}"
        return Check("checkpoint-locks", "fail", f"{where}{fs}: {what}; leases and fencing cannot work there", _FIX_LOCKS)
    if mount_problem is not None:
        return Check("checkpoint-locks", mount_problem[0], f"{where}{fs}: flock works on this host, but "
                     f"{mount_problem[1]}", _FIX_LOCKS)
    return Check("checkpoint-locks", "ok", f"{where}{fs}: flock holds between two processes (the lease's lock)")


def _disks_summary(ctx: DoctorContext) -> str:
    disks = all_disks(ctx.sys_root)
    return ", ".join(f"{n} ({k})" for n, k in disks) or "none found"


def _staging_target(ctx: DoctorContext, source: Path | None, target: Path) -> Check:
    name = "staging"
    m = mount_for(target, ctx.mounts)
    if m is None:
        return Check(name, "unknown", f"no mount found for {target}", "check /proc/self/mountinfo")
    where = f"{target} is on {m.describe()} at {m.mount_point}"
    fix_nvme = (f"stage to a directory on the local NVMe disk (local NVMe here: "
                f"{', '.join(local_nvme_disks(ctx.sys_root)) or 'none'}) — format and mount it, e.g. at /nvme")
    src = ""
    if source is not None and (sm := mount_for(source, ctx.mounts)) is not None:
        src = f"; source {source} on {sm.describe()} ({sm.kind})"
        if sm.mount_id == m.mount_id:
            return Check(name, "warn", where + src + ": source and target share one filesystem, staging only duplicates",
                         fix_nvme)
    if m.kind == "network":
        return Check(name, "fail", where + src + ": training would read the data over the network", fix_nvme)
    if m.kind == "volatile":
        return Check(name, "warn", where + src + ": RAM-backed, uses host memory and is lost on reboot", fix_nvme)
    info = block_info(m, ctx.sys_root)
    disks = f" ({info.kind}: {info.describe()})"
    if info.kind == "nvme":
        return Check(name, "ok", where + disks + src)
    if info.kind == "ssd":
        return Check(name, "warn", where + disks + src + ": a local SSD, but not NVMe", fix_nvme)
    if info.kind == "unknown":
        return Check(name, "unknown", where + src + ": cannot tell which disk backs it", fix_nvme)
    return Check(name, "fail", where + disks + src + ": not local NVMe", fix_nvme)


def check_staging(ctx: DoctorContext) -> list[Check]:
    """The staging targets given; without any (the command line judges no job), what the host offers
    for staging: a fact, not a problem — a host without local NVMe reads datasets where they are."""
    if ctx.staging:
        return [_staging_target(ctx, src, dst) for src, dst in ctx.staging]
    nvme = local_nvme_disks(ctx.sys_root)
    if nvme:
        return [Check("staging", "ok", f"local NVMe for data.stage targets: {', '.join(nvme)}")]
    return [Check("staging", "ok", f"no local NVMe disk (disks: {_disks_summary(ctx)}): jobs read datasets "
                  "where they are, or stage them to another local disk (data.stage)")]
