"""Per-job metrics from the state store's job views (which already carry each job's heartbeat)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from spx.daemon.exporter.metrics import JOB_LABEL, Families
from spx.daemon.state.views import JobView

# Every state a job can be in (state/states.py); spx_job_state has one series per state, 1 for the current.
JOB_STATES = ("queued", "starting", "running", "restarting", "succeeded", "failed", "cancelled")

JOB_FAMILIES = [
    "spx_job_info", "spx_job_state", "spx_job_restarts_total", "spx_job_step", "spx_job_samples_per_second",
    "spx_job_last_checkpoint_timestamp_seconds", "spx_job_gpus", "spx_job_attempts",
    "spx_job_node_rank", "spx_job_generation", "spx_job_rank_step_seconds", "spx_job_straggler",
    "spx_job_seconds_total", "spx_job_unsettled_seconds", "spx_job_standby_memory_bytes",
]


class JobCollector:
    """Reads `jobs()` once per scrape; which jobs it returns (e.g. live + recently ended) is the store's call."""

    def __init__(self, jobs: Callable[[], list[JobView]],
                 explain: Callable[[list[JobView]], list[JobView]] | None = None) -> None:
        self.jobs = jobs
        self.explain = explain  # fills each view's `stragglers` (service/stragglers.py), after the GPU part read

    def collect(self) -> tuple[list[Any], bool]:
        fam = Families(JOB_FAMILIES)
        views = self.jobs()
        for view in sorted(self.explain(views) if self.explain else views, key=lambda v: v.name):
            job = {JOB_LABEL: view.name}
            fam.add("spx_job_info", {**job, "owner": view.owner}, 1)
            for state in JOB_STATES:
                fam.add("spx_job_state", {**job, "state": state}, 1 if view.state == state else 0)
            for reason, count in sorted(view.restarts_by_reason.items()):
                fam.add("spx_job_restarts_total", {**job, "reason": reason}, count)
            if view.step is not None:
                fam.add("spx_job_step", job, view.step)
            if view.samples_per_second is not None:
                fam.add("spx_job_samples_per_second", job, view.samples_per_second)
            if view.last_checkpoint_time is not None:
                fam.add("spx_job_last_checkpoint_timestamp_seconds", job, view.last_checkpoint_time)
            fam.add("spx_job_gpus", job, len(view.gpus))
            fam.add("spx_job_attempts", job, view.attempts)
            if view.node is not None and view.node.node_rank is not None:
                fam.add("spx_job_node_rank", job, view.node.node_rank)
            if view.node is not None and view.node.generation is not None:
                fam.add("spx_job_generation", job, view.node.generation)
            for rank, seconds in enumerate(view.rank_step_seconds or []):
                fam.add("spx_job_rank_step_seconds", {**job, "rank": str(rank)}, seconds)
            for s in view.stragglers:
                if s["rank"] is not None:
                    gpu = "" if s["gpu"] is None else str(s["gpu"])
                    fam.add("spx_job_straggler", {**job, "rank": str(s["rank"]), "gpu": gpu, "cause": s["cause"]},
                            s["slower"])
            if view.ledger is not None:
                for cause, seconds in view.ledger["seconds"].items():
                    fam.add("spx_job_seconds_total", {**job, "cause": cause}, seconds)
                fam.add("spx_job_unsettled_seconds", job, view.ledger["unsettled_seconds"])
            if view.standby_memory_bytes is not None:
                fam.add("spx_job_standby_memory_bytes", job, view.standby_memory_bytes)
        return fam.metrics(), True
