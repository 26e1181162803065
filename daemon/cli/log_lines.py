"""The lines of an attempt log as `spx logs` filters them: whose rank a line is (`--rank`), when it was
written if it says so (`--since`), the last N lines read from the end (`--tail`), and the separator
between attempts. Pure: bytes and open files in, bytes out; the command (logs.py) does the I/O.

What a line looks like: the job's output as the launcher relayed it (run/log_relay.py). torchrun,
started with `--tee=3`, puts `[ROLE LOCAL_RANK]:` before each worker line (`[default0]:`; a
TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE of the job's may make it `[0]:` or `[rank0]:`); PyTorch's own
messages carry `[rank0]:` (the global rank). DeepSpeed's launcher passes its workers' output through
as it is, so only PyTorch's `[rankN]:` lines have one there. Lines the daemon writes start `spx: `.
"""

from __future__ import annotations

import collections
import re
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import BinaryIO

BLOCK = 64 * 1024
DAEMON_NOTE = b"spx: "
RANK_PREFIX = re.compile(rb"\[[A-Za-z_-]*(\d+)\]:")
# A timestamp at the start of a line, after any rank prefixes and an optional "[": ISO 8601 or what
# Python's logging and DeepSpeed print ("2026-12-04 21:34:35,502"). Without a zone it is local time.
LINE_TIME = re.compile(
    rb"(?:\[[A-Za-z_-]*\d+\]:)*\[?(\d{4}-\d\d-\d\d)[T ](\d\d:\d\d:\d\d)(?:[.,](\d{1,9}))?(Z|[+-]\d\d:?\d\d)?")
DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|d)")
SECONDS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}
Keep = Callable[[bytes], bool]


def rank_of(line: bytes) -> int | None:
    """The rank a line's prefix names (the first prefix: torchrun's, before PyTorch's own)."""
    m = RANK_PREFIX.match(line)
    return int(m.group(1)) if m else None


def for_rank(line: bytes, rank: int) -> bool:
    """`--rank R` keeps that rank's lines and the daemon's notes (about every rank); the launcher's
    own unprefixed lines are left out."""
    return line.startswith(DAEMON_NOTE) or rank_of(line) == rank


def line_time(line: bytes) -> float | None:
    """Unix seconds of the timestamp a line starts with, or None when it has none."""
    m = LINE_TIME.match(line)
    if not m:
        return None
    day, clock, fraction, zone = (g.decode() if g else "" for g in m.groups())
    text = f"{day}T{clock}{'.' + fraction[:6] if fraction else ''}{'+00:00' if zone == 'Z' else zone}"
    try:
        return datetime.fromisoformat(text).timestamp()  # naive: local time, as the job's loggers wrote it
    except ValueError:
        return None


def parse_since(text: str, now: float) -> float:
    """`--since`: a duration back from now (`90s`, `10m`, `2h`, `1d`), a date-time (ISO 8601,
    `2026-12-04 21:00`, local time unless it names a zone), or a clock time today (`21:00`)."""
    spec = text.strip()
    m = DURATION.fullmatch(spec)
    if m:
        return now - float(m.group(1)) * SECONDS[m.group(2)]
    if re.fullmatch(r"\d\d?:\d\d(:\d\d)?", spec):
        today = datetime.fromtimestamp(now).date().isoformat()
        spec = f"{today}T{spec if spec.count(':') == 2 else spec + ':00'}"
    try:
        return datetime.fromisoformat(spec.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise ValueError(f"--since {text!r}: give a duration (90s, 10m, 2h, 1d), a date-time "
                         f"(2026-12-04 21:00, ISO 8601) or a time today (21:00)") from None


class SinceFilter:
    """`--since T` inside one log file that may span T: a line is dated by its own timestamp, or by
    the last timestamp above it in the file; a line with none at or above it cannot be dated and is
    kept (so nothing written after T is ever hidden)."""

    def __init__(self, since: float):
        self.since = since
        self.dated: float | None = None

    def keep(self, line: bytes) -> bool:
        t = line_time(line)
        if t is not None:
            self.dated = t
        return self.dated is None or self.dated >= self.since


def reversed_lines(f: BinaryIO, end: int, block: int = BLOCK) -> Iterator[bytes]:
    """The lines of `f` before offset `end`, last first, each with its newline (a last line without
    one as it is), read from the end in blocks: the tail of a large log costs what it shows. Splits
    on b"\\n" only, as a forward read does (a progress bar's "\\r" stays inside its line)."""
    pos = end
    carry = b""
    while pos > 0:
        step = min(block, pos)
        pos -= step
        f.seek(pos)
        pieces = (f.read(step) + carry).split(b"\n")
        lines = [p + b"\n" for p in pieces[:-1]] + ([pieces[-1]] if pieces[-1] else [])
        # The first line may begin before `pos`: it waits for the block in front of it.
        carry = lines.pop(0) if pos > 0 and lines else b""
        yield from reversed(lines)
    if carry:
        yield carry


def lines_upto(f: BinaryIO, end: int) -> Iterator[bytes]:
    """The lines of `f` from its start to offset `end` (what was there when it was opened), each
    with its newline (a last line without one as it is)."""
    f.seek(0)
    left = end
    carry = b""
    while left > 0 and (chunk := f.read(min(BLOCK, left))):
        left -= len(chunk)
        pieces = (carry + chunk).split(b"\n")
        carry = pieces.pop()
        yield from (p + b"\n" for p in pieces)
    if carry:
        yield carry


def last_lines(parts: list[tuple[BinaryIO, int]], n: int, keep: Keep | None, forward: bool) -> list[bytes]:
    """The last `n` kept lines of the files (older file first), each read up to its given end: from
    the end, or `forward` from the start when `keep` needs the lines in order (SinceFilter)."""
    if n <= 0:
        return []
    if forward:
        window: collections.deque[bytes] = collections.deque(maxlen=n)
        for f, end in parts:
            window.extend(line for line in lines_upto(f, end) if keep is None or keep(line))
        return list(window)
    found: list[bytes] = []
    for f, end in reversed(parts):
        for line in reversed_lines(f, end):
            if keep is None or keep(line):
                found.append(line)
                if len(found) == n:
                    return found[::-1]
    return found[::-1]


def separator(number: int, after: str | None, resumed_from_step: int | None, resumed_from: str | None,
              start: float | None) -> bytes:
    """The line between two attempts' output: which attempt, what the one before ended on, where this
    one resumed from, when it started."""
    restart = f"restart after: {after.splitlines()[0]}; " if after and after.strip() else ""
    if resumed_from_step is not None:
        where = f"resumed from step {resumed_from_step}"
    elif resumed_from:
        where = f"resumed from {resumed_from}"
    else:
        where = "from the start"
    when = f", started {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(start))}" if start else ""
    return f"── attempt {number} ({restart}{where}{when}) ──\n".encode()

