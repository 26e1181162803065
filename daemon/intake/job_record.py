"""What a job leaves next to its checkpoints so that another host can take it over (host loss).

A spot host can be reclaimed whole: its spool, state store and logs go with it; the checkpoint
volume survives. So every job keeps, in `CHECKPOINT_DIR/.spx/` (written as its owner, see
userfs/spx_dir.py):

- `job.yaml` — this module's `render`: the job's uid (its identity on every host), name, owner name,
  submission time, the host that wrote it and the accepted spec. Written at each preparation of an
  attempt (so it also records where the job runs now).
- `lease` — `lease_doc`: which daemon (`host_id`) runs the job, until when, and its generation (the
  fencing token its attempts are launched with); renewed while the job is live there
  (run/lease_keeper.py). A daemon adopts a job only while nobody else holds it.
- `state` — `state_doc`: the terminal state, written when the job ends: `spx adopt` never re-runs a
  finished, failed or cancelled job.

`parse` is the adopting daemon's reader: the file is in a user's tree and is hostile (it arrives
capped and opened safely by intake/adopt_scan.py); it is read as YAML without aliases or deep
nesting and validated like a spool file. What it says about the owner is only checked, never
believed: the owner is the file's owner (see adopt_scan). `lease_of` and `ended_state` read the
other two through `core.bounded`: what is not a lease or an end marker is `Garbage` with the reason
(adopt_scan refuses that record with it), never an OverflowError or RecursionError.
"""

from __future__ import annotations

import functools
import re
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from spx.daemon.core import bounded
from spx.daemon.core.spec import JobSpec
from spx.daemon.core.spec_yaml import SpecError, read_yaml
from spx.daemon.state.jobs_table import JobRow
from spx.daemon.userfs import fsafe

FORMAT = 1
MACHINE_ID = Path("/etc/machine-id")
_UID = re.compile(r"^[0-9a-f]{32}$")
TERMINAL_STATES = ("succeeded", "failed", "cancelled")
SMALL_MAX_BYTES = 4096  # a lease or end marker (adopt_scan reads no more)
MAX_HOST_CHARS = 4096   # a lease's host: machine id and the daemon's state dir (a path)
MAX_REASON_CHARS = 1000


class RecordError(bounded.Garbage):
    """`.spx/job.yaml` is not a record this daemon can adopt; `detail` says why."""

    def __init__(self, detail: str) -> None:
        super().__init__(".spx/job.yaml", detail)


@dataclass(frozen=True)
class Record:
    uid: str
    name: str
    owner: str
    submitted: float
    host: str
    spec: JobSpec


def host_id(state_dir: Path) -> str:
    """Who holds a lease: this machine (/etc/machine-id) and this daemon's state dir, so two daemons
    on one machine (two --root) are two holders, and a daemon restarted on its own root is the same."""
    return f"{_machine_id()}:{state_dir.absolute()}"


@functools.cache
def _machine_id() -> str:
    try:
        machine = fsafe.read_file(MACHINE_ID, MACHINE_ID.parent, 256).decode("ascii", "replace").strip()
    except OSError:
        machine = ""
    return machine or f"no-machine-id-{socket.gethostname()}"


def render(job: JobRow, host: str) -> str:
    """The text of `.spx/job.yaml` for `job`. The uid line comes first and always quoted: the owner's
    helper finds it with a regex (stdlib only, see spx_dir.record_uid)."""
    body = {
        "name": job.name,
        "owner": job.owner,
        "owner_uid": job.owner_uid,
        "submitted": job.submitted,
        "host": host,
        "spec": job.spec.model_dump(mode="json", by_alias=True),
    }
    return (f"# spx-trainer job record (host loss: `spx adopt` re-queues the job from here); written by the daemon\n"
            f'uid: "{job.uid}"\nformat: {FORMAT}\n'
            + yaml.safe_dump(body, sort_keys=False, default_flow_style=False, allow_unicode=True))


