"""What passes between one spx-trainer process and the next under systemd: the reload handshake and
the stop guard. Jobs outlive the daemon (each attempt runs under its own monitor, in its own cgroup,
and the unit has KillMode=process), so only these two moments decide whether they keep running.

Reload (`systemctl reload spx-trainer`; ExecReload= runs `spx-trainer --reload $MAINPID`):
  the daemon, on SIGHUP, re-executes itself with the code now installed — same pid, so systemd
  keeps its MAINPID and the attempt monitors stay its children — and the new image's start adopts
  the running attempts. systemd 252 ends a reload as soon as its ExecReload= command exits (whatever
  RELOADING=1 said), so the command waits itself: it sends SIGHUP and returns once the daemon has
  written a different `daemon.ready` into run_dir: a new image id (re-executed), or the old image's
  refusal (the new code failed its check, nothing was closed) — or once the daemon is gone.

Stop guard (ExecStopPost= runs `spx-trainer --stop-post`): systemd signals only the daemon
  (KillMode=process), so a crash or watchdog kill leaves the jobs running for the restarted daemon
  to adopt. On a real stop the daemon stops every job itself (SIGTERM, the job's grace, SIGKILL)
  before it exits; the guard then kills whatever is still in the unit's cgroup — a daemon that ran
  out of time, or died while stopping — so a stop leaves nothing running. "A real stop" is: the
  daemon exited cleanly (it does so only when told to stop), systemd timed it out, or it had begun
  stopping (`stopping` marker in run_dir) when it died. Any other end (killed, crashed, aborted by
  the watchdog, bad exit status) is a crash: the jobs stay, whether or not systemd restarts the
  daemon; the next start adopts them.

run_dir is root-owned and verified the daemon's own (fsafe.open_root_dir); the markers are written
and read by its fd, never following links. One more marker lives there for `spx doctor`: whether
this daemon confines jobs to their GPUs' device nodes (`device-filter.json`, run/device_filter.py).
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from pathlib import Path

from spx.daemon.core.log import get_logger
from spx.daemon.run import cgroups, device_filter
from spx.daemon.userfs import fsafe

log = get_logger()
READY = "daemon.ready"
STOPPING = "stopping"
RUN_DIR_MODE = 0o755  # as control.py makes it: the socket and heartbeat dirs are reached through it
# SERVICE_RESULT values (systemd.exec(5)) of an end that is a stop, not a crash.
STOP_RESULTS = ("success", "timeout")
# How long the guard lets the tree empty itself (log relays draining the jobs' last output).
DRAIN_SECONDS = 5.0


# --- markers in run_dir ------------------------------------------------------------------------------


def _write(run_dir: Path, name: str, doc: dict) -> None:
    fd = fsafe.open_root_dir(run_dir, RUN_DIR_MODE)
    try:
        tmp = f".{name}.tmp-{os.getpid()}"
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=fd)
        try:
            os.write(out, json.dumps(doc).encode())
        finally:
            os.close(out)
        os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
    finally:
        os.close(fd)


def _read(run_dir: Path, name: str) -> dict | None:
    try:
        fd = fsafe.open_root_dir(run_dir, RUN_DIR_MODE)
    except OSError:
        return None
    try:
        f = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        doc = json.loads(os.read(f, 4096))
    except (OSError, ValueError):
        return None
    finally:
        os.close(f)
    return doc if isinstance(doc, dict) else None


def _remove(run_dir: Path, name: str) -> None:
    fd = fsafe.open_root_dir(run_dir, RUN_DIR_MODE)
    try:
        os.unlink(name, dir_fd=fd)
    except FileNotFoundError:
        pass
    finally:
        os.close(fd)


def mark_device_filter(run_dir: Path, finding: dict) -> None:
    """Whether this daemon confines jobs to their GPUs' device nodes, and why not (run/device_filter.py);
    `spx doctor` reads it."""
    _write(run_dir, device_filter.RECORD, {**finding, "pid": os.getpid(), "time": time.time()})


def mark_ready(run_dir: Path, version: str, adopted: int) -> None:
    """At READY=1: this image is up (a fresh image id, so a reload's waiter tells it from the last)."""
    _write(run_dir, READY, {"pid": os.getpid(), "image": uuid.uuid4().hex, "version": version, "adopted": adopted})


def mark_refused(run_dir: Path, why: str) -> None:
    """A reload that did not happen: the old image runs on, and the waiter says why."""
    _write(run_dir, READY, {**(_read(run_dir, READY) or {"pid": os.getpid()}), "refused": why,
                            "refused_id": uuid.uuid4().hex})


def mark_stopping(run_dir: Path) -> None:
    """The daemon has begun a stop: if it dies now, the stop guard still ends its jobs."""
    _write(run_dir, STOPPING, {"pid": os.getpid(), "at": time.time()})


def clear_stopping(run_dir: Path) -> None:
    """At start: a stop that a previous daemon began is over (RuntimeDirectoryPreserve=restart keeps
    run_dir across restarts, so the marker may still be there)."""
    _remove(run_dir, STOPPING)


# --- ExecReload= ----------------------------------------------------------------------------------------


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def request_reload(run_dir: Path, pid: int, timeout: float, poll: float = 0.1) -> tuple[bool, str]:
    """SIGHUP to the daemon `pid`, then wait until it says how the reload went. Returns (done, what)."""
    before = _read(run_dir, READY)
    try:
        os.kill(pid, signal.SIGHUP)
    except ProcessLookupError:
        return False, f"no daemon with pid {pid}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = _read(run_dir, READY)
        if now is not None and now != before and now.get("pid") == pid:
            if now.get("refused"):
                return False, f"reload refused, pid {pid} runs on unchanged: {now['refused']}"
            return True, (f"pid {pid} re-executed: version {now.get('version')}, "
                          f"adopted {now.get('adopted')} running job(s)")
        if not _alive(pid):
            return False, f"pid {pid} exited during the reload (systemd restarts it; running jobs are kept)"
        time.sleep(poll)
    return False, f"pid {pid} did not finish the reload in {timeout:.0f} s (it re-executes once no job is between phases)"


# --- ExecStopPost= --------------------------------------------------------------------------------------


def is_stop(service_result: str, stopping: bool) -> bool:
    """Did the unit end in a stop (kill what is left) rather than a crash (keep the jobs)?"""
    return service_result in STOP_RESULTS or stopping


def unit_cgroup(own: Path | None) -> Path | None:
    """The unit's cgroup, from the stop guard's own: systemd runs ExecStopPost= of a delegated unit
    in its `.control` sub-cgroup."""
    if own is None:
        return None
    return own.parent if own.name == ".control" else own


def _populated_except(unit: Path, own: Path) -> list[Path]:
    """The unit's cgroup and every cgroup below it that holds processes, except the guard's own."""
    found = []
    for dirpath, dirnames, _ in os.walk(unit):
        here = Path(dirpath)
        if here == own:
            dirnames.clear()
            continue
        if cgroups.procs(here):
            found.append(here)
    return found


def stop_post(run_dir: Path | None, service_result: str, drain_seconds: float = DRAIN_SECONDS) -> int:
    """The stop guard. Always exits 0: it must never turn a stop into a failure."""
    stopping = run_dir is not None and _read(run_dir, STOPPING) is not None
    if not is_stop(service_result, stopping):
        log.info("jobs_kept_running", service_result=service_result,
                 detail="the daemon crashed; its restart (or next start) adopts the running jobs")
        return 0
    mountinfo = Path("/proc/self/mountinfo").read_text()
    own = cgroups.own_cgroup(mountinfo, Path("/proc/self/cgroup").read_text())
    unit = unit_cgroup(own)
    if own is None or unit is None or unit == own or cgroups.is_root(unit, mountinfo):
        log.warning("stop_guard_no_cgroup", cgroup=str(own), detail="not in a unit's .control cgroup: nothing killed")
        return 0
    deadline = time.monotonic() + drain_seconds
    while (left := _populated_except(unit, own)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for cg in left:
        pids = cgroups.procs(cg)
        if cg == unit:
            cgroups.signal_all(cg, signal.SIGKILL)
        else:
            cgroups.kill(cg)
        log.warning("left_over_processes_killed", service_result=service_result, stopping=stopping,
                    cgroup=str(cg), pids=pids)
    if not left:
        log.info("stop_guard_nothing_left", service_result=service_result, stopping=stopping)
    return 0
