"""FindCheckpoint: an attempt's files made and its checkpoint found, as the job's user, in the
owner's lane (run/user_work.py) — the user's volume may be slow or hung, and a user's stalls cost
only their own slots. For a job across hosts the attempt first joins its generation (run/gang.py);
the checkpoint the machine says to avoid (the crash-loop fallback) is passed over where discovery
can, and after a divergence every checkpoint at or after its step (the rollback, said in the answer). Where the machine asks, the attempt's launcher starts meanwhile (standby_pool.py), so its
imports overlap the search. The answer, on the loop: CheckpointFound, LeaseLost (another host took
the job's lease while this one could not renew: it runs the job now), or ActionFailed.

Its calls as the user share one as-user process (a session), released at the end of the search.
"""

from __future__ import annotations

from dataclasses import dataclass

from spx.daemon.contract.checkpoint_layout import CheckpointRef
from spx.daemon.core.config import DaemonConfig
from spx.daemon.core.lanes import Outcome
from spx.daemon.lifecycle.actions import FindCheckpoint
from spx.daemon.lifecycle.observations import ActionFailed, CheckpointFound, LeaseLost, Observation
from spx.daemon.lifecycle.record import TrackedJob
from spx.daemon.lifecycle.resume_fallback import fell_back
from spx.daemon.lifecycle.starting import CHECKPOINT_DEADLINE_SECONDS
from spx.daemon.run import attempt_files, checkpoint_report, gang, timeline
from spx.daemon.run.attempt_runtime import AttemptRuntime
from spx.daemon.run.standby_pool import StandbyPool
from spx.daemon.run.user_work import UserWork
from spx.daemon.state.jobs_table import JobRow
from spx.daemon.userfs import as_user

CHECKPOINT_TIMEOUT_SECONDS = 90.0   # discovery's own, below the machine's deadline
# Across hosts, how long a relaunch waits for the other hosts to leave the last generation (their
# agent may still serve its store); within the machine's deadline with discovery's timeout.
GANG_JOIN_WAIT_SECONDS = 25.0
# The lane answers overdue after the machine's deadline has passed (its message is the job's reason).
_LANE_DEADLINE_SECONDS = CHECKPOINT_DEADLINE_SECONDS + 5.0


@dataclass
class AttemptPrep:
    cfg: DaemonConfig
    runtime: AttemptRuntime
    pool: StandbyPool
    work: UserWork
    recorder: timeline.Recorder

    def find_checkpoint(self, job: JobRow, s: TrackedJob, a: FindCheckpoint) -> list[Observation]:
        cfg = self.cfg
        self.recorder.before_spawn(job.id, "placed")
        if a.standby:  # the launcher imports while the checkpoint is looked for
            self.pool.start(job, s.ledger.gpus, a.number)
        avoid = a.avoid

        def find() -> tuple[attempt_files.AttemptFiles | None, CheckpointRef | None, dict, gang.Joined | None,
                            Observation | None]:
            user = as_user.owner(job.owner_uid)  # the error of an owner gone is the attempt's reason
            try:
                return search()
            finally:
                as_user.release(user)

        def search() -> tuple[attempt_files.AttemptFiles | None, CheckpointRef | None, dict, gang.Joined | None,
                              Observation | None]:
            try:
                files = attempt_files.prepare(cfg, job, a.number)
            except attempt_files.LeaseTaken as e:  # adopted by another host: it runs the job now
                return None, None, {}, None, LeaseLost(e.holder)
            joined = None
            if a.join:
                # Across hosts: the round this attempt joins, once no host runs in an older one.
                joined = gang.join(cfg, job, str(files.checkpoint_dir), a.generation, GANG_JOIN_WAIT_SECONDS)
                if joined.final is not None:
                    return files, None, {}, None, CheckpointFound(None, None, a.number, final=joined.final)
            if job.spec.replay is not None:  # the replay finds its own start in the chain (SPX_REPLAY)
                return files, None, {"replay": f"replays the checkpoints of {job.spec.replay.of}"}, None, None
            wrong = (attempt_files.set_aside_wrong(job, files, a.rollback.step, CHECKPOINT_TIMEOUT_SECONDS)
                     if a.rollback is not None and a.rollback.sets_aside else [])
            ref, found = attempt_files.latest_checkpoint(job, files, CHECKPOINT_TIMEOUT_SECONDS,
                                                         {avoid.path: avoid.why} if avoid else None,
                                                         a.rollback.step if a.rollback else None)
            if avoid is not None and fell_back(avoid, found):
                found = {**found, "fallback_from": avoid.path, "fallback_why": avoid.why}
            if a.rollback is not None:
                found = {**found, "rollback": a.rollback.describe(ref.step if ref else None, ref is not None)}
            if wrong:
                found = {**found, "set_aside": wrong[:20]}
            if joined is not None:
                found = {**found, "generation": joined.gen, "join_waited_seconds": joined.waited,
                         "join_waited_for": joined.waited_for}
            return files, ref, found, joined, None

        def done(outcome: Outcome) -> Observation:
            if not outcome.ok:
                return ActionFailed(a, str(outcome.error))
            files, ref, found, joined, ended = outcome.value
            if ended is not None or files is None:
                return ended
            if joined is not None:
                self.recorder.before_spawn(job.id, "joined", joined.at)
            self.recorder.before_spawn(job.id, "checkpoint_found")
            self.runtime.prepared(job, a.number, files, found)
            checkpoint_report.say(job.name, a.number, files, ref, found)
            return CheckpointFound(str(ref.path) if ref else None, ref.step if ref else None, a.number,
                                   generation=joined.gen if joined is not None else None,
                                   fell_back=bool(found.get("fallback_from")))

        self.work.submit(job, "checkpoint discovery", find, _LANE_DEADLINE_SECONDS, done, action=a)
        return []