def parse(raw: bytes) -> Record:
    """The record in `raw` (at most 64 KiB, read safely by the caller); RecordError if it is not one."""
    try:
        _root, data = read_yaml(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise RecordError("not UTF-8 text") from None
    except SpecError as e:
        raise RecordError(f"not a readable record: {e.render('job.yaml')}") from None
    if not isinstance(data, dict):
        raise RecordError("not a mapping")
    if type(data.get("format")) is not int or data.get("format") != FORMAT:
        raise RecordError(f"format {data.get('format')!r}, this daemon reads format {FORMAT}")
    uid, name, owner, host = data.get("uid"), data.get("name"), data.get("owner"), data.get("host")
    if not isinstance(uid, str) or not _UID.match(uid):
        raise RecordError("uid: missing or not 32 hex digits")
    if not isinstance(owner, str) or not owner or not isinstance(host, str):
        raise RecordError("owner/host: missing")
    try:
        submitted = bounded.real(data.get("submitted"), "job.yaml", 1.0, bounded.MAX_TIME, "submitted")
    except bounded.Garbage as e:
        raise RecordError(f"{e.detail} (a Unix time)") from None
    try:
        spec = JobSpec.model_validate(data.get("spec"))
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors()[:5])
        raise RecordError(f"spec: {problems}") from None
    if name != spec.name:
        raise RecordError(f"name {name!r} differs from the spec's {spec.name!r}")
    return Record(uid, spec.name, owner, submitted, host, spec)


def host_label(state_dir: Path) -> str:
    """The lease holder as people read it (`spx status`, the reason of a job handed over): this
    machine's name and the daemon's state dir."""
    return f"{socket.gethostname()}:{state_dir.absolute()}"


def lease_doc(host: str, job_uid: str, seconds: float, now: float, label: str | None = None) -> dict[str, Any]:
    """A lease for `host` (host_id) on job `job_uid`, valid `seconds` from `now`. The generation (the
    fencing token) is the compare-and-swap's to set (userfs/spx_dir.py)."""
    return {"host": host, "label": label or host, "job": job_uid, "expires": now + seconds, "written": now}


def state_doc(job: JobRow, host: str, now: float, label: str | None = None) -> dict[str, Any]:
    # Cut: adopt_scan reads at most SMALL_MAX_BYTES of the marker, and one cut short is no marker.
    reason = job.reason[:MAX_REASON_CHARS] if job.reason else job.reason
    return {"job": job.uid, "state": job.state.value, "reason": reason, "host": host, "label": label or host,
            "time": now}


def ended_state(raw: bytes | None, job_uid: str) -> str | None:
    """The terminal state `.spx/state` (content `raw`) records for `job_uid`; None if none (absent,
    or about another job that used the same directory). Garbage if it is no end marker."""
    if raw is None:
        return None
    f = bounded.Fields(bounded.parse_json(raw, ".spx/state", max_bytes=SMALL_MAX_BYTES), ".spx/state")
    job, state = f.text("job", 64, missing=None), f.text("state", 32, missing=None)
    f.real("time", 0.0, bounded.MAX_TIME, missing=None)
    return state if job == job_uid and state in TERMINAL_STATES else None


def lease_of(raw: bytes | None) -> dict[str, Any] | None:
    """The lease in `raw` ({"host", "job", "expires"}), None if absent; Garbage if it is no lease."""
    if raw is None:
        return None
    f = bounded.Fields(bounded.parse_json(raw, ".spx/lease", max_bytes=SMALL_MAX_BYTES), ".spx/lease")
    return {"host": f.text("host", MAX_HOST_CHARS), "job": f.text("job", 64, missing=None),
            "expires": f.real("expires", 0.0, bounded.MAX_TIME)}


def lease_until(lease: dict[str, Any]) -> str:
    """When `lease` (read by `lease_of`, or a holder a helper reported) expires, as UTC text."""
    try:
        expires = bounded.real(lease.get("expires"), ".spx/lease", 0.0, bounded.MAX_TIME)
    except bounded.Garbage:
        return "an unknown time"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expires))
