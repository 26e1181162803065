"""A replay job's verdict, taken to the job it verified (`spx verify`; docs/verify.md).

When a replay job ends (lifecycle: RecordVerdict), its last heartbeat's verdict is stored on the job it
verified — the owner's latest job of that name submitted before the replay — with the GPUs the replay
ran on and the GPUs that trained the step the first time. When it differs:

- the GPU that trained the differing step gets a strike (`gpu_suspects`): the one of the rank whose own
  gradient differed (rank r of the job ran on its r-th GPU: gpu/straggler.py `rank_gpu`); when the
  replay could not tell the rank (the loss, the averaged gradient, the model hash differed), no GPU is
  struck, the job's GPUs are named. A GPU with strikes from `SUSPECT_OWNERS` different owners is
  quarantined (never allocated until an operator releases it): a replay is the user's own run, and
  one user must not be able to take a GPU from everyone else by forging verdicts;
- the job is rolled back (lifecycle: ReplayDiffered): its attempt is killed if one runs, and the next
  one resumes from the newest checkpoint before the step, the later ones set aside.

A verdict is only believed of a replay that read that job's checkpoints (its `checkpoints.dir`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from spx.daemon.contract.replay_verdict import ReplayVerdict
from spx.daemon.core.log import get_logger
from spx.daemon.gpu.straggler import rank_gpu
from spx.daemon.lifecycle.actions import RecordVerdict
from spx.daemon.lifecycle.observations import Observation, ReplayDiffered
from spx.daemon.lifecycle.record import TrackedJob
from spx.daemon.state.jobs_table import JobRow
from spx.daemon.state.store import Store
from spx.daemon.state.verifications_table import Strike

log = get_logger()

SUSPECT_OWNERS = 2


class Verifications:
    """Records verdicts (on the main loop); what the verified jobs must hear waits in `results`."""

    def __init__(self, store: Store, quarantine: Callable[[int, str], None], wall: Callable[[], float] = time.time) -> None:
        self.store = store
        self.quarantine = quarantine  # the GPU gate's (service wires it): never allocated until released
        self.wall = wall
        self._told: list[tuple[int, Observation]] = []

    def record(self, job: JobRow, s: TrackedJob, a: RecordVerdict) -> None:
        source = self.store.jobs.latest_named_before(a.of, job.id, job.owner_uid)
        if source is None:
            log.warning("verdict_unused", job=job.name, attempt=a.number, why=f"no earlier job named {a.of} of its owner")
            return
        if source.spec.checkpoints.dir != job.spec.checkpoints.dir:
            log.warning("verdict_unused", job=job.name, attempt=a.number,
                        why=f"it did not read the checkpoints of {a.of} ({source.spec.checkpoints.dir})")
            return
        v = a.verdict
        now = self.wall()
        trained_on = list(source.gpus)
        suspect = _suspect(v, trained_on)
        text = (v.describe() if v is not None else f"not verified: the replay ended without a verdict ({a.reason})")
        if suspect is not None:
            text += f"; GPU {suspect} suspect"
        doc = {"text": text, "replay": job.name, "replay_gpus": list(s.ledger.gpus), "trained_on": trained_on,
               "suspect": suspect, "verdict": v.to_doc() if v is not None else None}
        strikes = [Strike(suspect, job.owner_uid, source.name, v.step if v else None, now, text)] if suspect is not None else []
        self.store.verifications.add(source.id, job.id, now, v.verified if v is not None else None, doc, strikes)
        level = "error" if v is not None and v.verified is False else "info"
        getattr(log, level)("verdict", job=source.name, attempt=None, replay=job.name, detail=text, suspect=suspect)
        if suspect is not None:
            self._quarantine_if_agreed(suspect)
        if v is not None and v.verified is False and v.step is not None:
            self._told.append((source.id, ReplayDiffered(v.step, v.difference())))

    def results(self) -> list[tuple[int, Observation]]:
        """What the verified jobs must hear (a replay differed), once."""
        told, self._told = self._told, []
        return told

    def _quarantine_if_agreed(self, gpu: int) -> None:
        owners = {s.owner_uid for s in self.store.verifications.strikes().get(gpu, [])}
        if len(owners) >= SUSPECT_OWNERS:
            self.quarantine(gpu, f"replays of {len(owners)} owners' jobs found it computing wrong numbers "
                                 "(spx gpus shows the strikes)")


def _suspect(v: ReplayVerdict | None, trained_on: list[int]) -> int | None:
    """The GPU of the rank whose own gradient differed; None when no rank is named."""
    if v is None or v.verified is not False or v.metric != "rank_grad_norm" or v.rank is None:
        return None
    return rank_gpu(v.rank, trained_on)
