"""A job's `.spx/` directory inside its checkpoint dir: what survives the loss of the host.

    CHECKPOINT_DIR/.spx/job.yaml    the accepted spec, name, owner and the job's uid (intake/job_record.py)
    CHECKPOINT_DIR/.spx/lease       {"host", "label", "job", "expires", "written", "gen"}: which daemon runs
                                    the job, until when, under which generation (the fencing token)
    CHECKPOINT_DIR/.spx/lease.lock  flock'd around every read-check-write of `lease` (userfs/cas.py); it
                                    keeps the highest generation handed out
    CHECKPOINT_DIR/.spx/state       {"job", "state", ...}: written when the job ended (never re-run it)

Runs only in `user_actions`, that is as the job's owner (the directory is in the owner's tree, so the
kernel decides what may be written there, for them). stdlib only (and core.bounded, which is too:
every number read back is in range). `.spx/` must be the owner's and
writable by nobody else, as `spx adopt`'s scan requires: in a checkpoint dir others may write (a
team's), a `.spx/` another user made — with a lease that would keep the job from ever starting —
is refused with the reason (cas.NotPrivate), never used and never repaired.

The lease goes through the one compare-and-swap (cas.Locked): a daemon takes it when it is free,
expired or already this host's — a new generation each time, so the attempt it launches next has a
token of its own (contract/fencing.py) —; its holder renews it (same generation) only while the
lease still names this host and job; the end marker is written, and the lease given up, only by its
holder (or where there is none). Clocks of the hosts are assumed to agree within a small part of
the lease's length (NTP).
"""

from __future__ import annotations

import errno
import json
import os
import re
from typing import Any

from spx.daemon.contract.fencing import LEASE, LEASE_LOCK, SPX_DIR
from spx.daemon.core import bounded
from spx.daemon.userfs import cas

SPX = SPX_DIR
RECORD = "job.yaml"
STATE = "state"
ENDED = ("succeeded", "failed", "cancelled")
RECORD_MAX_BYTES = 64 * 1024
SMALL_MAX_BYTES = 4096
_UID_LINE = re.compile(rb'^uid: "([0-9a-f]{32})"$', re.M)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
replace_file = cas.replace_file


def _open_spx(ckpt_dir: str, create: bool) -> int | None:
    return open_subdir(ckpt_dir, SPX, create)


def open_subdir(parent: str, name: str, create: bool) -> int | None:
    """fd of PARENT/NAME (made 0700 when `create`); None if it is not there. A link at NAME is an
    error, not followed; a NAME that is not this user's alone is cas.NotPrivate. Also `.spx-gang`."""
    base = os.open(parent, _DIR_FLAGS)
    try:
        return open_subdir_at(base, name, create, parent)
    finally:
        os.close(base)


def open_subdir_at(base: int, name: str, create: bool, shown: str = ".") -> int | None:
    """`open_subdir` below the directory fd `base` (`shown`: its path, for errors)."""
    if create:
        try:
            os.mkdir(name, 0o700, dir_fd=base)
        except FileExistsError:
            pass
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=base)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise OSError(e.errno, f"{shown}/{name} is a symbolic link or not a directory") from e
        raise
    try:
        cas.private_dir(fd, f"{shown}/{name}")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_small(dfd: int, name: str, cap: int = SMALL_MAX_BYTES) -> bytes | None:
    """The owner's regular file `name` (at most `cap` bytes), None if absent."""
    found = cas.read_regular(dfd, name, cap)
    return found[0][:cap] if found is not None else None


def _lease_doc(doc: dict[str, Any] | None) -> dict[str, Any] | None:
    """A lease's content, or None when it is not one (treated as expired: a lease is written whole,
    so garbage there is nobody's). Checked through core.bounded: `expires` is a time in range."""
    if doc is None:
        return None
    try:
        f = bounded.Fields(doc, "lease")
        f.text("host", 4096)
        f.real("expires", 0.0, bounded.MAX_TIME)
    except bounded.Garbage:
        return None
    return doc


def take_lease(dfd: int, mine: dict[str, Any], now: float) -> dict[str, Any]:
    """Take the lease in `.spx` for `mine["host"]`: free, expired, garbage or this host's already —
    always under a new generation. {"held": True, "gen": n}, or {"held": False, "holder": lease}
    while another host's lease is valid (it keeps it), or while the end marker says this job ended
    (on the host that took it over: it never runs again)."""
    with cas.Locked(dfd, LEASE_LOCK) as lk:
        other = _lease_doc(lk.read(LEASE).doc)
        if other is not None and other["host"] != mine["host"] and float(other["expires"]) > now:
            return {"held": False, "holder": other}
        ended = _ended(dfd, str(mine.get("job")))
        if ended is not None:
            return {"held": False, "holder": ended}
        written = lk.write(LEASE, _fields(mine), bump=True)
        return {"held": True, "gen": written["gen"]}


def _ended(dfd: int, job: str) -> dict[str, Any] | None:
    """The end marker of `job` ({"job", "state", "host", "label"?, ...}), None if there is none."""
    try:
        raw = read_small(dfd, STATE)
        doc = bounded.parse_json(raw, "state", max_bytes=SMALL_MAX_BYTES) if raw else None
    except (OSError, bounded.Garbage):
        return None
    if not isinstance(doc, dict) or doc.get("job") != job or doc.get("state") not in ENDED:
        return None
    return {"host": str(doc.get("host")), "label": str(doc.get("label") or doc.get("host")), "job": job,
            "expires": 0.0, "ended": doc["state"]}


