"""`spx logs NAME`: a job's attempt logs, read as the invoking user (the owner's logs are theirs to
read; root reads all), never through the daemon.

Which attempts: the latest, or `--attempt N`, or with `--since` every attempt still writing at that
time. Each attempt's log is `attempt-N.log.1` (the older part the relay rotated aside) then
`attempt-N.log`. `-f` follows the job through its restarts, a separator line before each new
attempt, until it reaches a terminal state (with `--attempt N`, until that attempt ends). `--rank`,
`--since` and `--tail` filter the lines (log_lines.py says how each is read); an earlier job of a
reused name is read by its id, from where the daemon set its logs aside (`log/NAME.job-ID`).
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from spx.daemon.cli import log_lines
from spx.daemon.cli.client import EXIT_OK, EXIT_USAGE, CliError, NotRunning, ask
from spx.daemon.core.config import DaemonConfig

POLL_SECONDS = 0.5
TERMINAL = ("succeeded", "failed", "cancelled")


@dataclass(frozen=True)
class Attempt:
    """One attempt's log as `spx logs` shows it; what the daemon knows of it (start, end, where it
    resumed from) is empty for an earlier job's, which only its files tell of."""

    number: int
    log_dir: Path
    start: float | None = None
    end: float | None = None
    resumed_from_step: int | None = None
    resumed_from: str | None = None
    after: str | None = None  # why the attempt before it ended: what this one restarts after

    @classmethod
    def of(cls, number: int, log_dir: Path, history: dict[int, dict]) -> Attempt:
        h, before = history.get(number, {}), history.get(number - 1, {})
        return cls(number, log_dir, h.get("start"), h.get("end"), h.get("resumed_from_step"), h.get("resumed_from"),
                   before.get("root_cause") or before.get("reason"))

    @property
    def path(self) -> Path:
        return self.log_dir / f"attempt-{self.number}.log"

    @property
    def rotated(self) -> Path:
        return self.log_dir / f"attempt-{self.number}.log.1"

    def separator(self) -> bytes:
        return log_lines.separator(self.number, self.after, self.resumed_from_step, self.resumed_from, self.start)


class Output:
    """stdout, line-filtered when a filter is on (a partial line waits for its end), with a separator
    line before every attempt but the first shown."""

    def __init__(self, stream: BinaryIO):
        self.stream = stream
        self.keep: log_lines.Keep | None = None
        self.partial = b""
        self.shown_attempts = 0
        self.at_line_start = True

    def begin(self, attempt: Attempt, keep: log_lines.Keep | None) -> None:
        self.end_of_attempt()
        if self.shown_attempts:
            self._write((b"" if self.at_line_start else b"\n") + attempt.separator())
        self.shown_attempts += 1
        self.keep = keep

    def feed(self, data: bytes) -> None:
        if self.keep is None:
            self._write(data)
            return
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        self._write(b"".join(line + b"\n" for line in lines if self.keep(line + b"\n")))

    def lines(self, lines: list[bytes]) -> None:
        self._write(b"".join(lines))

    def end_of_attempt(self) -> None:
        """The attempt's last line, even without its newline."""
        if self.partial and self.keep is not None and self.keep(self.partial):
            self._write(self.partial)
        self.partial = b""

    def _write(self, data: bytes) -> None:
        if not data:
            return
        self.stream.write(data)
        self.stream.flush()
        self.at_line_start = data.endswith(b"\n")


class Followed:
    """One attempt's `attempt-N.log`, read on as the relay writes it and across its rotation (the
    relay closes the file, renames it to `.1` and starts a new one: what was left of the old one is
    read before the new one), as `tail -F` does. Before the relay has written anything there is no
    file yet: nothing to read."""

    def __init__(self, path: Path, f: BinaryIO | None = None):
        self.path = path
        self.f = f

    def read(self) -> bytes:
        if self.f is None:
            self.f = _open(self.path, missing_ok=True)
            if self.f is None:
                return b""
        data = self.f.read(log_lines.BLOCK)
        if data or not self._rotated():
            return data
        self.f.close()
        self.f = _open(self.path, missing_ok=True)
        return self.f.read(log_lines.BLOCK) if self.f else b""

    def _rotated(self) -> bool:
        assert self.f is not None
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False  # renamed, the new one not written yet: the old one may still be drained
        mine = os.fstat(self.f.fileno())
        return (st.st_dev, st.st_ino) != (mine.st_dev, mine.st_ino)

    def drain(self) -> Iterator[bytes]:
        while data := self.read():
            yield data

    def close(self) -> None:
        if self.f is not None:
            self.f.close()


def cmd_logs(cfg: DaemonConfig, args: argparse.Namespace) -> int:
    try:
        return _logs(cfg, args, Output(sys.stdout.buffer))
    except BrokenPipeError:
        # `spx logs NAME | head`: the reader has what it wanted; no traceback at exit either.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


