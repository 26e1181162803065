"""`spx top` / `spx status NAME --watch` glue: jobs and the GPUs the daemon uses, both asked of the
daemon (control ops "ls" and "gpus"), drawn by top.py."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from spx.daemon.cli.top import run_top
from spx.daemon.service.gpu_rows import GpuRow
from spx.daemon.state.views import JobView

_FIELDS = {f.name for f in dataclasses.fields(JobView)} - {"history", "node"}


def job_from_json(doc: dict[str, Any]) -> JobView:
    """A `spx ls --json` entry back into a JobView (unknown keys ignored, history and node dropped)."""
    return JobView(**{k: v for k, v in doc.items() if k in _FIELDS})


def run_top_cli(
    fetch_jobs: Callable[[], object],
    fetch_gpus: Callable[[], object],
    only: str | None = None,
    once: bool = False,
    interval: float = 1.0,
    fetch_queue: Callable[[], object] | None = None,
) -> int:
    """Live view of all jobs, or of job `only` and its GPUs. `fetch_jobs` returns `ls --json` dicts,
    `fetch_gpus` the daemon's GPU rows (`GpuRow.to_json()` dicts), `fetch_queue` the queue's state
    (`{"drained": ...}`; a daemon too old to answer it shows none)."""

    def fetch() -> tuple[list[JobView], list[GpuRow], str | None]:
        docs = fetch_jobs()
        assert isinstance(docs, list)
        jobs = [job_from_json(d) for d in docs]
        if only is not None:
            jobs = [j for j in jobs if j.name == only]
            if not jobs:
                raise LookupError(f"no job named {only!r}")
        gpus = fetch_gpus()
        assert isinstance(gpus, list)
        rows = [GpuRow.from_json(g) for g in gpus]
        if only is not None:
            rows = [r for r in rows if r.index in jobs[0].gpus]
        return jobs, rows, _drained(fetch_queue)

    return run_top(fetch, interval, once=once)


def _drained(fetch_queue: Callable[[], object] | None) -> str | None:
    if fetch_queue is None:
        return None
    try:
        doc = fetch_queue()
    except Exception:  # noqa: BLE001 - a daemon without the `queue` request: no drain line
        return None
    drained = doc.get("drained") if isinstance(doc, dict) else None
    return drained if isinstance(drained, str) else None
