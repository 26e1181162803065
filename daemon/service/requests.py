"""Every request `spx` can make of the daemon, in one table: its name, who may make it, and where it
is answered.

Why one table: who may do what is the security model of the control socket, and it must be readable
in one place rather than spread over op-string lists in the server, the loop and each handler. The
caller's uid comes from the kernel (SO_PEERCRED), never from the request. Reads are answered on the
client's own thread from the snapshot the loop published and a read-only store connection; changes
are handed to the main loop (the store's only writer) and answered when it has made them.

Who may:
- ANYONE: any local user; what they see is filtered to their own jobs (admins see all);
- OWNER: the named job's owner, root or the admin group — to anyone else the job does not exist;
- ADMIN: root or the admin group (the host's queue and GPUs are the operator's);
- ROOT: root only (adopting runs jobs as their owners).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from spx.daemon.core.users import is_admin
from spx.daemon.state.jobs_table import JobRow
from spx.daemon.state.store import Store


class Who(enum.Enum):
    ANYONE = "anyone"
    OWNER = "the job's owner or an admin"
    ADMIN = "root or the admin group"
    ROOT = "root"


class Target(enum.Enum):
    """What a request's `name` names."""

    NONE = "nothing"
    JOB = "a job"        # looked up by the table's rules (`find_job`) before the handler sees it
    GPU = "a GPU index"
    DIR = "a directory"


@dataclass(frozen=True)
class Request:
    who: Who
    on_loop: bool             # a change, made by the main loop; else a read, answered on the client's thread
    target: Target = Target.JOB
    denied: str = ""          # the reply to a caller `who` does not cover (ADMIN and ROOT requests)


REQUESTS: dict[str, Request] = {
    "ls": Request(Who.ANYONE, on_loop=False, target=Target.NONE),
    "history": Request(Who.ANYONE, on_loop=False, target=Target.NONE),
    # `spx history`: what each job used (its `arg`: since when, Unix seconds).
    "accounting": Request(Who.ANYONE, on_loop=False, target=Target.NONE),
    "gpus": Request(Who.ANYONE, on_loop=False, target=Target.NONE),
    "queue": Request(Who.ANYONE, on_loop=False, target=Target.NONE),
    "status": Request(Who.OWNER, on_loop=False),
    # `spx incidents [NAME]`: one job's (its owner's or an admin's), or those of every job the caller sees.
    "incidents": Request(Who.ANYONE, on_loop=False, target=Target.NONE),
    # `spx verify NAME`: the job file of a replay of NAME's checkpoints (its `arg`: from_step, gpus), which
    # spx submits as the caller; only NAME's owner gets one (the replay runs as whoever submits it).
    "replay-spec": Request(Who.OWNER, on_loop=False),
    # A walk of a volume: slow, so on the client's thread; the jobs it finds are queued by the loop.
    "adopt": Request(Who.ROOT, on_loop=False, target=Target.DIR,
                     denied="only root may adopt jobs (spx adopt runs them as their owners)"),
    "cancel": Request(Who.OWNER, on_loop=True),
    "hold": Request(Who.OWNER, on_loop=True),
    "release": Request(Who.OWNER, on_loop=True),
    "priority": Request(Who.ADMIN, on_loop=True, denied="changing a job's priority needs root or the admin group"),
    "drain": Request(Who.ADMIN, on_loop=True, target=Target.NONE, denied="drain needs root or the admin group"),
    "undrain": Request(Who.ADMIN, on_loop=True, target=Target.NONE, denied="undrain needs root or the admin group"),
    "gpu-release": Request(Who.ADMIN, on_loop=True, target=Target.GPU,
                           denied="releasing a GPU needs root or the admin group"),
}

def error(text: str, code: int = 1) -> dict:
    return {"ok": False, "error": text, "code": code}


def refusal(op: str, name: str | None, uid: int, admin_group: str | None) -> dict | None:
    """Why `uid` may not make request `op` at all (an error reply), or None. OWNER requests are
    checked against the job itself (`owner_may`) once it is looked up: to anyone else it does not exist."""
    request = REQUESTS.get(op)
    if request is None:
        return error(f"unknown request {op[:40]!r}", 2)
    if request.target is not Target.NONE and not name:
        return error(f"{op} needs {request.target.value}", 2)
    if (request.who is Who.ROOT and uid != 0) or (request.who is Who.ADMIN and not is_admin(uid, admin_group)):
        return error(request.denied)
    return None


def find_job(store: Store, name: str, uid: int, admin_group: str | None) -> JobRow | dict:
    """The job a JOB request names, or the error reply: a job `uid` may not act on does not exist
    for them (its owner, root and the admin group see it)."""
    job = store.jobs.by_name(name)
    if job is None or not (job.owner_uid == uid or is_admin(uid, admin_group)):
        return error(f"no job named {name!r}")
    return job