def _logs(cfg: DaemonConfig, args: argparse.Namespace, out: Output) -> int:
    if args.tail is not None and args.tail < 0:
        raise CliError(f"--tail {args.tail}: give a number of lines, 0 or more", EXIT_USAGE)
    try:
        since = log_lines.parse_since(args.since, time.time()) if args.since else None
    except ValueError as e:
        raise CliError(str(e), EXIT_USAGE) from None
    doc = ask(cfg, "status", args.name)
    assert isinstance(doc, dict)
    current = args.job_id is None or args.job_id == doc.get("job_id")
    log_dir = cfg.log_dir / args.name if current else _earlier_log_dir(cfg, args.name, args.job_id)
    if not current and not log_dir.is_dir():
        raise CliError(f"no logs of a job {args.job_id} named {args.name} (looked for {log_dir}); "
                       f"the ids are in `spx ls --all`")
    history = {h["number"]: h for h in doc.get("history") or []} if current else {}
    latest = doc["attempts"] if current else _attempts_in(log_dir)
    follow = args.follow and current and doc["state"] not in TERMINAL
    numbers = chosen(args.attempt, latest, history, since)
    if not numbers and not follow:
        raise CliError(f"{args.name} has not started an attempt yet" if not latest else
                       f"no attempt of {args.name} wrote its log since {args.since}")
    attempts = [Attempt.of(n, log_dir, history) for n in numbers]
    if len(attempts) == 1 and not follow and not attempts[0].path.exists() and not attempts[0].rotated.exists():
        missing = FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT))
        raise CliError(_missing_log_message(cfg, args.name, doc, attempts[0].path, missing) if current
                       else f"{attempts[0].path}: {missing.strerror}")
    last = show(attempts, out, args.rank, since, args.tail)
    if not follow:
        out.end_of_attempt()
        return EXIT_OK
    return _follow(cfg, args.name, log_dir, out, last, numbers[-1] if numbers else latest,
                   pinned=args.attempt is not None, rank=args.rank)


def chosen(attempt: int | None, latest: int, history: dict[int, dict], since: float | None) -> list[int]:
    """The attempts to show: the one asked for; with `since`, every one that had not ended before it
    (the daemon's end time; an earlier job's attempts, which it no longer knows, all); else the latest."""
    if attempt is not None:
        return [attempt]
    if since is not None:
        return [n for n in range(1, latest + 1) if (history.get(n, {}).get("end") or since) >= since]
    return [latest] if latest else []


def _keep(attempt: Attempt, rank: int | None, since: float | None) -> log_lines.Keep | None:
    """The line filter of one attempt's file: none at all when every line is shown. `since` dates
    lines only in an attempt that started before it; a later one's lines are all newer."""
    dated = log_lines.SinceFilter(since) if since is not None and (attempt.start or 0) < since else None
    if dated is None and rank is None:
        return None
    if dated is None:
        return lambda line: log_lines.for_rank(line, rank)  # type: ignore[arg-type]
    if rank is None:
        return dated.keep
    return lambda line: dated.keep(line) and log_lines.for_rank(line, rank)


def _open_parts(attempt: Attempt) -> tuple[BinaryIO | None, BinaryIO | None]:
    """The attempt's `attempt-N.log.1` and `attempt-N.log`, opened (None: not there). The current
    one is opened first: if the relay rotates between the two opens, `.1` is the file already held,
    not read twice."""
    current = _open(attempt.path, missing_ok=True)
    rotated = _open(attempt.rotated, missing_ok=True)
    if rotated is not None and current is not None and _same_file(rotated, current):
        rotated.close()
        rotated = None
    return rotated, current


def _written_since(f: BinaryIO, since: float | None) -> bool:
    """`--since` leaves out a part last written before it."""
    return since is None or os.fstat(f.fileno()).st_mtime >= since


def show(attempts: list[Attempt], out: Output, rank: int | None, since: float | None,
          tail: int | None) -> Followed | None:
    """Print the chosen attempts; returns the last one's `attempt-N.log`, where printing ended."""
    if tail is not None:
        return _show_tail(attempts, out, rank, since, tail)
    current = None
    for attempt in attempts:
        if current is not None:
            current.close()
        rotated, current = _open_parts(attempt)
        out.begin(attempt, _keep(attempt, rank, since))
        for f in (rotated, current):
            if f is not None and _written_since(f, since):
                while data := f.read(log_lines.BLOCK):
                    out.feed(data)
        if rotated is not None:
            rotated.close()
        if current is not None:
            current.seek(0, os.SEEK_END)
    return Followed(attempts[-1].path, current) if attempts else None


