"""The rollbacks: after an attempt whose training diverged at step S (a NaN or spiking loss or
gradient norm), resume from the newest complete checkpoint before S and skip the data of the steps
since that checkpoint, so the relaunch does not walk into the same batch again. After a replay on
other GPUs differed at step S (`spx verify`: a GPU computed wrong numbers), resume from the newest
checkpoint before S too, but train the same data again, and set aside the checkpoints from S on
(their numbers are wrong; they are kept for a person to look at, never resumed from).

PURE: the attempt history (resume_fallback.remember keeps it, seeded from the store's rows) and the
job's `restart.on_failure.divergence` rule in, the `Rollback` for the next attempt out. Its
FindCheckpoint carries it to discovery (checkpoints at or after S are passed over); the checkpoint
found fixes the skipped window, (its step + 1)-S, which the launch gives the workers as
SPX_SKIP_STEPS (spx.trainer records it in its checkpoints, so later resumes keep skipping it). How
the rule's `args` (e.g. a lower learning rate) go to every attempt after the job's first
divergence (`divergence_args`). How many rollbacks a job gets is the rule's `max` (policy.decide counts divergence failures as it counts
any class); once spent, the job fails with the last divergence as its reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from spx.daemon.contract.worker_env import StepRanges
from spx.daemon.core.causes import ReasonClass
from spx.daemon.core.restart_spec import ClassLimit, Restart
from spx.daemon.lifecycle.resume_fallback import PastAttempt


@dataclass(frozen=True)
class Rollback:
    """Resume from before `step`, where the last attempt diverged (`what`: "loss NaN"), or
    (`sets_aside`) where a replay found its numbers wrong: its checkpoints from `step` on are set aside
    and no data is skipped."""

    step: int
    what: str
    sets_aside: bool = False

    def skipped(self, resume_step: int | None) -> StepRanges:
        """The steps whose data the relaunch from a checkpoint at `resume_step` (None: from scratch) skips."""
        first = (resume_step or 0) + 1
        return ((first, self.step),) if first <= self.step and not self.sets_aside else ()

    def describe(self, resume_step: int | None, resumed: bool) -> str:
        """The line `spx status` shows: "rolled back from step 37 (loss NaN) to checkpoint 30, skipping
        batches 31–37", or "rolled back from step 25 (a replay differs: …) to checkpoint 20, the
        checkpoints from step 25 on set aside"."""
        where = f"checkpoint {resume_step}" if resumed and resume_step is not None else "the start"
        if self.sets_aside:
            return (f"rolled back from step {self.step} (a replay differs: {self.what}) to {where}, "
                    f"the checkpoints from step {self.step} on set aside")
        skip = self.skipped(resume_step if resumed else None)
        batches = f", skipping batches {skip[0][0]}–{skip[0][1]}" if skip else ""
        return f"rolled back from step {self.step} ({self.what}) to {where}{batches}"


def divergence_args(restart: Restart, class_counts: tuple[tuple[str, int], ...]) -> tuple[str, ...]:
    """The job's `restart.on_failure.divergence.args`, once the job has diverged (its counted
    divergence failures, seeded from the store after a daemon restart); () before, or without args."""
    rule = restart.on_failure.get(ReasonClass.DIVERGENCE)
    if not isinstance(rule, ClassLimit) or not rule.args or not dict(class_counts).get(ReasonClass.DIVERGENCE):
        return ()
    return tuple(rule.args)


def rollback_after(history: Sequence[PastAttempt], restart: Restart,
                   reject: tuple[int, str] | None = None) -> Rollback | None:
    """The rollback the next attempt makes: a replay differed (`reject`, the ledger's; or the last
    attempt was stopped for it, as the store remembers), or the last attempt diverged and the job's
    divergence rule says `rollback`; else None (a plain relaunch from the newest checkpoint)."""
    if reject is not None:
        return Rollback(*reject, sets_aside=True)
    if not history:
        return None
    last = max(history, key=lambda a: a.number)
    if last.reason_class == ReasonClass.CORRUPTION and last.corrupted is not None:
        return Rollback(*last.corrupted, sets_aside=True)
    rule = restart.on_failure.get(ReasonClass.DIVERGENCE)
    if last.reason_class != ReasonClass.DIVERGENCE or last.diverged is None:
        return None
    if not (isinstance(rule, ClassLimit) and rule.rollback):
        return None
    return Rollback(*last.diverged)
