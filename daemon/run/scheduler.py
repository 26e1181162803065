"""The one place that decides which job starts now, on which GPUs. Pure: the daemon passes in what
it knows (the queue, the jobs waiting to relaunch, which GPUs are held and which are idle).

A restarting job may relaunch once its backoff is over (the step function counts it down in
monotonic time and reports the job ready) and its own GPUs, which it keeps through the backoff,
show no compute processes any more (a dying worker may still hold GPU memory). Queued jobs: whole GPUs only; never two jobs on one GPU; a GPU with compute processes on it (from anything) is
not free. Order is priority, then FIFO, with no backfill among GPU jobs: a big job at the head of
the queue is not starved by a stream of small ones behind it. CPU jobs (`gpus: 0`) need nothing and
are never held back.

Quarantined GPUs (the health gate found them faulty; see gpu/health.py) are never allocated. A
relaunch whose own GPUs include a quarantined one is placed again: its healthy GPUs and the free
ones, as many as it asks for; while not enough are free it waits, and `Plan.waiting` says why.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from spx.daemon.run.queue_rules import QueueFacts, UserBudget, gate
from spx.daemon.state.jobs_table import JobRow

MAX_STARTS_PER_TURN = 32


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


def place(queued: Iterable[JobRow], free: set[int], budget: UserBudget | None = None,
          why: dict[int, str] | None = None) -> list[Placement]:
    """Placements for the queue (already ordered by priority, then submission), using `free`.
    `budget`: per-user GPU limits (a job over its owner's limit is passed over: it does not block
    the queue). `why` (if given) gets, for each job not placed, why it waits."""
    free = set(free)
    placements = []
    blocked = False  # a GPU job ahead waits for GPUs
    why = {} if why is None else why
    for job in queued:
        want = job.spec.gpus
        over = budget.over(job) if budget is not None else None
        if over is not None:
            why[job.id] = over
            continue
        if want == 0:
            placements.append(Placement(job, []))
            continue
        if blocked:
            # Not named: the head changes as the queue moves, and a thousand reasons must not change with it.
            why[job.id] = "waiting behind an earlier job that waits for GPUs (no backfill)"
            continue
        if isinstance(want, list):
            chosen = sorted(want) if set(want) <= free else None
        else:
            chosen = sorted(free)[:want] if len(free) >= want else None
        if chosen is None:
            # Head-of-line: later GPU jobs wait behind this one; CPU jobs may still pass.
            why[job.id] = f"waiting for GPUs {want}" if isinstance(want, list) else f"waiting for {want} free GPU{'' if want == 1 else 's'}"
            blocked = True
            continue
        placements.append(Placement(job, chosen))
        free -= set(chosen)
        if budget is not None:
            budget.charge(job)
    return placements


@dataclass(frozen=True)
class Waiting:
    """A tracked job that may start as soon as its GPUs are free (its backoff is over). `want`: how
    many GPUs it asks for (`spec.gpus` as a count), None when it names them (then only those do)."""

    job_id: int
    gpus: tuple[int, ...]
    want: int | None = None


@dataclass(frozen=True)
class Start:
    """Start `job_id` now on `gpus`: a queued job placed (`job` set) or a waiting one relaunched."""

    job_id: int
    gpus: tuple[int, ...]
    job: JobRow | None = None


@dataclass(frozen=True)
class Plan:
    starts: list[Start]
    impossible: list[Impossible]
    waiting: dict[int, str] = field(default_factory=dict)  # job id → why it (queued or a relaunch) cannot start yet


def plan(queued: list[JobRow], waiting: list[Waiting], devices: list[int], held: set[int],
         idle: Callable[[int], bool], backend_desc: str, limit: int = MAX_STARTS_PER_TURN,
         quarantined: frozenset[int] = frozenset(), facts: QueueFacts | None = None) -> Plan:
    """This turn's starts, at most `limit` (the rest start on the next turns: a thousand jobs queued
    at once must not stall the loop for one turn of a thousand launches). `devices`: the host's GPU
    indices; `held`: GPUs of live jobs (a restarting job holds its own through the backoff);
    `idle(g)`: no compute processes on GPU g and healthy (asked of NVML lazily: only when some job
    could start). Relaunches come first: their GPUs are theirs already (unless one is quarantined:
    then it is placed again, see the module doc). `quarantined` GPUs are never allocated. `facts`:
    the queue's other rules (queue_rules.py: dependencies, holds, drain, per-user GPU limits); a
    relaunch is not subject to them (a drain lets running jobs go on, relaunches included).
    `Plan.waiting` says why each job that could start does not."""
    starts: list[Start] = []
    waits: dict[int, str] = {}
    taken: set[int] = set()
    for w in waiting:
        if len(starts) >= limit:
            break
        bad = sorted(set(w.gpus) & quarantined)
        if not bad:
            if all(idle(g) for g in w.gpus):
                starts.append(Start(w.job_id, w.gpus))
                taken |= set(w.gpus)
            continue
        named = "GPU " + ", ".join(map(str, bad)) + " quarantined"
        if w.want is None:
            waits[w.job_id] = f"waiting: {named}, and the job names its GPUs"
            continue
        own = set(w.gpus) - quarantined
        healthy = sorted(g for g in devices if g not in quarantined and g not in taken
                         and (g in own or g not in held) and idle(g))
        if len(healthy) < w.want:
            waits[w.job_id] = f"waiting: {named}; {len(healthy)} of {w.want} healthy GPUs free"
            continue
        chosen = tuple(healthy[:w.want])
        starts.append(Start(w.job_id, chosen))
        taken |= set(chosen)
    impossible, placeable = [], []
    for job in queued:
        why = impossible_reason(job, devices, backend_desc)
        verdict = gate(job, facts) if facts is not None else None
        if why:
            impossible.append(Impossible(job, why))
        elif verdict is not None and verdict.fail:
            impossible.append(Impossible(job, verdict.reason))
        elif verdict is not None:
            waits[job.id] = verdict.reason
        else:
            placeable.append(job)
    if placeable and len(starts) < limit:
        free = {g for g in devices if g not in held and g not in taken and g not in quarantined and idle(g)}
        budget = UserBudget(facts.usage, facts.limits) if facts is not None else None
        starts += [Start(p.job.id, tuple(p.gpus), p.job) for p in place(placeable, free, budget, waits)][:limit - len(starts)]
    return Plan(starts, impossible, waits)
