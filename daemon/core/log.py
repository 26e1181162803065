"""Structured logging: one JSON object per line on stdout, which journald stores as is.

Every line about a job carries `job` and `attempt` (bind them once with `log.bind(job=…, attempt=…)`);
daemon-wide lines carry `job=None` so a `jq 'select(.job=="x")'` never misses or mis-assigns one.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog


def _ensure_job_fields(_logger: Any, _name: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    event.setdefault("job", None)
    event.setdefault("attempt", None)
    return event


def configure(level: str = "info") -> None:
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _ensure_job_fields,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(sort_keys=False),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stdout),
        cache_logger_on_first_use=True,
    )


def get_logger(**bound: object) -> Any:
    """A lazy logger: module-level loggers created before `configure()` still render as JSON."""
    logger = structlog.get_logger("spx")
    return logger.bind(**bound) if bound else logger
