"""The crash-loop fallback: when resuming from the newest checkpoint keeps failing, resume once from
the previous complete one.

PURE: the attempt history in, the checkpoint to pass over (and why) out. The job's state machine
keeps the little history the rule reads (`remember`: the last attempts, and the one that fell back),
seeded from the store's attempt rows when a job is tracked (`past_attempt`); its FindCheckpoint
action carries the answer to discovery (as the user, off the loop) as `exclude`, and the new attempt
records whether the fallback was taken (`fallback_from`, stored with its discovery).

The rule, precisely. Attempt N+1 passes over checkpoint X when
  - the last two attempts (N-1, N) both resumed from X — so no newer complete checkpoint appeared
    between them: discovery would have chosen it;
  - both ended by a failure that can be the checkpoint's (not a cancel, a daemon stop or restart,
    a preemption, a GPU fault, a lost or unlaunchable attempt);
  - neither is known to have trained past X (a heartbeat step beyond X's step means X loaded
    fine; scripts without a heartbeat cannot show that, so their failures count);
  - and no attempt of the job fell back before: once per job, so two bad checkpoints in a row
    cannot walk the job back through its whole history.
Discovery applies the exclusion only if X would be chosen again (it is still the newest complete
one; a newer checkpoint supersedes X and nothing falls back) and only if an older complete one
exists (starting from scratch would throw the run away: X is resumed again).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from spx.daemon.core.causes import ReasonClass
from spx.daemon.lifecycle.policy import corruption_of, divergence_of

# Attempt ends that say nothing about the checkpoint the attempt resumed from.
NOT_THE_CHECKPOINTS = frozenset({ReasonClass.CANCELLED, ReasonClass.DAEMON_RESTART, ReasonClass.PREEMPTED,
                                 ReasonClass.GPU_FAULT, ReasonClass.LOST, ReasonClass.LAUNCH,
                                 ReasonClass.PEER_RESTART, ReasonClass.CORRUPTION})
LOOP_LENGTH = 2


@dataclass(frozen=True)
class PastAttempt:
    """What the rule reads of an ended attempt."""

    number: int
    ended: bool
    reason_class: str | None
    resumed_from: str | None
    resumed_from_step: int | None
    max_step: int | None
    fell_back: bool = False  # its discovery passed over a checkpoint (the fallback was taken)
    diverged: tuple[int, str] | None = None  # class divergence: (step, what), e.g. (37, "loss NaN")
    corrupted: tuple[int, str] | None = None  # class corruption: (step, what) a replay found different


class StoredAttempt(Protocol):
    """What `past_attempt` reads of a stored attempt (store.AttemptRow has it)."""

    @property
    def number(self) -> int: ...
    @property
    def end(self) -> float | None: ...
    @property
    def reason(self) -> str | None: ...
    @property
    def reason_class(self) -> str | None: ...
    @property
    def resumed_from(self) -> str | None: ...
    @property
    def resumed_from_step(self) -> int | None: ...
    @property
    def max_step(self) -> int | None: ...
    @property
    def checkpoint_discovery(self) -> str | None: ...


@dataclass(frozen=True)
class Avoid:
    """The checkpoint not to resume from, and why (discovery reports it as the skip reason)."""

    path: str
    why: str


def past_attempt(row: StoredAttempt) -> PastAttempt:
    """A stored attempt, as the rule reads it."""
    return PastAttempt(row.number, row.end is not None, row.reason_class, row.resumed_from, row.resumed_from_step,
                       row.max_step, bool(discovery_of(row).get("fallback_from")),
                       divergence_of(row.reason) if row.reason_class == ReasonClass.DIVERGENCE else None,
                       corruption_of(row.reason) if row.reason_class == ReasonClass.CORRUPTION else None)


def remember(history: tuple[PastAttempt, ...], attempt: PastAttempt) -> tuple[PastAttempt, ...]:
    """`history` with `attempt` added, kept to what the rule reads: the last LOOP_LENGTH attempts and
    the first that fell back (once per job)."""
    every = sorted((*history, attempt), key=lambda a: a.number)
    first_fallback = next((a for a in every if a.fell_back), None)
    last = every[-LOOP_LENGTH:]
    return tuple(([first_fallback] if first_fallback is not None and first_fallback not in last else []) + last)


def discovery_of(attempt: StoredAttempt) -> dict[str, Any]:
    """The discovery answer stored with an attempt ({} when none or unreadable)."""
    try:
        doc = json.loads(attempt.checkpoint_discovery or "{}")
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def _failed_on(attempt: PastAttempt, path: str) -> bool:
    if not attempt.ended or attempt.resumed_from != path:
        return False
    if attempt.reason_class is None or attempt.reason_class in NOT_THE_CHECKPOINTS:
        return False
    trained_past = (attempt.max_step is not None and attempt.resumed_from_step is not None
                    and attempt.max_step > attempt.resumed_from_step)
    return not trained_past


def checkpoint_to_avoid(history: Sequence[PastAttempt]) -> Avoid | None:
    """The checkpoint the next attempt must not resume from (see the module docstring), or None."""
    if len(history) < LOOP_LENGTH or any(a.fell_back for a in history):
        return None
    last = sorted(history, key=lambda a: a.number)[-LOOP_LENGTH:]
    path = last[-1].resumed_from
    if path is None or not all(_failed_on(a, path) for a in last):
        return None
    numbers = " and ".join(str(a.number) for a in last)
    return Avoid(path, f"crash loop: attempts {numbers} resumed from it and failed")


def fell_back(avoid: Avoid | None, found: dict[str, Any]) -> bool:
    """Did discovery pass over `avoid` (it was still the newest complete checkpoint)?"""
    if avoid is None:
        return False
    excluded = found.get("excluded")
    return isinstance(excluded, dict) and excluded.get("path") == avoid.path
