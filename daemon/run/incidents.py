"""The executor's incident recorder: for each attempt whose end is recorded as a failure (any class
but a cancel, a daemon stop or restart, a peer's restart or a lost lease), one incident in the
store (run/incident.py says what it holds).

On the loop, when the end is recorded (`failed`), only what is in memory: the attempt's GPUs and
their identities, each GPU's readings for the minute before the failure and its XIDs since
(gpu/recent.py, fed by the collector and the XID thread). Off the loop, in the job owner's lane
(the same lane its root cause was read in; the kernel log read is root's but bounded): the
kernel's lines about those GPUs (gpu/kernel_log.py) and, for a hang, the stacks the daemon dumped
into the attempt log. The answer is written on the loop (a store that refuses it loses this
incident, logged; nothing is decided on it). The failure's time is when the daemon began to stop
the attempt (a hang, a GPU fault) or, for an attempt that ended on its own, its launcher's exit.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from spx.daemon.core.causes import NOT_FAILURES, ReasonClass
from spx.daemon.core.lanes import Outcome
from spx.daemon.core.log import get_logger
from spx.daemon.gpu.backend import GpuBackend, GpuDevice
from spx.daemon.gpu.kernel_log import KernelLines, gpu_lines, kernel_address
from spx.daemon.gpu.recent import RecentReadings
from spx.daemon.lifecycle.actions import FinishAttempt
from spx.daemon.run import attempt_files
from spx.daemon.run.attempt_files import AttemptFiles
from spx.daemon.run.incident import READINGS_SECONDS, Failure, GpuIdentity, assemble, fit, stacks_in_log
from spx.daemon.run.rootcause import TAIL_BYTES
from spx.daemon.run.user_work import UserWork
from spx.daemon.state.db import StoreUnavailable
from spx.daemon.state.incidents_table import MAX_DOC_BYTES, IncidentTooLarge
from spx.daemon.state.jobs_table import JobRow
from spx.daemon.state.store import Store

log = get_logger()
KERNEL_LOOKBACK_SECONDS = 600.0  # the kernel's lines from at most this long before the failure
READ_DEADLINE_SECONDS = 30.0


@dataclass(frozen=True)
class GpuSources:
    """What an incident reads of the GPUs: the backend's recent readings and XIDs, its devices, and
    where the kernel writes about them (None: nowhere to read, e.g. the fake without a kernel log)."""

    recent: RecentReadings | None = None
    devices: Callable[[], list[GpuDevice]] = list
    kernel_log: str | None = None

    @classmethod
    def of(cls, backend: GpuBackend) -> GpuSources:
        return cls(backend.recent, backend.devices, backend.kernel_log)


class Incidents:
    def __init__(self, store: Store, work: UserWork, gpus: GpuSources, wall: Callable[[], float] = time.time):
        self.store = store
        self.work = work
        self.recent = gpus.recent
        self.devices = gpus.devices
        self.wall = wall
        self.kmsg = gpus.kernel_log
        self._stops: dict[tuple[int, int], tuple[float, str]] = {}  # (job, attempt) → when its stop began, why

    def stop_began(self, job_id: int, number: int, cause: str) -> None:
        """The daemon decided to stop the attempt (stored before its SIGTERM): the failure's time."""
        self._stops.setdefault((job_id, number), (self.wall(), cause))

    def failed(self, job: JobRow, a: FinishAttempt, gpus: tuple[int, ...], files: AttemptFiles | None,
               spawned_wall: float) -> None:
        """The end of attempt `a.number` was recorded: if a failure, its incident is gathered (module
        doc). Never raises: the end is recorded already, and an incident is a diagnostic."""
        stop = self._stops.pop((job.id, a.number), None)
        if a.number == 0 or a.reason_class is None or a.reason_class in NOT_FAILURES:
            return
        try:
            self._gather(job, a, gpus, files, spawned_wall, stop)
        except Exception as e:  # noqa: BLE001 — contained: the job's end stands without its incident
            log.error("incident_not_gathered", job=job.name, attempt=a.number, error=f"{type(e).__name__}: {e}")

    def _gather(self, job: JobRow, a: FinishAttempt, gpus: tuple[int, ...], files: AttemptFiles | None,
                spawned_wall: float, stop: tuple[float, str] | None) -> None:
        now = self.wall()
        failed_at = stop[0] if stop is not None else (a.ended_wall if a.ended_wall is not None else now)
        known = {d.index: d for d in self.devices()}
        identities = tuple(GpuIdentity(g, known[g].uuid, known[g].pci_bus_id) if g in known else GpuIdentity(g, "", "")
                           for g in gpus)
        recent = self.recent
        readings = {g: recent.readings(g, failed_at - READINGS_SECONDS, failed_at) for g in gpus} if recent else {}
        xids = {g: recent.xids(g, failed_at - READINGS_SECONDS, now) for g in gpus} if recent else {}
        failure = Failure(a.number, failed_at, a.ended_wall or now, a.reason, a.root_cause, a.exit_code, a.signal,
                          stop[1] if stop is not None else None, identities)
        addresses = {addr for g in identities if (addr := kernel_address(g.pci_bus_id))}
        since = max(spawned_wall, failed_at - KERNEL_LOOKBACK_SECONDS)
        hung = a.reason_class is ReasonClass.HANG
        kmsg = self.kmsg

        def read() -> tuple[KernelLines, str | None]:
            if kmsg is None:
                kernel = KernelLines({a: [] for a in addresses}, unavailable="this GPU backend has no kernel log")
            else:
                kernel = gpu_lines(addresses, since, now, kmsg)
            stacks = stacks_in_log(attempt_files.read_log_tail(files, TAIL_BYTES)) if hung and files else None
            return kernel, stacks

        def done(outcome: Outcome) -> None:
            kernel, stacks = outcome.value if outcome.ok else (KernelLines(unavailable=str(outcome.error)), None)
            doc = fit(assemble(failure, readings, xids, kernel, stacks), MAX_DOC_BYTES)
            try:
                self.store.incidents.add(job.id, a.number, failed_at, str(a.reason_class), doc)
            except (StoreUnavailable, IncidentTooLarge) as e:
                log.warning("incident_not_recorded", job=job.name, attempt=a.number, error=str(e))
                return
            log.info("incident_recorded", job=job.name, attempt=a.number, reason_class=str(a.reason_class),
                     gpus=list(gpus), kernel_lines=sum(len(v) for v in kernel.lines.values()),
                     stacks=stacks is not None)

        # keep: the job may be forgotten (a terminal failure) before this lands; its incident still counts.
        self.work.submit(job, "incident", read, READ_DEADLINE_SECONDS, done, keep=True)

    def forget(self, job_id: int) -> None:
        for key in [k for k in self._stops if k[0] == job_id]:
            del self._stops[key]
