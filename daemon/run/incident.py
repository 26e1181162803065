"""An incident, assembled: the one document an operator reads (or hands a hardware vendor) about a
failed attempt. Pure: what it is made of is gathered by run/incidents.py — on the loop what is in
memory (the GPUs' recent readings and XIDs), off the loop what must be read (the kernel log, the
attempt log's stacks).

    {"failed_at": when the failure was seen (the daemon's stop began, or the launcher exited),
     "ended_at", "reason", "root_cause" (run/rootcause.py's line), "first_rank" (its rank, if named),
     "exit_code", "signal", "stop_cause",
     "gpus": [{"index", "uuid", "pci_bus_id",
               "xids": [{"time", "xid", "what"}],         # the daemon's XID events
               "kernel": ["NVRM: Xid (PCI:…): 79, …"],     # the kernel's lines about it
               "readings": [{"time", "utilization", …}]}], # the minute before failed_at
     "readings_seconds": 60, "kernel_log": {"unavailable", "truncated"}, "stacks": text or None}

(class, recovery and restart seconds are added when it is read: state/incident_views.py.)

Bounded: readings per GPU (`MAX_READINGS`), stacks (`MAX_STACK_CHARS`, the end kept: the last
dumped pid's stack is the one nearest the kill), kernel lines (gpu/kernel_log.py); `fit` drops
the oldest readings until the document is under the store's cap.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from spx.daemon.gpu.health import xid_reason
from spx.daemon.gpu.kernel_log import KernelLines, kernel_address

READINGS_SECONDS = 60.0
MAX_READINGS = 120       # per GPU in the document: a scrape every 0.5 s for the minute
MAX_STACK_CHARS = 48 * 1024
_FIRST_RANK = re.compile(r"^rank (\d+)\b")
_NOTE = "spx: "
_STACKS_BEGIN = re.compile(r"hang detected; (stack of pid \d+:|py-spy is not installed)|stack dump budget spent")
_STACKS_END = re.compile(r"; SIG(?:TERM|KILL)\b")


@dataclass(frozen=True)
class GpuIdentity:
    index: int
    uuid: str
    pci_bus_id: str


@dataclass(frozen=True)
class Failure:
    """What the loop knows of the failed attempt when its end is recorded."""

    attempt: int
    failed_at: float
    ended_at: float
    reason: str | None
    root_cause: str | None
    exit_code: int | None
    signal: int | None
    stop_cause: str | None
    gpus: tuple[GpuIdentity, ...]


def first_rank(root_cause: str | None) -> int | None:
    """The rank root cause names first ("rank 1 (pid 123) exited …"), or None."""
    m = _FIRST_RANK.match(root_cause or "")
    return int(m.group(1)) if m else None


def stacks_in_log(tail: bytes) -> str | None:
    """The stack dumps the daemon noted in the attempt log before a hang's kill (run/postmortem.py:
    `spx: hang detected; stack of pid N:` and the dump, a line each behind `spx: `), worker lines
    in between left out; None if there are none. The end is kept when over MAX_STACK_CHARS."""
    kept: list[str] = []
    inside = False
    for raw in tail.decode("utf-8", "replace").splitlines():
        if not raw.startswith(_NOTE):
            continue
        line = raw[len(_NOTE):]
        if _STACKS_BEGIN.search(line):
            inside = True
        elif _STACKS_END.search(line):
            inside = False
        if inside:
            kept.append(line)
    if not kept:
        return None
    text = "\n".join(kept)
    return text if len(text) <= MAX_STACK_CHARS else "…" + text[-(MAX_STACK_CHARS - 1):]


def assemble(f: Failure, readings: dict[int, list[dict[str, float]]], xids: dict[int, list[tuple[float, int]]],
             kernel: KernelLines, stacks: str | None) -> dict:
    """The incident document of `f` (see the module doc)."""
    gpus = []
    for g in f.gpus:
        address = kernel_address(g.pci_bus_id)
        gpus.append({
            "index": g.index, "uuid": g.uuid, "pci_bus_id": g.pci_bus_id,
            "xids": [{"time": t, "xid": x, "what": xid_reason(g.index, x)} for t, x in xids.get(g.index, [])],
            "kernel": list(kernel.lines.get(address, [])) if address else [],
            "readings": readings.get(g.index, [])[-MAX_READINGS:],
        })
    return {
        "failed_at": f.failed_at, "ended_at": f.ended_at, "reason": f.reason, "root_cause": f.root_cause,
        "first_rank": first_rank(f.root_cause), "exit_code": f.exit_code, "signal": f.signal,
        "stop_cause": f.stop_cause, "gpus": gpus, "readings_seconds": READINGS_SECONDS,
        "kernel_log": {"unavailable": kernel.unavailable, "truncated": kernel.truncated}, "stacks": stacks,
    }


NOTIFY_BYTES = 64 * 1024  # an incident in a notification's body: the oldest readings give way first


def for_notification(job: str, attempt: int, reason_class: str | None, doc: dict) -> dict:
    """The incident a notification carries (run/notify.py): the stored document with its job,
    attempt and class, fitted under NOTIFY_BYTES (its recovery is not known yet: `spx incidents`)."""
    return fit({**json.loads(json.dumps(doc)), "job": job, "attempt": attempt, "class": reason_class}, NOTIFY_BYTES)


def fit(doc: dict, max_bytes: int) -> dict:
    """`doc` under `max_bytes` of JSON: the oldest readings go first (the seconds just before the
    failure matter most), then the stacks' beginning."""
    def size() -> int:
        return len(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())

    while size() > max_bytes and any(g.get("readings") for g in doc.get("gpus", [])):
        longest = max(doc["gpus"], key=lambda g: len(g["readings"]))
        del longest["readings"][: max(1, len(longest["readings"]) // 4)]
    while size() > max_bytes and doc.get("stacks"):
        doc["stacks"] = "…" + doc["stacks"][len(doc["stacks"]) // 2:]
        if len(doc["stacks"]) < 64:
            doc["stacks"] = None
    return doc
