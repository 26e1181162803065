"""The first error of a failed attempt, found in its log, for `spx status` and the journal.

torchrun prints a failure summary naming the first failed rank and its exit code; a Python worker
prints a traceback whose last line is the exception. The earliest of those is usually the cause;
later ranks fail as a consequence (collectives time out, pipes break).
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

TAIL_BYTES = 512 * 1024
_RANK_PREFIX = re.compile(r"^\[[A-Za-z_]*\d+\]:\s?")
_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)|torch\.OutOfMemoryError)\b.*")
_SUMMARY_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
_SUMMARY_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)\s*\(pid:\s*(\d+)\)")


def _signal_text(code: int) -> str:
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


def find_root_cause(log_file: Path) -> str | None:
    try:
        with log_file.open("rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - TAIL_BYTES))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    exception = None
    rank = None
    for raw in lines:
        line = _RANK_PREFIX.sub("", raw).rstrip()
        if exception is None and _EXCEPTION.match(line) and "ChildFailedError" not in line:
            prefix = _RANK_PREFIX.match(raw)
            exception = f"{prefix.group(0).strip()} {line}" if prefix else line
        m = _SUMMARY_RANK.match(line)
        if m:
            rank = int(m.group(1))
        m = _SUMMARY_EXIT.match(line)
        if m and rank is not None:
            code, pid = int(m.group(1)), int(m.group(2))
            what = _signal_text(code) if code < 0 else f"exited with code {code}"
            summary = f"rank {rank} (pid {pid}) {what}"
            return f"{summary}: {exception}" if exception and code >= 0 else summary
    return exception
