"""The copier runs of jobs that stage their working set before their first attempt (the staging
package's runner, as the user, in its own process): started and stopped when the machine says, and
watched each turn (StagingEnded). Its progress text is shown in the job's row as it changes: a
diagnostic, written best effort (a store that refuses it now gets the next text)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from spx.daemon.core.config import DaemonConfig
from spx.daemon.core.log import get_logger
from spx.daemon.core.users import log_access
from spx.daemon.lifecycle.observations import Observation, StagingEnded
from spx.daemon.run import attempt_files
from spx.daemon.staging.runner import StagingRun, start_staging
from spx.daemon.state.db import StoreUnavailable
from spx.daemon.state.jobs_table import JobRow
from spx.daemon.state.store import Store

log = get_logger()


@dataclass
class _Staging:
    run: StagingRun
    shown: str | None  # the progress text the job's row holds


class StagingRuns:
    def __init__(self, cfg: DaemonConfig, store: Store, wall: Callable[[], float] = time.time):
        self.cfg = cfg
        self.store = store
        self.wall = wall
        self.runs: dict[int, _Staging] = {}

    def start(self, job: JobRow) -> None:
        stage = job.spec.data.stage
        assert stage is not None
        run = start_staging(job.id, stage.source, stage.to, job.owner_uid, attempt_files.staging_log(self.cfg, job),
                            log_access(job.owner_uid, self.cfg.log_group))
        self.runs[job.id] = _Staging(run, job.staging)
        log.info("staging_started", job=job.name, attempt=None, source=str(stage.source), to=str(stage.to))

    def stop(self, job: JobRow) -> None:
        """Staging is resumable, so stopping it is just a kill; the next start continues it. Not
        waited for: a copier in the user's hung volume dies only once the kernel lets it (the
        orphan reaper collects it)."""
        staging = self.runs.pop(job.id, None)
        if staging is None:
            return
        try:
            os.killpg(staging.run.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if staging.run.proc.stdout is not None:
            staging.run.proc.stdout.close()

    def observe(self, job: JobRow) -> list[Observation]:
        staging = self.runs.get(job.id)
        if staging is None:
            return []
        run = staging.run
        exited = run.poll()
        if run.text() != staging.shown:
            try:
                self.store.jobs.update(job.id, self.wall(), staging=run.text())
                staging.shown = run.text()
            except StoreUnavailable:
                pass  # progress text only; the next poll writes it
        if not exited:
            return []
        del self.runs[job.id]
        if run.proc.stdout is not None:
            run.proc.stdout.close()
        if run.succeeded:
            return [StagingEnded(True, run.text())]
        why = run.text() if run.text().startswith("staging failed") else f"staging failed: copier exited {run.proc.returncode}"
        return [StagingEnded(False, why)]

    def children(self) -> set[int]:
        return {staging.run.proc.pid for staging in list(self.runs.values())}
