"""Which queued job gets which GPUs now. Pure: the daemon passes in what it knows.

Whole GPUs only; never two jobs on one GPU; a GPU with compute processes on it (from anything) is
not free. Order is priority, then FIFO, with no backfill among GPU jobs: a big job at the head of
the queue is not starved by a stream of small ones behind it. CPU jobs (`gpus: 0`) need nothing and
are never held back.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from spx.daemon.state.store import JobRow


@dataclass(frozen=True)
class Placement:
    job: JobRow
    gpus: list[int]


@dataclass(frozen=True)
class Impossible:
    job: JobRow
    reason: str


def impossible_reason(job: JobRow, all_gpus: list[int], backend_desc: str) -> str | None:
    """Why this job can never run on this host, or None."""
    want = job.spec.gpus
    if isinstance(want, list):
        missing = sorted(set(want) - set(all_gpus))
        if missing:
            return f"asks for GPUs {missing}, which this host does not have ({backend_desc})"
        return None
    if want > len(all_gpus):
        return f"needs {want} GPUs, this host has {len(all_gpus)} ({backend_desc})"
    return None


def place(queued: Iterable[JobRow], free: set[int]) -> list[Placement]:
    """Placements for the queue (already ordered by priority, then submission), using `free`."""
    free = set(free)
    placements = []
    for job in queued:
        want = job.spec.gpus
        if isinstance(want, list):
            if set(want) <= free:
                placements.append(Placement(job, sorted(want)))
                free -= set(want)
                continue
        elif want == 0:
            placements.append(Placement(job, []))
            continue
        elif len(free) >= want:
            chosen = sorted(free)[:want]
            placements.append(Placement(job, chosen))
            free -= set(chosen)
            continue
        # Head-of-line: later GPU jobs wait behind this one; CPU jobs may still pass.
        free = set()
    return placements
