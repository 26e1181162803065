"""Where training is, and when the next checkpoint is due.

`Progress` is the whole position of a data-parallel run: the global optimizer step (it never
restarts at an epoch, unlike the seed's `step`), the epoch, and how many micro-batches of that
epoch this rank has consumed. Saved with every checkpoint and restored on resume, it is what lets a
resumed run continue with exactly the batch the uninterrupted run would have taken next.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class Progress:
    step: int = 0
    epoch: int = 0
    batches_in_epoch: int = 0

    def to_state(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_state(cls, state: dict) -> Progress:
        return cls(int(state["step"]), int(state["epoch"]), int(state["batches_in_epoch"]))


@dataclass
class CheckpointSchedule:
    """Every `every_steps` global steps (never at step 0) and/or every `every_seconds`.

    Time is passed in (monotonic seconds) rather than read here, so the rule is testable; the
    time rule is evaluated on rank 0 only and agreed across ranks by the loop, because clocks and
    step times differ between ranks and a checkpoint needs every rank at the same step.
    """

    every_steps: int | None = None
    every_seconds: float | None = None
    last_time: float = 0.0

    def due_by_steps(self, step: int) -> bool:
        return bool(self.every_steps) and step > 0 and step % self.every_steps == 0  # type: ignore[operator]

    def due_by_time(self, now: float) -> bool:
        return self.every_seconds is not None and now - self.last_time >= self.every_seconds

    def saved(self, now: float) -> None:
        self.last_time = now
