"""The queue's controls and the facts its rules need: `spx hold/release/priority/drain/undrain`,
and what the scheduler is told each turn (run/queue_rules.py).

Runs on the main loop (the store's only writer), reached through the control socket's request table
(service/requests.py), which checks who may: a user holds and releases their own jobs; root and the
admin group every job; drain and priority are the operator's. What an `after:` name resolves to
is intake/dependencies.py's rule; it is resolved once per waiting job and kept.
"""

from __future__ import annotations

import grp
import os
import pwd
import time

from spx.daemon.core.config import DaemonConfig
from spx.daemon.core.log import get_logger
from spx.daemon.intake.dependencies import resolve_dep
from spx.daemon.run.queue_rules import Dep, Limit, QueueFacts
from spx.daemon.state.jobs_table import JobRow
from spx.daemon.state.states import JobState
from spx.daemon.state.store import Store

log = get_logger()
LIMITS_CACHE_SECONDS = 60.0  # group membership is read again after this long



class QueueControl:
    """The main loop's part of the queue: its drain flag (a copy of the store's), the limits per
    user (read from the user database, cached), and the control commands."""

    def __init__(self, cfg: DaemonConfig, store: Store):
        self.cfg = cfg
        self.store = store
        self.drained = store.host.drained()
        self._limits: dict[int, Limit | None] = {}
        self._resolved: dict[tuple[int, str], int | None] = {}  # (job, after: name) → the job it names
        self._ended: dict[int, JobRow] = {}  # dependencies seen ended (terminal: they stay so)
        self._limits_read = 0.0

    # --- what the scheduler is told ---------------------------------------------------------------

    def facts(self, live: list[JobRow], queued: list[JobRow], now_mono: float) -> QueueFacts:
        live_by_id = {j.id: j for j in live}
        waiting_ids = {j.id for j in queued}
        self._resolved = {k: v for k, v in self._resolved.items() if k[0] in waiting_ids}  # started jobs need none
        named = set(self._resolved.values())
        self._ended = {i: j for i, j in self._ended.items() if i in named}
        deps = {}
        for job in queued:
            if job.spec.after:
                resolved = (self._dependency(job, n, live_by_id) for n in job.spec.after)
                deps[job.id] = tuple(Dep(n, d.state.value if d else None, d.reason if d else None)
                                     for n, d in zip(job.spec.after, resolved, strict=True))
        usage: dict[int, int] = {}
        for j in live:
            if j.state.holds_gpus:
                usage[j.owner_uid] = usage.get(j.owner_uid, 0) + len(j.gpus)
        if self.limits_due(now_mono):
            self._limits, self._limits_read = {}, now_mono
        limits = {j.owner_uid: self._limit(j.owner_uid) for j in queued}
        return QueueFacts(self.drained, deps, usage, limits)

    def limits_due(self, now_mono: float) -> bool:
        """The limits' cache is due to be read again (the next `facts` reads the user database)."""
        return now_mono - self._limits_read > LIMITS_CACHE_SECONDS

    def _dependency(self, job: JobRow, name: str, live_by_id: dict[int, JobRow]) -> JobRow | None:
        """The job `name` in `job`'s `after:` is, as it stands now. What a name resolves to never
        changes (only jobs submitted before `job` count), nor does an ended job: both are kept, so a
        turn with many waiting jobs reads the store only for what it has not seen yet."""
        key = (job.id, name)
        if key not in self._resolved:
            dep = resolve_dep(self.store, name, job.id, job.owner_uid, self.cfg.admin_group)
            self._resolved[key] = dep.id if dep else None
        dep_id = self._resolved[key]
        if dep_id is None:
            return None
        if dep_id in live_by_id:
            return live_by_id[dep_id]
        if dep_id not in self._ended:
            self._ended[dep_id] = self.store.jobs.get(dep_id)
        return self._ended[dep_id]

    def _limit(self, uid: int) -> Limit | None:
        if uid not in self._limits:
            self._limits[uid] = limit_for(self.cfg, uid)
        return self._limits[uid]

    # --- changes (main loop; the request table in service/requests.py checked who may) ----------------

    def drain(self, by: str) -> dict:
        if self.drained:
            return {"ok": True, "result": f"already drained ({self.drained})"}
        self.drained = f"by {by} at {time.strftime('%Y-%m-%d %H:%M', time.localtime())}"
        self.store.host.set_drained(self.drained, time.time())
        log.warning("queue_drained", by=by)
        return {"ok": True, "result": "drained: no new job starts; running jobs go on (spx undrain to resume)"}

    def undrain(self, by: str) -> dict:
        if not self.drained:
            return {"ok": True, "result": "not drained"}
        self.store.host.set_drained(None, time.time())
        self.drained = None
        log.info("queue_undrained", by=by)
        return {"ok": True, "result": "undrained: queued jobs may start"}

    def hold(self, job: JobRow, by: str) -> dict:
        if job.state is not JobState.QUEUED:
            return {"ok": False, "error": f"{job.name} is {job.state.value}: only a queued job can be held", "code": 1}
        if job.held:
            return {"ok": True, "result": f"{job.name} already held by {job.held}"}
        now = time.time()
        self.store.jobs.update(job.id, now, held=by, reason=f"held by {by} (spx release {job.name})")
        self.store.jobs.add_event(job.id, "held", f"by {by}", now)
        log.info("job_held", job=job.name, attempt=None, by=by)
        return {"ok": True, "result": f"{job.name} held: it will not start until spx release {job.name}"}

    def release(self, job: JobRow, by: str) -> dict:
        if job.state is not JobState.QUEUED:
            return {"ok": False, "error": f"{job.name} is {job.state.value}: only a queued job can be released", "code": 1}
        if not job.held:
            return {"ok": False, "error": f"{job.name} is not held", "code": 1}
        now = time.time()
        self.store.jobs.update(job.id, now, held=None, reason=None)
        self.store.jobs.add_event(job.id, "released", f"by {by}", now)
        log.info("job_released", job=job.name, attempt=None, by=by)
        return {"ok": True, "result": f"{job.name} released"}

    def priority(self, job: JobRow, by: str, arg: str | None) -> dict:
        try:
            value = int(arg or "")
        except ValueError:
            return {"ok": False, "error": f"priority must be a whole number, not {(arg or '')[:40]!r}", "code": 2}
        if not -1000 <= value <= 1000:
            return {"ok": False, "error": "priority must be between -1000 and 1000", "code": 2}
        if job.state.terminal:
            return {"ok": False, "error": f"{job.name} already {job.state.value}", "code": 1}
        now = time.time()
        self.store.jobs.update(job.id, now, priority=value)
        self.store.jobs.add_event(job.id, "priority", f"{job.priority} -> {value} by {by}", now)
        log.info("job_priority", job=job.name, attempt=None, priority=value, was=job.priority, by=by)
        return {"ok": True, "result": f"{job.name}: priority {job.priority} -> {value}"}

    # --- reads (control thread) ----------------------------------------------------------------------

    def answer(self) -> dict:
        """`queue` read op: the drain state (from the store: this runs on the control thread) and the limits."""
        return {"ok": True, "result": {"drained": self.store.host.drained(),
                                       "limits": self.cfg.limits.model_dump()}}


def limit_for(cfg: DaemonConfig, uid: int) -> Limit | None:
    """`uid`'s GPU limit (see GpuLimits): their own entry, else their groups' largest, else the default."""
    lim = cfg.limits
    if not lim.any:
        return None
    try:
        pw = pwd.getpwuid(uid)
    except KeyError:
        pw = None
    if pw is not None and pw.pw_name in lim.users:
        return Limit(lim.users[pw.pw_name], f"user {pw.pw_name}")
    if pw is not None and lim.groups:
        names = set()
        for gid in os.getgrouplist(pw.pw_name, pw.pw_gid):
            try:
                names.add(grp.getgrgid(gid).gr_name)
            except KeyError:
                continue
        best = max(((lim.groups[g], g) for g in names if g in lim.groups), default=None)
        if best is not None:
            return Limit(best[0], f"group {best[1]}")
    if lim.gpus_per_user is not None:
        return Limit(lim.gpus_per_user, "default")
    return None
