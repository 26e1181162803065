"""What each job used, as `spx history` shows it (sacct's view): when it started and ended, how long,
how many attempts, GPU-hours and the peak memory of its attempts.

GPU-hours count each attempt's own time on its GPUs (end − start × the job's GPU count), summed:
the backoff between attempts holds no GPU and is not counted, while the job's elapsed time (its first
attempt's start to its end) includes it. An attempt still running counts up to `now`. Peak memory is
the attempt cgroup's `memory.peak`, recorded when the daemon removes the cgroup (None where cgroups
are not managed or the memory controller is not enabled: not measured, never guessed).
Stdlib-only and pure over the store's rows, so the CLI's fallback (root reading a stopped daemon's
store) and the control socket's answer are the same.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from spx.daemon.state.attempts_table import AttemptRow
from spx.daemon.state.jobs_table import JobRow
from spx.daemon.state.store import Store


@dataclass(frozen=True)
class AttemptUsage:
    number: int
    start: float
    end: float | None            # None: still running
    elapsed_seconds: float
    gpu_hours: float
    memory_peak_bytes: int | None
    reason: str | None
    reason_class: str | None


@dataclass(frozen=True)
class JobUsage:
    job_id: int
    name: str
    owner: str
    owner_uid: int
    state: str
    submitted: float
    start: float | None          # its first attempt's start (None: never started)
    end: float | None            # its last attempt's end once the job is over (None: not over)
    elapsed_seconds: float       # start to end (or to now); 0 for a job that never started
    attempts: int
    gpus: int                    # GPUs each attempt holds (the spec's count)
    gpu_hours: float
    memory_peak_bytes: int | None  # the largest of its attempts' peaks; None if none was measured
    history: list[AttemptUsage] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


def attempt_usage(a: AttemptRow, gpus: int, now: float | None) -> AttemptUsage:
    """`now` None: the job is over, so an attempt row left open (a daemon error ended the job before
    its attempt's end was written) has no known end and counts nothing, not time up to today."""
    until = a.end if a.end is not None else now
    elapsed = 0.0 if until is None else max(0.0, until - a.start)
    return AttemptUsage(number=a.number, start=a.start, end=a.end, elapsed_seconds=round(elapsed, 3),
                        gpu_hours=round(elapsed * gpus / 3600.0, 6), memory_peak_bytes=a.memory_peak,
                        reason=a.reason, reason_class=a.reason_class)


def job_usage(job: JobRow, attempts: list[AttemptRow], now: float) -> JobUsage:
    gpus = job.spec.gpu_count
    over = job.state.terminal
    history = [attempt_usage(a, gpus, None if over else now) for a in attempts]
    start = history[0].start if history else None
    end = max((h.end for h in history if h.end is not None), default=None) if over else None
    until = end if over else now
    elapsed = 0.0 if start is None or until is None else max(0.0, until - start)
    peaks = [h.memory_peak_bytes for h in history if h.memory_peak_bytes is not None]
    return JobUsage(
        job_id=job.id, name=job.name, owner=job.owner, owner_uid=job.owner_uid, state=job.state.value,
        submitted=job.submitted, start=start, end=end, elapsed_seconds=round(elapsed, 3), attempts=len(history),
        gpus=gpus, gpu_hours=round(sum(h.gpu_hours for h in history), 6), memory_peak_bytes=max(peaks) if peaks else None,
        history=history,
    )


def usage_since(store: Store, since: float, now: float) -> list[JobUsage]:
    """Every job live or changed at or after `since`, oldest first, with what it used."""
    jobs = store.jobs.active_since(since)
    attempts = store.attempts.for_jobs([j.id for j in jobs])
    return [job_usage(j, attempts[j.id], now) for j in jobs]
