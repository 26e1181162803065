"""A job across hosts, the daemon's side of its `.spx-gang/` (userfs/gang_dir.py has the protocol):
which generation an attempt joins, telling the other hosts an attempt ended, and the beat that
says this host's share runs and brings back where the others are.

Each call runs as the job's owner in the shared checkpoint dir, off the main loop, in the owner's
lane (run/gang_link.py, run/attempt_prep.py), through a kept as-user session (as_user_session): the
beat once a second, and a relaunch's join and end, which lie on the path from a failure to every
host's next first step, without a process start (~50 ms) each. What comes back was read from files the user can
write: every field is checked here, a delay is clamped by the caller (step: at most the job's
backoff cap), and a doc that is not one reads as "nothing new" — a user can only disturb their own
job with it.
"""

from __future__ import annotations

import hashlib
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from spx.daemon.core.config import DaemonConfig
from spx.daemon.intake import job_record
from spx.daemon.lifecycle.record import GangTurn
from spx.daemon.state.jobs_table import JobRow
from spx.daemon.state.states import JobState
from spx.daemon.userfs import as_user

# A host's line older than this is a daemon that is gone (it rewrites it every
# lifecycle.across_hosts.BEAT_SECONDS while its share runs): a joining host no longer waits for it.
HOST_STALE_SECONDS = 15.0
JOIN_POLL_SECONDS = 0.1  # a joining host waits for the others' ends: each look is a line to the session
CALL_TIMEOUT_SECONDS = 20.0
_FINALS = {"failed": JobState.FAILED, "cancelled": JobState.CANCELLED}


@dataclass(frozen=True)
class Me:
    """This daemon as the other hosts see it: `key` names its line in `hosts/` (a digest of the
    lease's host id: machine id and state dir), `label` is what people read."""

    host: str
    key: str
    label: str

    def args(self, now: float) -> dict[str, Any]:
        return {"host": self.host, "key": self.key, "label": self.label, "now": now}


def me(cfg: DaemonConfig) -> Me:
    host = job_record.host_id(cfg.state_dir)
    name = socket.gethostname()
    # Two daemons on one machine (--root, the tests' two "hosts") are told apart by their state dir.
    label = name if cfg.state_dir == DaemonConfig.model_fields["state_dir"].default else f"{name}:{cfg.state_dir}"
    return Me(host, hashlib.sha256(host.encode()).hexdigest()[:16], label)


@dataclass(frozen=True)
class Joined:
    """Where attempt N goes: generation `gen`, or `final` (the job ended on another host)."""

    gen: int | None
    final: GangTurn | None = None
    waited: float = 0.0
    waited_for: str | None = None
    at: float | None = None  # wall time it was known (the timeline's `joined`)


def join(cfg: DaemonConfig, job: JobRow, ckpt_dir: str, last: int | None, wait_seconds: float,
         clock: Callable[[], float] = time.monotonic) -> Joined:
    """The generation the next attempt joins (gang_dir.join), waiting up to `wait_seconds` while
    another host still runs in an older one (its round's store is still up). Past that the attempt
    joins anyway: that host is stuck or its daemon gone, and its share will fail on its own."""
    user, mine = as_user.owner(job.owner_uid), me(cfg)
    started = clock()
    waited_for = None
    while True:
        answer = as_user.run(user, "gang_join", {**mine.args(time.time()), "dir": ckpt_dir, "last": last,
                                                 "stale_seconds": HOST_STALE_SECONDS}, CALL_TIMEOUT_SECONDS,
                             session=True)
        gen = _gen(answer.get("gen"))
        if "wait" in answer and clock() - started < wait_seconds:
            waited_for = str(answer["wait"])[:200]
            time.sleep(JOIN_POLL_SECONDS)
            continue
        if "wait" in answer:  # waited long enough: join the newest generation as it is
            answer = as_user.run(user, "gang_join", {**mine.args(time.time()), "dir": ckpt_dir, "last": last,
                                                     "stale_seconds": 0.0}, CALL_TIMEOUT_SECONDS, session=True)
            gen = _gen(answer.get("gen"))
        turn = turn_of(answer.get("current"), time.time())
        if gen is None:
            raise ValueError(f"{ckpt_dir}/.spx-gang gave no generation")
        return Joined(gen, turn if turn is not None and turn.final is not None else None, round(clock() - started, 3),
                      waited_for, time.time())


