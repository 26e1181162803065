"""Periodic replays: a job file's `verify: {every_checkpoints: N}` (docs/verify.md).

Every CHECK_EVERY_SECONDS the running jobs that ask for it are looked at: a job whose heartbeat has
named N new checkpoints since its last replay gets one — the intervals since the newest checkpoint
the last one covered — queued for its owner as `spx verify --from` would queue it, at the lowest
priority and pinned to GPUs idle now (no live job holds them, none quarantined, the gate finds them
free) and only while no job waits in the queue, so a replay never takes GPUs a queued job could use.
No idle GPUs: the job waits for the next look. One replay of a job at a time.

What is remembered (the checkpoints seen since the last replay, where it ended) lives in memory: a
restarted daemon starts counting again, which at worst delays a replay by N checkpoints.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import yaml

from spx.daemon.core.config import DaemonConfig
from spx.daemon.core.log import get_logger
from spx.daemon.core.spec import parse_spec
from spx.daemon.intake import accepted_copy
from spx.daemon.intake.replay_file import free_name, replay_doc
from spx.daemon.run import attempt_files
from spx.daemon.state.jobs_table import JobRow
from spx.daemon.state.jobviews import heartbeat_path
from spx.daemon.state.states import JobState
from spx.daemon.state.store import Store

log = get_logger()

CHECK_EVERY_SECONDS = 10.0
LOWEST_PRIORITY = -1000


@dataclass
class _Seen:
    newest: int | None = None      # the newest checkpoint step the heartbeat named
    since: int = 0                 # checkpoints named since the last replay was queued
    covered: int | None = None     # the newest checkpoint the last replay covered (the next one's --from)
    replay: str | None = None      # the name of the replay queued last


class AutoVerify:
    def __init__(self, cfg: DaemonConfig, store: Store, clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.store = store
        self.clock = clock
        self.jobs_dir = cfg.state_dir / "jobs"
        self._seen: dict[int, _Seen] = {}
        self._next = 0.0

    def tick(self, read_live: Callable[[], list[JobRow]], idle_gpus: Callable[[list[JobRow]], list[int]]) -> None:
        """Look at the jobs that ask for periodic replays (at most every CHECK_EVERY_SECONDS; the live
        jobs are read only then)."""
        now = self.clock()
        if now < self._next:
            return
        self._next = now + CHECK_EVERY_SECONDS
        live = read_live()
        asking = [j for j in live if j.spec.verify is not None and j.spec.replay is None and j.state is JobState.RUNNING]
        self._seen = {j.id: self._seen.get(j.id, _Seen()) for j in asking}
        idle: list[int] | None = None
        # A job waiting in the queue (not held) comes first: no replay is queued in front of it.
        queue_waits = any(j.state is JobState.QUEUED and j.held is None for j in live)
        for job in asking:
            seen = self._seen[job.id]
            beat = attempt_files.read_heartbeat(heartbeat_path(self.cfg.run_dir, job))
            step = beat.last_checkpoint_step if beat is not None else None
            if step is not None and step != seen.newest:
                seen.newest, seen.since = step, seen.since + 1
            assert job.spec.verify is not None
            if seen.since < job.spec.verify.every_checkpoints or queue_waits or self._replaying(seen):
                continue
            idle = idle_gpus(live) if idle is None else idle
            if len(idle) < job.spec.gpu_count:
                continue
            gpus, idle = idle[:job.spec.gpu_count], idle[job.spec.gpu_count:]
            self._queue(job, seen, gpus)

    def _replaying(self, seen: _Seen) -> bool:
        if seen.replay is None:
            return False
        row = self.store.jobs.by_name(seen.replay)
        return row is not None and not row.state.terminal

    def _queue(self, job: JobRow, seen: _Seen, gpus: list[int]) -> None:
        name = free_name(self.store, job.name)
        if name is None:
            return
        text = yaml.safe_dump(replay_doc(name, job.spec, seen.covered, gpus or None, LOWEST_PRIORITY), sort_keys=False)
        spec = parse_spec(text)
        copy = accepted_copy.keep(self.jobs_dir, name, job.owner_uid, text)  # as intake keeps a spool file
        self.store.jobs.add(spec, job.owner_uid, job.owner, str(copy), time.time(),
                            event=f"a periodic replay of {job.name} (verify.every_checkpoints: "
                                  f"{job.spec.verify.every_checkpoints if job.spec.verify else '?'})")
        log.info("replay_queued", job=job.name, attempt=None, replay=name, from_step=seen.covered, gpus=gpus)
        seen.since, seen.covered, seen.replay = 0, seen.newest, name
