"""The first error of a failed attempt, found in its log, for `spx status` and the journal.

torchrun prints a failure summary: a "Failures:" block with the ranks it stopped as a consequence
(SIGTERM from its own teardown), then "Root Cause (first observed failure):" with the rank that
failed first and its exit code. A Python worker prints a traceback whose last line is the exception.
The root-cause rank and the earliest exception are the cause; later ranks fail as a consequence
(collectives time out, pipes break).

With `--tee`, torchrun prefixes each worker line with `[ROLE+LOCAL_RANK]:`, and torch >= 2.4 adds
its own `[rankN]:` inside, so a line reads `[default0]:[rank0]: example_args.InjectedCrash: …`;
every such prefix is stripped before a line is read. An exception is the first line of a
traceback that is not a frame (any class name, e.g. `InjectedCrash`), or, without a traceback, a
line naming an `…Error`/`…Exception`.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

from spx.daemon.userfs import fsafe

TAIL_BYTES = 512 * 1024
_RANK_PREFIX = re.compile(r"^(?:\[[A-Za-z_]*\d+\]:\s?)+")
_LAST_PREFIX = re.compile(r"\[[A-Za-z_]*\d+\]:$")
_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)|torch\.OutOfMemoryError)\b.*")
_RAISED = re.compile(r"^[A-Za-z_][\w.]*(:|$)")  # a traceback's last line: the exception's (qualified) class
_TRACEBACK = "Traceback (most recent call last):"
_SUMMARY_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
_SUMMARY_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)\s*\(pid:\s*(\d+)\)")
_SUMMARY_ROOT = re.compile(r"^\s*Root Cause\b")


def _signal_text(code: int) -> str:
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


def _shown(prefix: str, line: str) -> str:
    """The line as `spx status` shows it: with the rank that raised it (`[rank0]: …`) if prefixed."""
    if not prefix:
        return line
    last = _LAST_PREFIX.search(prefix)
    return f"{last.group(0) if last else prefix} {line}"


def find_root_cause(log_file: Path) -> str | None:
    """The root cause in the last TAIL_BYTES of `log_file` (`log/NAME/attempt-N.log`), read through
    `fsafe` from the root-owned log dir: no link followed, no FIFO waited on. None if unreadable."""
    try:
        tail = fsafe.read_tail(log_file, log_file.parent.parent, TAIL_BYTES)
    except OSError:
        return None
    return root_cause_of(tail)


def root_cause_of(tail: bytes) -> str | None:
    """The root cause in a log's last bytes (read safely by the caller), or None."""
    lines = tail.decode("utf-8", "replace").splitlines()
    exception = None
    rank = None
    first = root = None  # (rank, exit code, pid): the first summary entry, and the root-cause one
    in_root = False
    in_traceback: set[str] = set()  # the prefixes (one per rank) whose traceback is being read
    for raw in lines:
        prefix_match = _RANK_PREFIX.match(raw)
        prefix = prefix_match.group(0).strip() if prefix_match else ""
        line = raw[prefix_match.end():].rstrip() if prefix_match else raw.rstrip()
        if line.startswith(_TRACEBACK):
            in_traceback.add(prefix)
        elif prefix in in_traceback and line and not line[0].isspace():
            in_traceback.discard(prefix)
            if exception is None and _RAISED.match(line) and "ChildFailedError" not in line:
                exception = _shown(prefix, line)
        elif exception is None and _EXCEPTION.match(line) and "ChildFailedError" not in line:
            exception = _shown(prefix, line)
        if _SUMMARY_ROOT.match(line):
            in_root, rank = True, None
        m = _SUMMARY_RANK.match(line)
        if m:
            rank = int(m.group(1))
        m = _SUMMARY_EXIT.match(line)
        if m and rank is not None:
            entry = (rank, int(m.group(1)), int(m.group(2)))
            first = first or entry
            if in_root and root is None:
                root = entry
    chosen = root or first
    if chosen is None:
        return exception
    rank, code, pid = chosen
    summary = f"rank {rank} (pid {pid}) {_signal_text(code) if code < 0 else f'exited with code {code}'}"
    return f"{summary}: {exception}" if exception and code >= 0 else summary