def advance(cfg: DaemonConfig, job: JobRow, ckpt_dir: str, generation: int, bump: GangTurn | None,
            step: int | None) -> tuple[bool, GangTurn | None]:
    """This host's share of `generation` ended; with `bump`, begin the next generation unless another
    host did first. (won, the generation now)."""
    now = time.time()
    fields = None if bump is None else {
        "reason": bump.reason[:2000], "counted": bump.counted, "not_before": now + max(0.0, bump.delay),
        "final": bump.final.value if bump.final is not None else None}
    answer = as_user.run(as_user.owner(job.owner_uid), "gang_advance",
                         {**me(cfg).args(now), "dir": ckpt_dir, "from_gen": generation, "bump": fields, "step": step},
                         CALL_TIMEOUT_SECONDS, session=True)
    return bool(answer.get("won")), turn_of(answer.get("current"), time.time())


def beat(cfg: DaemonConfig, job: JobRow, ckpt_dir: str, generation: int, step: int | None
         ) -> tuple[GangTurn | None, list[dict[str, Any]]]:
    """While this host's share runs in `generation`: say so; the generation now and every host's line."""
    answer = as_user.run(as_user.owner(job.owner_uid), "gang_beat",
                         {**me(cfg).args(time.time()), "dir": ckpt_dir, "gen": generation, "step": step},
                         CALL_TIMEOUT_SECONDS, session=True)  # once a second: a kept child, not a process each
    hosts = [h for h in answer.get("hosts") or [] if isinstance(h, dict)]
    return turn_of(answer.get("current"), time.time()), [host_line(h) for h in hosts[:64]]


def host_line(doc: dict[str, Any]) -> dict[str, Any]:
    """One host's line, reduced to checked fields (it is shown by `spx status`)."""
    def num(v: object) -> float | None:
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
    step = doc.get("step")
    return {"host": str(doc.get("label"))[:200], "generation": _gen(doc.get("gen")),
            "state": doc.get("state") if doc.get("state") in ("starting", "running", "ended") else None,
            "time": num(doc.get("time")), "step": step if isinstance(step, int) and not isinstance(step, bool) else None}


def missing(lines: list[dict[str, Any]], label: str, nnodes: int, timeout: float, now: float,
            since: float) -> str | None:
    """Why the job cannot go on, if a host is missing: fewer than `nnodes` hosts (this one included)
    have said anything in the last `timeout` seconds, while this attempt (begun at `since`) waited at
    least that long. Names the host longest silent, or counts those that never came."""
    if now - since < timeout:
        return None
    others = [h for h in lines if h.get("host") != label]
    heard = [h for h in others if h.get("time") is not None and now - h["time"] < timeout]
    if len(heard) + 1 >= nnodes:
        return None
    silent = sorted((h for h in others if h not in heard), key=lambda h: h.get("time") or 0.0)
    why = (f"host {silent[0]['host']} gone: no word from its daemon for {now - (silent[0].get('time') or since):.0f} s"
           if silent else f"only {len(heard) + 1} of {nnodes} hosts came in {now - since:.0f} s")
    return f"{why} (nodes.host_timeout_seconds: {timeout:.0f})"


def turn_of(doc: object, now: float) -> GangTurn | None:
    """The generation doc as a GangTurn (delay counted from `now`), None if it is not one."""
    if not isinstance(doc, dict):
        return None
    gen = _gen(doc.get("gen"))
    if gen is None:
        return None
    not_before = doc.get("not_before")
    delay = float(not_before) - now if isinstance(not_before, (int, float)) and not isinstance(not_before, bool) else 0.0
    return GangTurn(gen=gen, by=str(doc.get("label") or "")[:200], reason=str(doc.get("reason") or "")[:2000],
                    counted=doc.get("counted") is True, delay=max(0.0, delay), final=_FINALS.get(str(doc.get("final"))))


def _gen(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**53 else None
