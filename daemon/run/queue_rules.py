"""The queue's rules beyond GPUs: dependencies (`after:`), holds, drain and per-user GPU limits.

Pure, like the scheduler that applies them: the daemon gathers the facts (service/queue_control.py)
and `gate()` says, for one queued job, whether it may be placed, must wait (and why, shown in
`spx ls`/`status`), or can never start (a dependency failed). Order of the checks: a failed
dependency ends the job whatever else holds it (waiting on would never end); then a hold, the
drain, unfinished dependencies; the per-user GPU limit last, in `UserBudget`, because it depends
on what the scheduler places before this job in the same turn.

A job over its owner's GPU limit waits, never fails (limits change; a reload applies the new ones),
and it does not hold up the queue behind it: other users' jobs pass it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from spx.daemon.state.jobs_table import JobRow


@dataclass(frozen=True)
class Limit:
    gpus: int
    source: str  # "user alice", "group ml", "default": where the number comes from, said in the reason


@dataclass(frozen=True)
class Dep:
    """One `after:` name as the submitter sees it: the job it resolved to (its state and reason),
    or `state` None when no such job exists."""

    name: str
    state: str | None
    reason: str | None = None


@dataclass(frozen=True)
class QueueFacts:
    drained: str | None = None  # who drained the host, or None
    deps: dict[int, tuple[Dep, ...]] = field(default_factory=dict)  # job id → its resolved `after:`
    usage: dict[int, int] = field(default_factory=dict)  # owner uid → GPUs their live jobs hold
    limits: dict[int, Limit | None] = field(default_factory=dict)  # owner uid → their limit (None: none)


@dataclass(frozen=True)
class Verdict:
    fail: bool  # True: the job can never start (it is failed with `reason`); False: it waits
    reason: str


def gate(job: JobRow, facts: QueueFacts) -> Verdict | None:
    """Why `job` may not be placed this turn (see the module doc for the order), or None."""
    deps = facts.deps.get(job.id, ())
    for d in deps:
        if d.state is None:
            return Verdict(True, f"dependency {d.name}: no job of that name was submitted before this one")
        if d.state in ("failed", "cancelled"):
            return Verdict(True, f"dependency {d.name} {d.state}" + (f": {d.reason}" if d.reason else ""))
    if job.held:
        return Verdict(False, f"held by {job.held} (spx release {job.name})")
    if facts.drained:
        return Verdict(False, f"waiting: the host is drained ({facts.drained}); no new starts until spx undrain")
    pending = [f"{d.name} ({d.state})" for d in deps if d.state != "succeeded"]
    if pending:
        return Verdict(False, "waiting for dependency " + ", ".join(pending))
    return None


class UserBudget:
    """Per-user GPU limits over one scheduling turn: `over(job)` says why a job would exceed its
    owner's limit (None if it fits), `charge(job)` counts a placed one."""

    def __init__(self, usage: dict[int, int], limits: dict[int, Limit | None]):
        self.usage = dict(usage)
        self.limits = limits

    def over(self, job: JobRow) -> str | None:
        want = job.spec.gpu_count
        limit = self.limits.get(job.owner_uid)
        if limit is None or want == 0:
            return None
        used = self.usage.get(job.owner_uid, 0)
        if want > limit.gpus:
            return (f"waiting: asks {want} GPUs, more than {job.owner}'s limit of {limit.gpus} ({limit.source}); "
                    "it starts only once the limit is raised")
        if used + want > limit.gpus:
            return (f"waiting: {job.owner}'s GPU limit ({limit.gpus}, {limit.source}): {used} in use, "
                    f"this job asks {want}")
        return None

    def charge(self, job: JobRow) -> None:
        self.usage[job.owner_uid] = self.usage.get(job.owner_uid, 0) + job.spec.gpu_count