def _show_tail(attempts: list[Attempt], out: Output, rank: int | None, since: float | None,
               tail: int) -> Followed | None:
    """The last `tail` lines of the chosen attempts (after the filters), each attempt's under its
    separator. Without `since` the files are read from their end; with it, from their start (a
    line's date may come from a timestamp above it)."""
    picked: list[tuple[Attempt, list[bytes]]] = []
    followed = None
    for attempt in reversed(attempts):
        rotated, current = _open_parts(attempt)
        parts = [(f, f.seek(0, os.SEEK_END)) for f in (rotated, current) if f is not None and _written_since(f, since)]
        left = tail - sum(len(lines) for _, lines in picked)
        lines = log_lines.last_lines(parts, left, _keep(attempt, rank, since), forward=since is not None)
        picked.append((attempt, lines))
        if rotated is not None:
            rotated.close()
        if followed is None:  # the last attempt: followed on from where the reading stopped
            ends = dict(parts)
            if current is not None:
                current.seek(ends[current]) if current in ends else current.seek(0, os.SEEK_END)
            followed = Followed(attempt.path, current)
        elif current is not None:
            current.close()
    for attempt, lines in reversed(picked):
        if lines or attempt is attempts[-1]:
            out.begin(attempt, _keep(attempt, rank, None))
            out.lines(lines)
    return followed


def _follow(cfg: DaemonConfig, name: str, log_dir: Path, out: Output, followed: Followed | None, number: int,
            pinned: bool, rank: int | None) -> int:
    """Read on until the job ends (or, `pinned`, until attempt `number` does); each new attempt's
    log from its first byte, under its separator."""
    status = JobStatus(cfg, name, number)
    while True:
        data = followed.read() if followed else b""
        if data:
            out.feed(data)
            continue
        now = status.now()
        moved_on = now["attempts"] > number
        if moved_on and not pinned:
            if followed:
                for data in followed.drain():
                    out.feed(data)
                followed.close()
            number += 1
            attempt = Attempt.of(number, log_dir, {h["number"]: h for h in now.get("history") or []})
            out.begin(attempt, _keep(attempt, rank, None))
            followed = Followed(attempt.path)
            continue
        if now["state"] in TERMINAL or (pinned and moved_on):
            if followed:
                for data in followed.drain():
                    out.feed(data)
                followed.close()
            out.end_of_attempt()
            return EXIT_OK
        time.sleep(POLL_SECONDS)


class JobStatus:
    """The followed job's status, asked whenever its files have nothing new. While no daemon answers
    (restarted: its jobs run on and are adopted) it is the last one known, so the files are read on;
    stderr says so once each time the daemon goes. Any other error (a daemon killed mid-answer) is
    given `tries` polls to pass before it ends the follow."""

    def __init__(self, cfg: DaemonConfig, name: str, number: int, tries: int = 3):
        self.cfg = cfg
        self.name = name
        self.last: dict = {"attempts": number, "state": "running"}
        self.gone = False
        self.tries = tries
        self.failed = 0

    def now(self) -> dict:
        try:
            doc = ask(self.cfg, "status", self.name)
        except NotRunning:
            if not self.gone:
                print(f"spx logs: no daemon answers on {self.cfg.socket_path}; reading on until one does",
                      file=sys.stderr, flush=True)
            self.gone = True
            return self.last
        except CliError:
            self.failed += 1
            if self.failed >= self.tries:
                raise
            return self.last
        assert isinstance(doc, dict)
        self.gone = False
        self.failed = 0
        self.last = doc
        return doc


def _open(path: Path, missing_ok: bool = False) -> BinaryIO | None:
    try:
        return path.open("rb")
    except FileNotFoundError:
        if missing_ok:
            return None
        raise
    except OSError as e:
        raise CliError(f"{path}: {e.strerror}") from e


def _same_file(a: BinaryIO, b: BinaryIO) -> bool:
    sa, sb = os.fstat(a.fileno()), os.fstat(b.fileno())
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _earlier_log_dir(cfg: DaemonConfig, name: str, job_id: int) -> Path:
    """Where the daemon moved an earlier job's logs when its name was reused (`log/NAME.job-ID`)."""
    return cfg.log_dir / f"{name}.job-{job_id}"


def _attempts_in(log_dir: Path) -> int:
    try:
        return max((int(p.stem.removeprefix("attempt-")) for p in log_dir.glob("attempt-*.log")
                    if p.stem.removeprefix("attempt-").isdigit()), default=0)
    except OSError:
        return 0


def _missing_log_message(cfg: DaemonConfig, name: str, doc: dict, path: Path, e: OSError) -> str:
    """A missing attempt log, with where the earlier jobs of a reused name keep theirs."""
    message = f"{path}: {e.strerror}; job {doc.get('job_id', '?')} named {name} has {doc['attempts']} attempt(s)"
    earlier = []
    for d in sorted(cfg.log_dir.glob(f"{name}.job-*")):
        job_id = d.name.removeprefix(f"{name}.job-")
        if job_id.isdigit():
            earlier.append(f"job {job_id}: {d} ({_attempts_in(d)} attempt(s))")
    if earlier:
        message += (f"\nearlier jobs named {name} keep their logs aside: " + "; ".join(earlier)
                    + f"\nread one with `spx logs {name} --job-id ID --attempt N` (ids: `spx ls --all`)")
    return message
