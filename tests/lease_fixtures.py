"""What the lease tests build (tests/unit/test_cas.py, test_lease_keeper.py, tests/trainer/
test_fenced_publish.py, tests/hostile/test_hostile_leases.py): a checkpoint dir leased at a
generation, running jobs' rows, and the store the lease keeper reads them from. Plain helpers: no
process, no user.
"""

from __future__ import annotations

import json
from pathlib import Path

from spx.daemon.core.spec import parse_spec
from spx.daemon.state.jobs_table import JobRow
from spx.daemon.state.states import JobState


def leased_dir(tmp_path: Path, gen: int) -> Path:
    """`tmp_path/ckpt` with `.spx/lease` at generation `gen` (another host's, far from expiring) and
    the lock file's counter at `gen`, as a compare-and-swap there leaves them."""
    ckpt = tmp_path / "ckpt"
    (ckpt / ".spx").mkdir(parents=True, mode=0o700)
    (ckpt / ".spx" / "lease").write_text(json.dumps({"host": "a", "job": "j", "expires": 1e12, "gen": gen}))
    (ckpt / ".spx" / "lease.lock").write_text(f"{gen}\n")
    return ckpt


def running_job(job_id: int, owner_uid: int, owner: str, uid: str, ckpt: Path) -> JobRow:
    """Job `j{job_id}` of `owner`, running, its checkpoint dir `ckpt` and its lease's job id `uid`."""
    spec = parse_spec(f"name: j{job_id}\nscript: a.py\ncheckpoints: {{dir: {ckpt}}}\n")
    return JobRow(id=job_id, name=f"j{job_id}", state=JobState.RUNNING, reason=None, owner_uid=owner_uid,
                  owner=owner, spec=spec, spec_file="-", submitted=0.0, priority=0, gpus=[],
                  backoff_remaining=0.0, no_progress_streak=0, backoff_level=0, staging=None, uid=uid)


class LiveJobsTable:
    def __init__(self, jobs: list[JobRow]) -> None:
        self._jobs = jobs

    def live(self) -> list[JobRow]:
        return self._jobs

    def ended_since(self, _since: float) -> list[JobRow]:
        return []


class LiveJobsStore:
    """The store's jobs table as the lease keeper reads it: these jobs live, none ended."""

    def __init__(self, jobs: list[JobRow]) -> None:
        self.jobs = LiveJobsTable(jobs)
