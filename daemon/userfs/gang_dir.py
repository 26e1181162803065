"""A job across hosts: its `.spx-gang/` directory in the shared checkpoint dir, where the hosts'
daemons agree on restarts (docs/multinode.md, "Restarts across hosts").

    CHECKPOINT_DIR/.spx-gang/generation    {"gen", "host", "label", "time", "reason", "counted",
                                            "not_before", "final"}: the round every host runs in
    CHECKPOINT_DIR/.spx-gang/lock          flock'd around every read-decide-write of `generation` (the
                                           compare-and-swap of userfs/cas.py, as for `.spx/lease`)
    CHECKPOINT_DIR/.spx-gang/hosts/KEY     {"host", "label", "gen", "state", "time", "step"}: each
                                           host's daemon says where its share is

Every attempt of a host runs in one generation G (launched with `--rdzv-id=ID-gG`, so a new
generation is a new rendezvous round nobody can mistake for a closed one). An attempt that ends by
its own failure `advance`s G → G+1 with the decision its daemon took (why, the restart's earliest
time, or `final`: the job ended for good); only one host can do that (compare-and-swap under the
lock), so a failure is counted once, by the host that saw it first, and every other host, seeing a
newer generation, stops its share and follows that decision. `join` gives the next attempt its
generation, and waits while another host still runs in an older one: its agent would still serve
(or use) the old round's store.

Runs only in `user_actions`, as the job's owner (the dir is in the owner's tree: what may be
written there is the kernel's decision for them); stdlib only. `.spx-gang/` and its `hosts/` must be
the owner's and writable by nobody else (cas.NotPrivate otherwise): in a checkpoint dir others may
write, a `.spx-gang/` another user made — with a forged final generation that would end the job on
every host — is refused with the reason, never read. Every file is replaced whole
(cas.replace_file), so a reader on another host sees the old content or the new one. What is read
back is the user's to write, so it is checked for shape here and again by the daemon.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from spx.daemon.core import bounded
from spx.daemon.userfs import cas, spx_dir

GANG = ".spx-gang"
GENERATION = "generation"
LOCK = "lock"
HOSTS = "hosts"
MAX_HOSTS = 1024
_KEY = re.compile(r"^[0-9a-f]{16}$")
STATES = ("starting", "running", "ended")


def _open(ckpt_dir: str) -> tuple[int, int]:
    """fds of `.spx-gang` and its `hosts` (made 0700 as the owner)."""
    gang = spx_dir.open_subdir(ckpt_dir, GANG, create=True)
    assert gang is not None
    try:
        hosts = spx_dir.open_subdir_at(gang, HOSTS, create=True, shown=f"{ckpt_dir}/{GANG}")
    except BaseException:
        os.close(gang)
        raise
    assert hosts is not None
    return gang, hosts


def _load(raw: bytes | None) -> dict[str, Any] | None:
    try:  # core.bounded: every number in it finite and below 2**53, so no time arithmetic overflows
        doc = bounded.parse_json(raw, "gang file", max_bytes=spx_dir.SMALL_MAX_BYTES) if raw else None
    except bounded.Garbage:
        return None
    return doc if isinstance(doc, dict) else None


def current(gang: int) -> dict[str, Any]:
    """The generation now; a dir without one (or with garbage there) is generation 0."""
    return _shaped(_load(spx_dir.read_small(gang, GENERATION)))


def _shaped(doc: dict[str, Any] | None) -> dict[str, Any]:
    if doc is None or not isinstance(doc.get("gen"), int) or isinstance(doc.get("gen"), bool) or doc["gen"] < 0:
        return {"gen": 0, "final": None, "reason": None}
    return doc


def _locked_current(lk: cas.Locked) -> dict[str, Any]:
    """The generation now, read inside the compare-and-swap."""
    return _shaped(lk.read(GENERATION).doc)


def _say(hosts: int, args: dict[str, Any], gen: int, state: str) -> None:
    """This host's line in `hosts/`."""
    if not _KEY.match(str(args["key"])):
        raise ValueError(f"host key {args['key']!r}")
    doc = {"host": args["host"], "label": args["label"], "gen": gen, "state": state, "time": float(args["now"]),
           "step": args.get("step")}
    cas.replace_file(hosts, str(args["key"]), json.dumps(doc).encode())


def _hosts(hosts: int) -> list[dict[str, Any]]:
    out = []
    for name in sorted(os.listdir(hosts))[:MAX_HOSTS]:
        if _KEY.match(name):
            try:
                doc = _load(spx_dir.read_small(hosts, name))
            except OSError:  # a FIFO, a directory: not a host's line
                continue
            if doc is not None:
                out.append(doc)
    return out


