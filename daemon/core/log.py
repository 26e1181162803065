"""Structured logging: one JSON object per line, each with `job` and `attempt`.

Every line about a job carries `job` and `attempt` (bind them once with `log.bind(job=…, attempt=…)`);
daemon-wide lines carry `job=None` so a `jq 'select(.job=="x")'` never misses or mis-assigns one.

Where the lines go: under journald (JOURNAL_STREAM names our stdout or stderr) each is a journal entry of
its own, with PRIORITY from its level and SPX_JOB, SPX_ATTEMPT, SPX_EVENT (core/journal.py), so the
journal can be filtered by level and by job; anywhere else (by hand, in tests, a pipe) the JSON line
goes to stdout as it is. If journald refuses an entry, that line and the next go to stdout, and the
first of them says why, once until the journal takes entries again.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from collections.abc import Mapping, MutableMapping
from datetime import datetime, timezone
from typing import Any, TextIO

import structlog

from spx.daemon.core import journal


def _ensure_job_fields(_logger: Any, _name: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    event.setdefault("job", None)
    event.setdefault("attempt", None)
    return event


class StdoutSink:
    """Writes the JSON line, one per line, to a text stream (stdout)."""

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream

    def write(self, line: str, event: Mapping[str, Any]) -> None:
        stream = self.stream or sys.stdout
        stream.write(line + "\n")
        stream.flush()


class JournalSink:
    """Sends each line as a journal entry; what journald refuses goes to `fallback` instead, the first
    such line preceded by a `journal_refused` line with the reason."""

    def __init__(self, socket: journal.JournalSocket, fallback: StdoutSink):
        self.socket = socket
        self.fallback = fallback
        self._refused = False
        self._lock = threading.Lock()

    def write(self, line: str, event: Mapping[str, Any]) -> None:
        try:
            self.socket.send(journal.encode(journal.entry(event, line)))
        except OSError as e:
            with self._lock:
                first, self._refused = not self._refused, True
            if first:
                self.fallback.write(json.dumps({
                    "event": "journal_refused", "level": "warning",
                    "timestamp": datetime.now(timezone.utc).isoformat().replace("+00:00", "Z"), "job": None, "attempt": None,
                    "socket": self.socket.address, "error": str(e),
                    "detail": "log lines go to stdout (the journal stores them at priority 6) until it takes them again",
                }), {})
            self.fallback.write(line, event)
        else:
            self._refused = False


class _Writer:
    """structlog's logger: every level's method hands the rendered line and its fields to the sink."""

    def __init__(self, sink: StdoutSink | JournalSink):
        self.sink = sink

    def msg(self, line: str, event: Mapping[str, Any]) -> None:
        self.sink.write(line, event)

    log = debug = info = warn = warning = err = error = critical = exception = fatal = failure = msg


def _render(json_renderer: structlog.processors.JSONRenderer):
    def render(logger: Any, name: str, event: MutableMapping[str, Any]) -> tuple[tuple[str], dict[str, Any]]:
        line = json_renderer(logger, name, event)
        assert isinstance(line, str)  # json.dumps's
        return (line,), {"event": dict(event)}
    return render


def default_sink() -> StdoutSink | JournalSink:
    """The journal when stdout or stderr is systemd's journal stream, else stdout."""
    if journal.under_journald(os.environ):
        return JournalSink(journal.JournalSocket(), StdoutSink())
    return StdoutSink()


def configure(level: str = "info", sink: StdoutSink | JournalSink | None = None) -> None:
    writer = _Writer(sink or default_sink())
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _ensure_job_fields,
            structlog.processors.format_exc_info,
            _render(structlog.processors.JSONRenderer(sort_keys=False)),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=lambda *_args: writer,
        cache_logger_on_first_use=True,
    )


def get_logger(**bound: object) -> Any:
    """A lazy logger: module-level loggers created before `configure()` still render as JSON."""
    logger = structlog.get_logger("spx")
    return logger.bind(**bound) if bound else logger
