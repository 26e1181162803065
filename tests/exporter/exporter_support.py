"""Helpers for the exporter tests (fixtures live in conftest.py)."""

from __future__ import annotations

from spx.daemon.state.views import JobView


class ManualClock:
    """A monotonic clock the test moves, so fake counters are deterministic."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def job_view(name: str = "train-a", state: str = "running", gpus: list[int] | None = None,
             pids: list[int] | None = None) -> JobView:
    return JobView(
        name=name, state=state, reason=None, owner_uid=1000, owner="alice", attempts=2, step=1200, epoch=1,
        samples_per_second=812.5, last_checkpoint_step=1000, last_checkpoint_time=1_718_000_000.0,
        gpus=[0, 1] if gpus is None else gpus, submitted=1_717_990_000.0,
        restarts_by_reason={"crash": 1}, pids=pids or [],
    )
