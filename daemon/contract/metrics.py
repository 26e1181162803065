"""A loss or a gradient norm in a heartbeat or a replay verdict: JSON holds no NaN or infinity, so
those travel as the words "NaN", "Infinity", "-Infinity"; a reader takes them back, and bounds the rest.
Stdlib only (with core.bounded)."""

from __future__ import annotations

import math

from spx.daemon.core import bounded

NON_FINITE_WORDS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def metric_json(value: float | None) -> float | str | None:
    """A loss or norm as JSON can hold it: a number, or "NaN" / "Infinity" / "-Infinity"."""
    if value is None or math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"


def parse_metric(raw: object) -> float | None:
    """A reported loss or norm: a number within bounds, or NaN / ±Inf spelled as `metric_json` does
    (or as a JSON constant, or a number too large to be finite: 1e400). None for anything else: an
    odd metric never costs the beat."""
    if isinstance(raw, str):
        return NON_FINITE_WORDS.get(raw)
    if isinstance(raw, bounded.Unusable):
        return NON_FINITE_WORDS.get(raw.text.strip()) or _overflowed(raw.text.strip())
    try:
        return bounded.real(raw, "heartbeat")
    except bounded.Garbage:
        return None


def _overflowed(word: str) -> float | None:
    """±Inf for a number literal too large to be finite (1e400), else None."""
    try:
        value = float(word[:64])
    except ValueError:
        return None
    return value if math.isinf(value) else None
