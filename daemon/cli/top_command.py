"""`spx top` / `spx status NAME --watch` glue: jobs from the daemon, GPUs from NVML, drawn by top.py."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from spx.daemon.cli.top import GpuRow, gpu_rows, run_top
from spx.daemon.doctor.command import open_backend_for_doctor
from spx.daemon.state.views import JobView

_FIELDS = {f.name for f in dataclasses.fields(JobView)} - {"history"}


def job_from_json(doc: dict[str, Any]) -> JobView:
    """A `spx ls --json` entry back into a JobView (unknown keys ignored, history dropped)."""
    return JobView(**{k: v for k, v in doc.items() if k in _FIELDS})


def run_top_cli(
    cfg: Any,
    fetch_jobs: Callable[[], object],
    only: str | None = None,
    once: bool = False,
    interval: float = 1.0,
) -> int:
    """Live view of all jobs, or of job `only` and its GPUs. `fetch_jobs` returns `ls --json` dicts."""
    backend = open_backend_for_doctor(cfg.gpu_backend, cfg.fake_gpus)

    def fetch() -> tuple[list[JobView], list[GpuRow]]:
        docs = fetch_jobs()
        assert isinstance(docs, list)
        jobs = [job_from_json(d) for d in docs]
        if only is not None:
            jobs = [j for j in jobs if j.name == only]
            if not jobs:
                raise LookupError(f"no job named {only!r}")
        rows = gpu_rows(backend, jobs)
        if only is not None:
            rows = [r for r in rows if r.index in jobs[0].gpus]
        return jobs, rows

    try:
        return run_top(fetch, interval, once=once)
    finally:
        backend.close()
