"""The first error of a failed attempt, found in its log, for `spx status`, the journal and the
failure class (`policy.failure_class`).

torchrun prints a failure summary: a "Failures:" block with the ranks it stopped as a consequence
(SIGTERM from its own teardown), then "Root Cause (first observed failure):" with the rank that
failed first and its exit code. A Python worker prints a traceback whose last line is the exception.
The cause is the root rank and its first exception; every other rank's error is a *consequence*
(collectives time out, connections close when a peer dies), and is named as one. torchrun's root
rank is the first whose exit it *observed*: when that rank's error is a communication error and
another rank raised something else, that other rank is the cause (the peer it lost).

The result is one line (`spx status` shows it), e.g.
    rank 1 (pid 123) exited with code 1: ValueError: bad batch (user-code); rank 0: RuntimeError:
    Connection closed by peer [127.0.0.1]:20658 (consequence)
The root error carries its class in parentheses (one of core.causes.ERROR_CLASSES); `cause_class`
there reads it back. Only what the log shows is classified: GPU faults (XID, ECC, fallen off the bus) when a line
says so, OOM from torch's or CUDA's message, CUDA errors, NCCL/gloo/connection errors, and any
other exception as user code.

With `--tee`, torchrun prefixes each worker line with `[ROLE+LOCAL_RANK]:`, and torch >= 2.4 adds
its own `[rankN]:` inside, so a line reads `[default0]:[rank0]: example_args.InjectedCrash: …`;
every such prefix is stripped before a line is read, and the rank is taken from it. An exception
is the first line of a traceback that is not a frame (any class name, e.g. `InjectedCrash`), or,
without a traceback, a line naming an `…Error`/`…Exception`.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from pathlib import Path

from spx.daemon.core.causes import ReasonClass, class_tag
from spx.daemon.userfs import fsafe

TAIL_BYTES = 512 * 1024
MAX_ERROR_CHARS = 200  # of the root error; a consequence gets less
MAX_CONSEQUENCE_CHARS = 120
MAX_CONSEQUENCES = 3  # ranks named; the rest are counted
_RANK_PREFIX = re.compile(r"^(?:\[[A-Za-z_]*\d+\]:\s?)+")
_PREFIX_RANK = re.compile(r"\[([A-Za-z_]*?)(\d+)\]:")
_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)|torch\.OutOfMemoryError)\b.*")
_RAISED = re.compile(r"^[A-Za-z_][\w.]*(:|$)")  # a traceback's last line: the exception's (qualified) class
_TRACEBACK = "Traceback (most recent call last):"
_SUMMARY_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
_SUMMARY_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)\s*\(pid:\s*(\d+)\)")
_SUMMARY_ROOT = re.compile(r"^\s*Root Cause\b")
_SOURCE_LOCATION = re.compile(r"\[[^\]\s]*\.(?:cc|cpp|cu|h|hpp|c):\d+\]\s*")  # gloo/NCCL's "[/…/pair.cc:553] "

# Read on every log line, not just exceptions: only unambiguous wording ("ECC errors: 0" is not a fault).
_GPU_FAULT = re.compile(
    r"\bXid\b\D{0,40}\d|uncorrectable ECC|fallen off the bus|GPU is lost|GPU lost|row remap(?:ping)? fail",
    re.IGNORECASE)
_OOM = re.compile(r"OutOfMemoryError|out of memory|\bMemoryError\b|CUBLAS_STATUS_ALLOC_FAILED", re.IGNORECASE)
_CUDA = re.compile(r"CUDA error|CUDA kernel errors|cuDNN error|CUDNN_STATUS_|CUBLAS_STATUS_|device-side assert|"
                   r"AcceleratorError|illegal memory access", re.IGNORECASE)
_COMMUNICATION = re.compile(
    r"NCCL|gloo|DistBackendError|DistNetworkError|DistStoreError|Connection (?:closed|reset|refused)|"
    r"Broken pipe|ECONNRESET|Socket Timeout|Timed out waiting \d+ ?ms for (?:recv|send)|collective operation|"
    r"ProcessGroup|c10d|Watchdog caught", re.IGNORECASE)  # a user's own TimeoutError stays user-code


def error_class(text: str) -> ReasonClass:
    """The class of one error line (an exception, or a GPU fault message)."""
    for cls, pattern in ((ReasonClass.GPU_FAULT, _GPU_FAULT), (ReasonClass.OOM, _OOM), (ReasonClass.CUDA, _CUDA),
                         (ReasonClass.COMMUNICATION, _COMMUNICATION)):
        if pattern.search(text):
            return cls
    return ReasonClass.USER_CODE


def _signal_text(code: int) -> str:
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


def _rank_of(prefix: str) -> int | None:
    """The rank a `[default1]:[rank1]:` prefix names: torch's `[rankN]` (global) if present, else the
    agent's local `[ROLEN]` (the same on one node)."""
    found = _PREFIX_RANK.findall(prefix)
    for role, number in found:
        if role == "rank":
            return int(number)
    return int(found[-1][1]) if found else None


def _clean(text: str, limit: int) -> str:
    """`text` without source locations, cut to `limit` characters at a word's end ("… Check t…" read
    as a word of its own); a single word longer than most of the limit is cut where it must be."""
    text = _SOURCE_LOCATION.sub("", text).strip()
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > limit // 2 else cut).rstrip(" ,;:") + "…"


