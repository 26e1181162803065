"""A job across hosts, the executor's side: the machine's BeatGang and AgreeGeneration done in the
shared checkpoint dir as the job's owner (run/gang.py), in the owner's lane (run/user_work.py) — a
slow shared volume delays only that job's answers. Keeps every host's line, as the last beat read
it, for `spx status`."""

from __future__ import annotations

import time
from collections.abc import Callable

from spx.daemon.core.config import DaemonConfig
from spx.daemon.core.lanes import Outcome
from spx.daemon.lifecycle.across_hosts import AGREE_DEADLINE_SECONDS
from spx.daemon.lifecycle.actions import AgreeGeneration, BeatGang
from spx.daemon.lifecycle.observations import ActionFailed, GangSeen, GenerationAgreed, Observation
from spx.daemon.run import gang
from spx.daemon.run.user_work import UserWork
from spx.daemon.state.jobs_table import JobRow

# A beat's answer comes back by then (its calls have their own timeout), or it is a failed beat.
BEAT_DEADLINE_SECONDS = gang.CALL_TIMEOUT_SECONDS + 5.0


class GangLink:
    def __init__(self, cfg: DaemonConfig, work: UserWork, wall: Callable[[], float] = time.time):
        self.cfg = cfg
        self.work = work
        self.wall = wall
        self.hosts: dict[int, list[dict]] = {}  # job across hosts → every host's line, as last read (spx status)

    def agree(self, job: JobRow, a: AgreeGeneration) -> None:
        """Tell the other hosts this share's attempt ended (and begin the next generation with its
        decision, unless another host did first)."""
        cfg, ckpt_dir = self.cfg, str(job.spec.checkpoint_dir(self.cfg.checkpoints_root))
        generation = a.generation if a.generation is not None else 0

        def done(outcome: Outcome) -> Observation:
            if not outcome.ok:
                return ActionFailed(a, str(outcome.error))
            won, turn = outcome.value
            return GenerationAgreed(a.number, won, turn)

        self.work.submit(job, "gang agree", lambda: gang.advance(cfg, job, ckpt_dir, generation, a.bump, a.step),
                         AGREE_DEADLINE_SECONDS + 5.0, done, action=a)

    def beat(self, job: JobRow, a: BeatGang) -> None:
        """This host's share runs in its generation; comes back as GangSeen with the generation now
        and whether a host is gone past nodes.host_timeout_seconds."""
        cfg, ckpt_dir, nodes = self.cfg, str(job.spec.checkpoint_dir(self.cfg.checkpoints_root)), job.spec.nodes

        def done(outcome: Outcome) -> Observation:
            if not outcome.ok:
                return ActionFailed(a, str(outcome.error))
            turn, hosts = outcome.value
            self.hosts[job.id] = hosts
            if turn is None:
                return GangSeen(None)
            gone = gang.missing(hosts, gang.me(cfg).label, nodes.count, nodes.host_timeout_seconds, self.wall(),
                                a.since_wall)
            return GangSeen(turn, gone)

        self.work.submit(job, "gang beat", lambda: gang.beat(cfg, job, ckpt_dir, a.generation, a.step),
                         BEAT_DEADLINE_SECONDS, done)

    def forget(self, job_id: int) -> None:
        self.hosts.pop(job_id, None)
