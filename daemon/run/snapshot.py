"""What readers on other threads (the control socket, the metrics exporter, the status line) may know
of the supervised jobs: an immutable summary the loop builds at the end of each turn and publishes by
swapping one reference, so no reader ever iterates the loop's own objects."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from spx.daemon.lifecycle.record import Phase, TrackedJob


@dataclass(frozen=True)
class JobSummary:
    job_id: int
    name: str
    phase: Phase
    attempt: int                                          # the current (or last) attempt's number
    pids: tuple[int, ...]                                 # its processes, as last seen
    gang_hosts: tuple[Mapping[str, object], ...] | None  # a job across hosts: every host's line, as last read
    # Its standby's processes (its monitor and log relay, run/standby_pool.py), none without one:
    # readers add their descendants and read what they cost then (state/standby_memory.py).
    standby_pids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Snapshot:
    jobs: tuple[JobSummary, ...] = ()
    last_restart: tuple[str, float, str] | None = None  # (job, wall time, reason class) for STATUS

    def job(self, job_id: int) -> JobSummary | None:
        return next((j for j in self.jobs if j.job_id == job_id), None)

    def live_pids(self) -> dict[str, list[int]]:
        """job name → its attempt's pids (jobs with processes seen)."""
        return {j.name: list(j.pids) for j in self.jobs if j.pids}

    def standby_pids(self) -> dict[int, list[int]]:
        """job id → its standby's processes (jobs with a standby). By id, not name: an ended job of
        the same name has none."""
        return {j.job_id: list(j.standby_pids) for j in self.jobs if j.standby_pids}


def take(records: Mapping[int, TrackedJob], pids: Mapping[str, list[int]],
         gang_hosts: Mapping[int, list[dict] | None], last_restart: tuple[str, float, str] | None,
         standbys: Mapping[int, tuple[int, ...]] | None = None) -> Snapshot:
    def hosts(job_id: int) -> tuple[Mapping[str, object], ...] | None:
        lines = gang_hosts.get(job_id)
        return None if lines is None else tuple(MappingProxyType(dict(line)) for line in lines)

    return Snapshot(tuple(JobSummary(s.job.id, s.job.name, s.phase, s.number, tuple(pids.get(s.job.name, ())),
                                     hosts(s.job.id), (standbys or {}).get(s.job.id, ()))
                           for s in records.values()), last_restart)