@dataclass
class _Scan:
    """What one pass over the log found."""

    errors: dict[int | None, str]  # rank (None: unprefixed) -> its first exception, in order of appearance
    entries: dict[int, tuple[int, int]]  # rank -> (exit code, pid) from torchrun's summary
    root: int | None  # the rank under "Root Cause"
    first: int | None  # the first rank in the summary
    gpu_fault: str | None  # the first line that shows a GPU fault


def _scan(lines: list[str]) -> _Scan:
    scan = _Scan({}, {}, None, None, None)
    in_root = False
    rank = None
    in_traceback: set[str] = set()  # the prefixes (one per rank) whose traceback is being read
    for raw in lines:
        prefix_match = _RANK_PREFIX.match(raw)
        prefix = prefix_match.group(0).strip() if prefix_match else ""
        line = raw[prefix_match.end():].rstrip() if prefix_match else raw.rstrip()
        owner = _rank_of(prefix) if prefix else None
        exception = None
        if line.startswith(_TRACEBACK):
            in_traceback.add(prefix)
        elif prefix in in_traceback and line and not line[0].isspace():
            in_traceback.discard(prefix)
            if _RAISED.match(line) and "ChildFailedError" not in line:
                exception = line
        elif _EXCEPTION.match(line) and "ChildFailedError" not in line:
            exception = line
        if exception is not None and owner not in scan.errors:
            scan.errors[owner] = exception
        if scan.gpu_fault is None and _GPU_FAULT.search(line) and not line.startswith((" ", "\t")):
            scan.gpu_fault = line
        if _SUMMARY_ROOT.match(line):
            in_root, rank = True, None
        m = _SUMMARY_RANK.match(line)
        if m:
            rank = int(m.group(1))
        m = _SUMMARY_EXIT.match(line)
        if m and rank is not None:
            scan.entries.setdefault(rank, (int(m.group(1)), int(m.group(2))))
            scan.first = rank if scan.first is None else scan.first
            if in_root and scan.root is None:
                scan.root = rank
    return scan


def _choose_root(scan: _Scan) -> int | None:
    """The rank that failed first: torchrun's root-cause rank, unless its error is a communication
    error and another rank raised something else (the failure it lost the connection to)."""
    named = scan.root if scan.root is not None else scan.first
    primary = [r for r, e in scan.errors.items() if error_class(e) != ReasonClass.COMMUNICATION]
    if named is not None and (named not in scan.errors or error_class(scan.errors[named]) != ReasonClass.COMMUNICATION):
        return named
    if primary:
        return primary[0]
    return named if named is not None else next(iter(scan.errors), None)


def find_root_cause(log_file: Path) -> str | None:
    """The root cause in the last TAIL_BYTES of `log_file` (`log/NAME/attempt-N.log`), read through
    `fsafe` from the root-owned log dir: no link followed, no FIFO waited on. None if unreadable."""
    try:
        tail = fsafe.read_tail(log_file, log_file.parent.parent, TAIL_BYTES)
    except OSError:
        return None
    return root_cause_of(tail)


def root_cause_of(tail: bytes, died: tuple[int, int, int] | None = None) -> str | None:
    """The root cause in a log's last bytes (read safely by the caller), as one line, or None.
    `died`: (rank, exit code — negative: the signal —, pid) of the worker whose death the daemon saw
    and killed the attempt for: torchrun, killed with it, printed no summary to say so."""
    scan = _scan(tail.decode("utf-8", "replace").splitlines())
    if died is not None and died[0] not in scan.entries:
        scan.entries[died[0]] = (died[1], died[2])
        if scan.root is None and scan.first is None:
            scan.first = died[0]
    root = _choose_root(scan)
    if root is None and not scan.errors and scan.gpu_fault is None:
        return None
    error = scan.errors.get(root)
    cls = error_class(error) if error else None
    if scan.gpu_fault is not None and cls != ReasonClass.GPU_FAULT:
        # A GPU fault in the log explains whatever CUDA or communication error followed it.
        error, cls = scan.gpu_fault, ReasonClass.GPU_FAULT
    code, pid = scan.entries.get(root, (None, None)) if root is not None else (None, None)
    who = f"rank {root}" if root is not None else ""
    if pid is not None:
        who += f" (pid {pid})"
    if code is not None and (code >= 0 or error is None):
        who += f" {_signal_text(code) if code < 0 else f'exited with code {code}'}"
    if error is None:
        # The root rank left no error: killed by a signal (its summary says which), or only the summary.
        cls = ReasonClass.SIGNAL if code is not None and code < 0 else None
        head = who
    else:
        head = f"{who}: {_clean(error, MAX_ERROR_CHARS)}" if who else _clean(error, MAX_ERROR_CHARS)
    parts = [f"{head}{class_tag(cls)}" if cls else head]
    others = [(r, e) for r, e in scan.errors.items() if r != root]
    for r, e in others[:MAX_CONSEQUENCES]:
        parts.append(f"{'rank ' + str(r) if r is not None else 'launcher'}: {_clean(e, MAX_CONSEQUENCE_CHARS)} (consequence)")
    if len(others) > MAX_CONSEQUENCES:
        parts.append(f"{len(others) - MAX_CONSEQUENCES} more ranks failed as a consequence")
    return "; ".join(parts)
