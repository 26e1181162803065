"""When training has diverged: a loss or gradient norm that is NaN/Inf, or that spikes.

A NaN loss does not crash anything: the optimizer writes NaN into every weight and the run goes on
producing garbage until someone looks. The trainer checks each step's values here (the same values
on every rank: the loop all-reduces them first, so all ranks stop at the same step) and, on a hit,
ends the attempt with `EXIT_DIVERGED`; the daemon rolls the job back to a checkpoint before it.

Two rules, each per metric:
  - non-finite (on by default): NaN or ±Inf;
  - spike (off by default): a value above median + k · MAD of the last `window` finite values (the
    median absolute deviation, a spread that one earlier spike does not inflate), once at least
    `min_history` were seen. MAD is floored at `min_spread` × |median| so that a loss flat to the
    last digit does not make every wobble a spike.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

from spx.daemon.contract.worker_env import EXIT_DIVERGED, NON_FINITE, Divergence, StepRanges


@dataclass(frozen=True)
class SpikeRule:
    """median + `k` · MAD over the last `window` values (see the module docstring)."""

    k: float = 10.0
    window: int = 100
    min_history: int = 20
    min_spread: float = 0.01

    def validate(self) -> None:
        if not (self.k > 0 and self.window >= 2 and 2 <= self.min_history <= self.window and self.min_spread >= 0):
            raise ValueError(f"spike rule needs k > 0, window >= min_history >= 2, min_spread >= 0: {self}")


class DivergenceCheck:
    """Feed it each step's values (`check`); it answers the first `Divergence` it sees, else None."""

    def __init__(self, non_finite: bool = True, spike: SpikeRule | None = None) -> None:
        if spike is not None:
            spike.validate()
        self.non_finite = non_finite
        self.spike = spike
        self._recent: dict[str, deque[float]] = {}

    @property
    def enabled(self) -> bool:
        return self.non_finite or self.spike is not None

    def check(self, step: int, values: dict[str, float | None]) -> Divergence | None:
        """The divergence among `values` (metric name → value; None: not measured) at `step`."""
        for metric, value in values.items():
            if value is None:
                continue
            if not math.isfinite(value):
                if self.non_finite:
                    return Divergence(step, metric, value, NON_FINITE)
                continue
            hit = self._spike(step, metric, value)
            if hit is not None:
                return hit
        return None

    def _spike(self, step: int, metric: str, value: float) -> Divergence | None:
        rule = self.spike
        if rule is None:
            return None
        recent = self._recent.setdefault(metric, deque(maxlen=rule.window))
        hit = None
        if len(recent) >= rule.min_history:
            median = statistics.median(recent)
            mad = max(statistics.median(abs(v - median) for v in recent), rule.min_spread * abs(median))
            limit = median + rule.k * mad
            if value > limit:
                hit = Divergence(step, metric, value,
                                 f"spike: above median {median:.4g} + {rule.k:g} x MAD {mad:.4g} = {limit:.4g} "
                                 f"over the last {len(recent)} steps")
        if hit is None:
            recent.append(value)  # a spike never joins the window it is judged against
        return hit


class Diverged(SystemExit):
    """Raised on every rank at the divergent step, after the "diverged" heartbeat; uncaught it exits
    with EXIT_DIVERGED. Nothing of the divergent step is checkpointed."""

    def __init__(self, divergence: Divergence) -> None:
        super().__init__(EXIT_DIVERGED)
        self.divergence = divergence


def skipped(ranges: StepRanges, step: int) -> bool:
    """Is `step` in one of `ranges` (first-last inclusive)?"""
    return any(lo <= step <= hi for lo, hi in ranges)
