"""The control socket's reads (`spx ls`, `history`, `accounting`, `status`, `incidents`, `gpus`, `queue`, `adopt`),
answered on the client's own thread.

Each reads the store through that thread's own connection and the snapshot the supervisor
published at the end of its last turn (run/snapshot.py), never the loop's live objects; the request
table (requests.py) has already checked who may ask. What a caller sees is filtered to their own
jobs unless they are an admin.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from spx.daemon.core.config import DaemonConfig
from spx.daemon.core.users import is_admin
from spx.daemon.gpu.backend import GpuBackend
from spx.daemon.gpu.evidence import EvidenceBoard
from spx.daemon.intake import replay_file
from spx.daemon.intake.adopt import Adopter
from spx.daemon.run.queue_control import QueueControl
from spx.daemon.run.snapshot import Snapshot
from spx.daemon.service.gpu_rows import gpu_rows
from spx.daemon.service.requests import find_job
from spx.daemon.service.stragglers import StragglerWatch
from spx.daemon.state import accounting, incident_views, jobviews
from spx.daemon.state.store import Store
from spx.daemon.state.verifications_table import Strike


def _suspect_text(strikes: list[Strike]) -> str | None:
    """A GPU's strikes (replays that found it computing wrong numbers), in a few words; None: none."""
    if not strikes:
        return None
    owners = len({s.owner_uid for s in strikes})
    last = strikes[-1]
    return (f"{len(strikes)} strike{'s' if len(strikes) != 1 else ''} from {owners} owner{'s' if owners != 1 else ''};"
            f" last: {last.job} step {last.step}")


class Answers:
    def __init__(self, cfg: DaemonConfig, store: Store, backend: GpuBackend, adopter: Adopter, queue: QueueControl,
                 snapshot: Callable[[], Snapshot]):
        self.cfg = cfg
        self.store = store
        self.backend = backend
        self.adopter = adopter
        self.queue_control = queue
        self.snapshot = snapshot
        self.stragglers = StragglerWatch(EvidenceBoard(backend) if backend is not None and backend.nvml else None,
                                         cfg.straggler_threshold_percent)

    def __call__(self, op: str, name: str | None, uid: int, arg: str | None = None) -> dict:
        if op == "accounting":
            return self.accounting(uid, arg)
        if op == "replay-spec":
            return self.replay_spec(name, uid, arg)
        return getattr(self, op.replace("-", "_"))(name, uid)

    def ls(self, _name: str | None, uid: int, scope: jobviews.Scope = "recent") -> dict:
        views = self.stragglers.annotate(jobviews.all_views(self.store, self.cfg.run_dir, self.snapshot,
                                                            scope=scope))
        admin = is_admin(uid, self.cfg.admin_group)
        return {"ok": True, "result": [v.to_json() for v in views if admin or v.owner_uid == uid]}

    def history(self, name: str | None, uid: int) -> dict:
        return self.ls(name, uid, scope="all")

    def accounting(self, uid: int, since: str | None) -> dict:
        """`spx history`: what each job live or changed since `since` (Unix seconds; none: all) used."""
        try:
            start = float(since) if since else 0.0
        except ValueError:
            start = math.nan
        if not math.isfinite(start):
            return {"ok": False, "error": f"since must be Unix seconds, not {(since or '')[:40]!r}", "code": 2}
        admin = is_admin(uid, self.cfg.admin_group)
        return {"ok": True, "result": [u.to_json() for u in accounting.usage_since(self.store, start, time.time())
                                       if admin or u.owner_uid == uid]}

    def status(self, name: str | None, uid: int) -> dict:
        job = find_job(self.store, name or "", uid, self.cfg.admin_group)
        if isinstance(job, dict):
            return job
        snap = self.snapshot()
        tracked = snap.job(job.id)
        hosts = [dict(line) for line in tracked.gang_hosts] if tracked and tracked.gang_hosts is not None else None
        view = self.stragglers.view(jobviews.job_view(self.store, job, self.cfg.run_dir, snap.live_pids(),
                                                      with_history=True, gang_hosts=hosts, standbys=snap.standby_pids()))
        return {"ok": True, "result": view.to_json(with_history=True)}

    def replay_spec(self, name: str | None, uid: int, arg: str | None) -> dict:
        """`spx verify NAME`: the job file of a replay of NAME's checkpoints, for its owner to submit."""
        job = find_job(self.store, name or "", uid, self.cfg.admin_group)
        return job if isinstance(job, dict) else replay_file.replay_file(self.store, job, uid, arg)

    def incidents(self, name: str | None, uid: int) -> dict:
        """`spx incidents [NAME]`: a job the caller may not see does not exist for them (as `status`)."""
        admin = is_admin(uid, self.cfg.admin_group)
        found = incident_views.visible(self.store, name, lambda job: admin or job.owner_uid == uid)
        if found is None:
            return {"ok": False, "error": f"no job named {name!r}", "code": 1}
        return {"ok": True, "result": found}

    def gpus(self, _name: str | None, uid: int) -> dict:
        """The daemon's own backend and allocation (what `spx top` shows); the job on a GPU is named
        only to its owner and admins, as in `ls`."""
        live = jobviews.all_views(self.store, self.cfg.run_dir, scope="live")
        rows = gpu_rows(self.backend, live, self.store.host.quarantined_gpus())
        admin = is_admin(uid, self.cfg.admin_group)
        seen = {v.name for v in live if admin or v.owner_uid == uid}
        strikes = self.store.verifications.strikes()
        return {"ok": True, "result": [
            {**r.to_json(), "job": r.job if r.job is None or r.job in seen else "(another user's job)",
             "suspect": _suspect_text(strikes.get(r.index, []))} for r in rows]}

    def queue(self, _name: str | None, _uid: int) -> dict:
        return self.queue_control.answer()

    def adopt(self, name: str | None, uid: int) -> dict:
        """A walk of a volume: slow, so here; the jobs it finds are recorded by the loop (adopt.py)."""
        return self.adopter.request(name, uid)
