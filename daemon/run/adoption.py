"""Taking on, at daemon start, an attempt a previous daemon left open (jobs outlive the daemon): its
handles rebuilt from the store row, its processes found by tag, cgroup and — only if provably the
same process (boot id, start time) — its stored process group. Whether it still runs, or how it
ended while no daemon watched, is the machine's to decide (machine.adopted)."""

from __future__ import annotations

from spx.daemon.core.config import DaemonConfig
from spx.daemon.core.log import get_logger
from spx.daemon.lifecycle.observations import LauncherExited
from spx.daemon.run import attempt_files, cgroups, proctree
from spx.daemon.run.attempt_runtime import AttemptHandles, AttemptRuntime, adopted_end
from spx.daemon.state.attempts_table import AttemptRow
from spx.daemon.state.jobs_table import JobRow

log = get_logger()


def adopt(cfg: DaemonConfig, runtime: AttemptRuntime, tree: cgroups.CgroupTree | None, job: JobRow,
          row: AttemptRow) -> LauncherExited | None:
    """The open attempt `row`, taken on: None while its launcher runs, else how it ended
    (attempt_runtime.adopted_end). Its group is signalled only if the stored pgid's leader is
    provably the process that daemon started (same boot, same start time); the tag and the cgroup
    find the rest either way."""
    pgid = row.pgid
    same = pgid is not None and proctree.same_process(pgid, row.boot_id, row.start_ticks)
    if pgid is not None and not same:
        log.warning("stored_pgid_not_ours", job=job.name, attempt=row.number, pgid=pgid,
                    detail="its leader is gone or another process now; only the tag and cgroup are used")
    cgroup = None
    if tree is not None:
        old = tree.attempt(job.name, row.number, row.attempt_id)
        cgroup = old if old.is_dir() else None
    h = runtime.handles[job.id] = AttemptHandles(number=row.number, files=attempt_files.paths(cfg, job, row.number),
                                                 row_id=row.id, attempt_id=row.attempt_id,
                                                 pgid=pgid if same else None, cgroup=cgroup)
    h.pids = h.procs.pids()
    h.seen_pids.update(h.pids)
    return adopted_end(h)


def adopt_lost(runtime: AttemptRuntime, job: JobRow, number: int) -> None:
    """A job stored as running without an open attempt (its row never made it): nothing to find or
    signal; the machine ends the empty stop at once and relaunches it."""
    runtime.handles[job.id] = AttemptHandles(number=number)
