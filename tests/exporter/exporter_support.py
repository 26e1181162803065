"""Helpers for the exporter tests (fixtures live in conftest.py)."""

from __future__ import annotations

from spx.daemon.state.attempt_progress import Progress
from spx.daemon.state.goodput import AttemptFacts, JobFacts, account
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
        restarts_by_reason={"crash": 1}, pids=pids or [], standby_memory_bytes=230 * 2**20,
        ledger=account(JobFacts(submitted=1_717_990_000.0, gpus=2, allocated=1_717_990_010.0, attempts=(
            AttemptFacts(start=1_717_990_012.0, end=1_717_990_500.0, reason_class="crash", backoff=10.0,
                         phases={"placed": 1_717_990_010.0, "spawn": 1_717_990_012.0,
                                 "launcher_exit": 1_717_990_498.0, "failure_seen": 1_717_990_499.0},
                         progress=Progress(first=(1_717_990_030.0, 1), last=(1_717_990_490.0, 1100),
                                           saves=((1000, 1_717_990_450.0),), kept=(1_717_990_450.0, 0.0))),
            AttemptFacts(start=1_717_990_520.0, resumed_from_step=1000, phases={"spawn": 1_717_990_520.0},
                         progress=Progress(first=(1_717_990_540.0, 1001), last=(1_717_990_700.0, 1200),
                                           saves=((1100, 1_717_990_650.0),), kept=(1_717_990_650.0, 0.0))),
        )), now=1_717_990_700.0).to_json(),
    )
