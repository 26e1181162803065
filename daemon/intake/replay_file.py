"""The job file of a replay of a job's checkpoints (docs/verify.md): for `spx verify NAME`, which
`spx` submits as NAME's owner (the spool's rules: the file's owner is the job's owner), and for the
periodic replays of a job file's `verify: {every_checkpoints: N}` (run/auto_verify.py), queued by the
daemon for the owner.

The replay is NAME's own command (launcher, script or module, args, interpreter, environment, data)
on as many GPUs (or the ones asked for) with `replay: {of: NAME, from_step}` and NAME's checkpoint
dir, never restarted: a verdict comes from one clean run. Only NAME's owner may ask for one: the
replay runs as whoever submits it, and reads NAME's checkpoints with their rights.
"""

from __future__ import annotations

import json

import yaml

from spx.daemon.core.bounded import MAX_WHOLE
from spx.daemon.core.spec import NAME_RE, JobSpec
from spx.daemon.state.jobs_table import JobRow
from spx.daemon.state.store import Store

SUFFIX = ".verify"
MAX_NAME = 63
MAX_REPLAYS = 20  # live replays of one job


def replay_file(store: Store, job: JobRow, uid: int, arg: str | None) -> dict:
    """The answer to `replay-spec` (arg: JSON {"from_step": S or null, "gpus": [..] or null})."""
    if uid != job.owner_uid:
        return _error(f"a replay runs as the job's owner: run spx verify as {job.owner}")
    if job.spec.nodes.count > 1:
        return _error(f"{job.name} spans {job.spec.nodes.count} hosts: spx verify replays one-host jobs")
    if job.spec.checkpoints.dir is None:
        return _error(f"{job.name} was accepted before per-owner checkpoint dirs: give its dir in a job file's `replay`")
    try:
        ask = json.loads(arg or "{}")
        from_step, gpus = ask.get("from_step"), ask.get("gpus")
        if from_step is not None and not (isinstance(from_step, int) and 0 <= from_step <= MAX_WHOLE):
            raise ValueError("from_step")
        if gpus is not None and not (isinstance(gpus, list) and all(isinstance(g, int) for g in gpus)):
            raise ValueError("gpus")
    except (ValueError, AttributeError):
        return _error("the request's from_step or gpus is not what spx verify sends")
    if gpus is not None and len(gpus) != job.spec.gpu_count:
        return _error(f"{job.name} trains on {job.spec.gpu_count} GPUs: its replay needs as many (--gpus gave {len(gpus)})")
    name = free_name(store, job.name)
    if name is None:
        return _error(f"{job.name} has {MAX_REPLAYS} replays queued or running already")
    return {"ok": True, "result": yaml.safe_dump(replay_doc(name, job.spec, from_step, gpus), sort_keys=False)}


def replay_doc(name: str, spec: JobSpec, from_step: int | None, gpus: list[int] | None, priority: int = 0) -> dict:
    """The replay's job file, as data."""
    doc = spec.model_dump(mode="json", by_alias=True, exclude_none=True,
                          exclude={"after", "notify", "restart", "replay", "priority", "verify"})
    doc["name"] = name
    doc["priority"] = priority
    doc["checkpoints"] = {"dir": str(spec.checkpoints.dir)}  # read, never written, by the replay
    doc["gpus"] = gpus if gpus is not None else spec.gpus
    doc["restart"] = {"max_restarts": 0}
    doc["replay"] = {"of": spec.name, **({"from_step": from_step} if from_step is not None else {})}
    return doc


def free_name(store: Store, name: str) -> str | None:
    """NAME.verify, or NAME.verify-2, … — a name no live job has (at most 63 characters); None when
    MAX_REPLAYS of them are live."""
    for n in range(1, MAX_REPLAYS + 1):
        tail = SUFFIX if n == 1 else f"{SUFFIX}-{n}"
        candidate = name[:MAX_NAME - len(tail)] + tail
        live = store.jobs.by_name(candidate)
        if NAME_RE.match(candidate) and (live is None or live.state.terminal):
            return candidate
    return None


def _error(text: str) -> dict:
    return {"ok": False, "error": text, "code": 1}
