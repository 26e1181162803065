"""`spx doctor`'s check that a job can open only its own GPUs' device nodes (run/device_filter.py).

The daemon finds out at start whether it can confine attempts (it manages their cgroups, and the
kernel lets it load a cgroup device program) and writes that finding to `run_dir/device-filter.json`,
again if attaching to an attempt's cgroup fails later. That record is the answer here: only the
running daemon knows its own cgroup and capabilities. Without one (no daemon has run since boot) the
check loads the same program itself and frees it at once, which tells whether this kernel and these
privileges allow it — nothing is attached, so nothing on the host changes.
"""

from __future__ import annotations

import errno
import json
import os
from typing import TYPE_CHECKING, Any

from spx.daemon.doctor.check import Check
from spx.daemon.run import device_filter

if TYPE_CHECKING:
    from spx.daemon.doctor.report import DoctorContext

NAME = "gpu-devices"
RECORD_MAX_BYTES = 4096


def judge_record(record: dict[str, Any], daemon_running: bool) -> Check:
    """The check from the daemon's record. Unconfined is a warning: jobs run, but any of them could
    compute on another's GPUs (the shipped unit leaves the two capabilities it takes to the admin)."""
    who = f"daemon pid {record.get('pid')}" + ("" if daemon_running else ", not running now")
    detail = f"{record.get('detail')} ({who})"
    if record.get("enforced") is True:
        return Check(NAME, "ok", detail)
    return Check(NAME, "warn", f"jobs are not confined to their GPUs: {detail}",
                 str(record.get("fix") or "see the daemon's `device_filter` log line"))


def probe(euid: int) -> Check:
    """No record: can this kernel, for root, load the program at all?"""
    if euid != 0:
        return Check(NAME, "unknown", "no daemon has recorded whether it confines jobs to their GPUs, "
                     "and only root can try to load a cgroup device program",
                     "start the daemon, or run spx doctor as root")
    try:
        os.close(device_filter.load(()))
    except OSError as e:
        return Check(NAME, "warn",
                     f"the kernel refuses a cgroup device program: {e.strerror} "
                     f"({errno.errorcode.get(e.errno or 0, e.errno)}); jobs could open every /dev/nvidiaN",
                     device_filter.FIX_LOAD)
    return Check(NAME, "ok", "this kernel loads cgroup device programs for root; no daemon has recorded "
                 "its own finding yet (it also needs its cgroup delegated: Delegate=yes)")


def check_gpu_devices(ctx: DoctorContext) -> Check:
    path = ctx.run_dir / device_filter.RECORD
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            record = json.loads(os.read(fd, RECORD_MAX_BYTES))
        finally:
            os.close(fd)
    except FileNotFoundError:
        return probe(os.geteuid())
    except (OSError, ValueError) as e:
        return Check(NAME, "unknown", f"cannot read {path}: {e}", "run spx doctor as root")
    if not isinstance(record, dict):
        return Check(NAME, "unknown", f"{path} is not the daemon's record", f"remove {path} and restart the daemon")
    running = isinstance(record.get("pid"), int) and (ctx.proc_root / str(record["pid"])).exists()
    return judge_record(record, running)