def advance(args: dict[str, Any]) -> dict[str, Any]:
    """At the end of an attempt in generation `from_gen` (args: dir, key, host, label, now,
    from_gen, step, bump: the decision's fields, or None when the end needs no new round — a
    success, or a stop that followed another host's bump). Says this host's share ended; with
    `bump`, moves the generation on if it is still `from_gen`. {"won": bool, "current": doc}."""
    gang, hosts = _open(args["dir"])
    try:
        won = False
        with cas.Locked(gang, LOCK) as lk:
            now = _locked_current(lk)
            if args.get("bump") is not None and now["gen"] == args["from_gen"] and not now.get("final"):
                now = lk.write(GENERATION, {**args["bump"], "host": args["host"], "label": args["label"],
                                            "time": float(args["now"])}, bump=True, floor=now["gen"])
                won = True
        _say(hosts, args, int(args["from_gen"]), "ended")
        return {"won": won, "current": now}
    finally:
        os.close(hosts)
        os.close(gang)


def join(args: dict[str, Any]) -> dict[str, Any]:
    """The generation this host's next attempt runs in (args: dir, key, host, label, now, last: the
    generation of its previous attempt or None, stale_seconds). The current one if it is newer than
    `last`; else (nobody moved on since this host last ran: its daemon was down, or could not
    advance) a new one. For a host's first attempt (`last` None) the current one unless it belongs
    to an earlier job in this dir — final, or every host's line in it ended or stale and nobody
    began it lately — whose round names must not be reused (an etcd keeps closed rounds): then a
    new one. A final generation of this job is the answer as it is (the job ended elsewhere).
    {"gen", "current"} — or {"wait": label, "since": time} while another host's line says it still
    runs in an older generation and was written in the last `stale_seconds`."""
    gang, hosts = _open(args["dir"])
    try:
        last, now_wall, stale = args.get("last"), float(args["now"]), float(args["stale_seconds"])
        fields = {"host": args["host"], "label": args["label"], "time": now_wall, "counted": False,
                  "not_before": None, "final": None}
        with cas.Locked(gang, LOCK) as lk:
            now = _locked_current(lk)
            lines = _hosts(hosts)
            if last is None and (now.get("final") or _left_behind(now, lines, now_wall, stale)):
                now = lk.write(GENERATION, {**fields, "reason": "a new job in a checkpoint dir whose last job ended"},
                               bump=True, floor=now["gen"])
            elif not now.get("final") and last is not None and now["gen"] <= last:
                now = lk.write(GENERATION, {**fields, "reason": "a host rejoined"}, bump=True,
                               floor=max(now["gen"], int(last)))
        if now.get("final"):
            return {"gen": now["gen"], "current": now}
        for line in lines:
            if (line.get("host") != args["host"] and isinstance(line.get("gen"), int) and line["gen"] < now["gen"]
                    and _active(line, now_wall, stale)):
                return {"wait": str(line.get("label"))[:200], "since": line["time"], "gen": now["gen"]}
        _say(hosts, args, now["gen"], "starting")
        return {"gen": now["gen"], "current": now}
    finally:
        os.close(hosts)
        os.close(gang)


def _active(line: dict[str, Any], now: float, stale: float) -> bool:
    """A host's line that says its share starts or runs, written in the last `stale` seconds."""
    return (line.get("state") in ("starting", "running") and isinstance(line.get("time"), (int, float))
            and now - line["time"] < stale)


def _left_behind(gen: dict[str, Any], lines: list[dict[str, Any]], now: float, stale: float) -> bool:
    """Is generation `gen` an earlier job's? Hosts ran in it, none is active there now, and nobody
    began it in the last `stale` seconds (a host of this job that just did is joined)."""
    in_it = [line for line in lines if line.get("gen") == gen["gen"]]
    began = gen.get("time")
    recent = isinstance(began, (int, float)) and now - began < stale
    return bool(in_it) and not recent and not any(_active(line, now, stale) for line in in_it)


def beat(args: dict[str, Any]) -> dict[str, Any]:
    """While an attempt runs (args: dir, key, host, label, now, gen, step): this host's line says so,
    and the answer is the generation now and every host's line (for `spx status`)."""
    gang, hosts = _open(args["dir"])
    try:
        _say(hosts, args, int(args["gen"]), "running")
        return {"current": current(gang), "hosts": _hosts(hosts)}
    finally:
        os.close(hosts)
        os.close(gang)
