"""A verification replay (SPX_REPLAY): train a chain of checkpoint intervals again and compare.

The daemon launches a job's script again with SPX_REPLAY set, usually on other GPUs, to find out
whether the GPUs that trained it computed right. Rank 0 plans from the records in the checkpoint
dir (`replay_chain.replay_chain`): resume from the chain's start, train to its end, and at each
checkpoint of the chain compare the interval's per-step values and the state hash with the
checkpoint's record; the first difference ends the replay. The steps a record lacks (a rollback
skipped their data) are skipped again. Every rank learns the plan's step numbers (a broadcast) so
that all stop at the same step; only rank 0 holds the records and judges.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from spx.daemon.contract.worker_env import ReplayVerdict, StepRanges, merge_step_ranges
from spx.trainer.replay_chain import Chain, Difference, StepValues, first_difference, replay_chain, verdict

log = logging.getLogger("spx.trainer")


@dataclass(frozen=True)
class ReplayPlan:
    """What every rank needs to replay: where to resume (None: from scratch), the checkpoint steps to
    compare at (none: nothing to replay), and the steps whose data the records skipped."""

    start: str | None
    checkpoint_steps: tuple[int, ...]
    skip_steps: StepRanges


def skipped_by_records(chain: Chain) -> StepRanges:
    """The steps of the chain's intervals that their records lack: trained by nobody (a rollback)."""
    gaps = []
    for link in chain.links:
        recorded = {int(s[0]) for s in link.record.steps}
        gaps += [(n, n) for n in range((link.record.from_step or 0) + 1, link.record.step + 1) if n not in recorded]
    return merge_step_ranges(gaps)


class Replay:
    """This run's replay: its plan (every rank) and, on rank 0, the chain and what was found so far."""

    def __init__(self, since: int | None) -> None:
        self.since = since
        self.done = False
        self.start: str | None = None
        self.checkpoint_steps: frozenset[int] = frozenset()
        self.end_step = 0
        self.skip_steps: StepRanges = ()
        self._chain: Chain | None = None
        self._verified: list[tuple[int, int]] = []
        self._difference: Difference | None = None
        self._reason: str | None = None

    def plan(self, ckpt_dir: Path, world_size: int) -> ReplayPlan:
        """Rank 0: the chain reaching back to `since`, as the plan every rank follows."""
        chain = replay_chain(ckpt_dir, self.since)
        odd = [link.record.step for link in chain.links if link.record.world_size != world_size]
        if odd:
            chain = Chain(None, None, (), f"checkpoint {odd[0]} was trained by "
                          f"{chain.links[0].record.world_size} ranks, this replay runs on {world_size}: "
                          "only the same world size replays bit for bit")
        self._chain = chain
        start = None if chain.start is None else str(chain.start)
        return ReplayPlan(start, tuple(link.record.step for link in chain.links), skipped_by_records(chain))

    def adopt(self, plan: ReplayPlan) -> None:
        self.start, self.skip_steps = plan.start, plan.skip_steps
        self.checkpoint_steps = frozenset(plan.checkpoint_steps)
        self.end_step = max(plan.checkpoint_steps, default=0)
        self.done = not plan.checkpoint_steps

    def check(self, step: int, steps: list[StepValues], state_sha256: str | None) -> bool:
        """Rank 0, at checkpoint `step` of the chain: compare; True when the replay ends here."""
        assert self._chain is not None
        link = next(link for link in self._chain.links if link.record.step == step)
        self._difference = first_difference(link.record, steps, state_sha256)
        if self._difference is None:
            self._verified.append((link.record.from_step or 0, step))
            log.info("replay: steps %d-%d equal checkpoint %d's record, state hash included",
                     (link.record.from_step or 0) + 1, step, step)
        return self._difference is not None or step == self.end_step

    def stopped(self, step: int) -> None:
        """Every rank: SIGTERM ended the replay at `step` before its end."""
        self._reason = f"stopped by SIGTERM at step {step}, before checkpoint {self.end_step}"
        self.done = True

    def verdict(self) -> ReplayVerdict:
        """Rank 0: what the replay found."""
        assert self._chain is not None
        return verdict(self._chain, self._verified, self._difference, self._reason)