def _fields(lease: dict[str, Any]) -> dict[str, Any]:
    return {k: lease[k] for k in ("host", "label", "job", "expires", "written") if k in lease}


def renew_lease(dfd: int, mine: dict[str, Any]) -> dict[str, Any]:
    """Extend the lease while it still names this host and this job (same generation). {"result":
    "held", "gen"}, "other" with the holder (another host took it: this one lost the job — also once
    that host ended the job and gave the lease up), or "absent" (no lease: removed by the owner)."""
    with cas.Locked(dfd, LEASE_LOCK) as lk:
        now = lk.read(LEASE)
        lease = _lease_doc(now.doc)
        if lease is None:
            ended = _ended(dfd, str(mine.get("job")))
            return {"result": "absent"} if ended is None else {"result": "other", "holder": ended}
        if lease["host"] != mine["host"] or lease.get("job") != mine["job"]:
            return {"result": "other", "holder": lease}
        lk.write(LEASE, _fields(mine), bump=False)
        return {"result": "held", "gen": now.gen}


def record_uid(dfd: int) -> str | None:
    """The job uid of `.spx/job.yaml`, None if there is none (or it is unreadable)."""
    try:
        found = cas.read_regular(dfd, RECORD, RECORD_MAX_BYTES)
    except OSError:
        return None
    if found is None:
        return None
    m = _UID_LINE.search(found[0])
    return m.group(1).decode() if m else None


def publish(args: dict[str, Any]) -> dict[str, Any]:
    """At a job's preparation: take its lease, then write `.spx/job.yaml` (args: dir, record, lease,
    now). {"held": true, "gen": n} or {"held": false, "holder": <the other host's lease>} (nothing
    written)."""
    dfd = _open_spx(args["dir"], create=True)
    assert dfd is not None
    try:
        taken = take_lease(dfd, args["lease"], float(args["now"]))
        if taken["held"]:
            replace_file(dfd, RECORD, str(args["record"]).encode())
        return taken
    finally:
        os.close(dfd)


def renew(args: dict[str, Any]) -> list[dict[str, Any]]:
    """For each {"dir", "lease"} in args["jobs"]: renew the lease where `.spx/job.yaml` names this
    job (a job not prepared yet has none: nothing to do). One answer per job: "held", "absent",
    "other" (with the holder) or "error" (with why)."""
    out: list[dict[str, Any]] = []
    for job in args["jobs"]:
        try:
            dfd = _open_spx(job["dir"], create=False)
        except OSError as e:
            out.append({"result": "error", "error": str(e)})
            continue
        if dfd is None:
            out.append({"result": "absent"})
            continue
        try:
            if record_uid(dfd) != job["lease"]["job"]:
                out.append({"result": "absent"})
                continue
            out.append(renew_lease(dfd, job["lease"]))
        except (OSError, TimeoutError) as e:
            out.append({"result": "error", "error": str(e)})
        finally:
            os.close(dfd)
    return out


def mark_ended(args: dict[str, Any]) -> list[str]:
    """For each {"dir", "host", "state": {...}} in args["jobs"]: write `.spx/state` where
    `.spx/job.yaml` names that job and the lease is this host's (or there is none), then give the
    lease up. One word per job: "written", "absent" (no record of that job there), "other" (another
    host's lease or end marker is there: it runs the job now, or did last — its end is that host's to
    record, even once its lease expired, so a job handed over is never ended for good here, nor its
    end there overwritten) or "error: …"."""
    out: list[str] = []
    for job in args["jobs"]:
        try:
            dfd = _open_spx(job["dir"], create=False)
        except OSError as e:
            out.append(f"error: {e}")
            continue
        if dfd is None:
            out.append("absent")
            continue
        try:
            if record_uid(dfd) != job["state"]["job"]:
                out.append("absent")
                continue
            with cas.Locked(dfd, LEASE_LOCK) as lk:
                lease = _lease_doc(lk.read(LEASE).doc)
                ended = _ended(dfd, str(job["state"]["job"]))
                if ((lease is not None and lease["host"] != job["host"])
                        or (ended is not None and ended["host"] != job["host"])):
                    out.append("other")
                    continue
                replace_file(dfd, STATE, json.dumps(job["state"]).encode())
                if lease is not None:
                    lk.remove(LEASE)
            out.append("written")
        except (OSError, TimeoutError) as e:
            out.append(f"error: {e}")
        finally:
            os.close(dfd)
    return out


def claim(args: dict[str, Any]) -> dict[str, Any]:
    """At adoption: take the lease of the job recorded in `dir` (args: dir, lease, now), only if
    `.spx/job.yaml` still names it. {"held": bool, "gen"?: n, "holder"?: lease, "why"?: text}."""
    dfd = _open_spx(args["dir"], create=False)
    if dfd is None:
        return {"held": False, "why": f"{args['dir']}/{SPX} is gone"}
    try:
        if record_uid(dfd) != args["lease"]["job"]:
            return {"held": False, "why": f"{args['dir']}/{SPX}/{RECORD} changed meanwhile"}
        return take_lease(dfd, args["lease"], float(args["now"]))
    finally:
        os.close(dfd)
