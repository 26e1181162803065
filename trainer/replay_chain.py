"""The replay record of a checkpoint, the chain of them a verification replays, and the comparison.

Every checkpoint spx.trainer publishes holds `replay.json`: the interval of steps that led to it
(`from_step`, the checkpoint its process resumed from or last saved, None: from scratch), each of
those steps' loss and gradient norms, and the hash of the model state saved. Resume is bitwise
exact, so the same steps trained again from `from_step` must give the same numbers; a GPU that
computed wrong ones makes them differ, and the per-rank gradient norms (taken before the
all-reduce) say on which rank they first did. Stdlib only: what it reads is JSON.

A record's `steps` are `[step, loss, grad_norm, [each rank's own grad norm] or None]`, floats or,
for NaN/±Inf, the strings `metric_json` writes; compared bit for bit (a float read back from JSON is
the float written).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from spx.daemon.contract.checkpoint_layout import complete_checkpoints, step_dirname
from spx.daemon.contract.worker_env import ReplayVerdict, metric_json

RECORD = "replay.json"
RECORD_VERSION = 1
MAX_RECORD_STEPS = 100_000
"""A record keeps at most this many steps (the last ones; `from_step` then says where they begin)."""
MAX_RECORD_BYTES = 512 << 20

StepValues = list  # [step, loss, grad_norm, per-rank norms or None]


@dataclass(frozen=True)
class Record:
    """One checkpoint's replay record (see the module docstring)."""

    step: int
    from_step: int | None
    world_size: int
    steps: tuple[StepValues, ...]
    state_sha256: str

    def to_doc(self) -> dict:
        return {"version": RECORD_VERSION, "from_step": self.from_step, "step": self.step,
                "world_size": self.world_size, "steps": list(self.steps), "state_sha256": self.state_sha256}


def read_record(ckpt: Path) -> Record | None:
    """The record in checkpoint dir `ckpt`, None if it has none (an older trainer, a JIT checkpoint) or
    one that does not hold together (its step is not the dir's, steps outside its interval)."""
    try:
        with open(ckpt / RECORD, "rb") as f:
            data = f.read(MAX_RECORD_BYTES + 1)
        if len(data) > MAX_RECORD_BYTES:
            return None
        doc = json.loads(data)
        step, start = int(doc["step"]), doc["from_step"]
        start = None if start is None else int(start)
        steps = tuple(doc["steps"])
        floor = start or 0
        if ckpt.name != step_dirname(step) or (start is not None and not 0 <= start < step) or \
                len(steps) > MAX_RECORD_STEPS:
            return None
        numbers = [int(s[0]) for s in steps]
        if numbers != sorted(set(numbers)) or (numbers and not floor < numbers[0] <= numbers[-1] <= step):
            return None
        return Record(step, start, int(doc["world_size"]), steps, str(doc["state_sha256"]))
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None


@dataclass(frozen=True)
class Link:
    """One interval of the chain: the checkpoint at `path`, its record."""

    path: Path
    record: Record


@dataclass(frozen=True)
class Chain:
    """What a replay trains: resume from `start` (step `start_step`; both None: from scratch), then
    check each link's checkpoint in turn (oldest first). No links: nothing to replay (`reason`)."""

    start: Path | None
    start_step: int | None
    links: tuple[Link, ...]
    reason: str | None = None

    @property
    def end_step(self) -> int | None:
        return self.links[-1].record.step if self.links else None


def replay_chain(ckpt_dir: Path, since: int | None) -> Chain:
    """The chain that ends at the newest complete checkpoint with a record and reaches back, following
    each record's `from_step`, until an interval starts at or before step `since` (None: as far as it
    goes). It ends early where a link names a checkpoint that is gone (that interval cannot be replayed:
    the chain starts after it) or one without a record (the replay resumes from it)."""
    complete = {ref.step: ref.path for ref in complete_checkpoints(ckpt_dir) if ref.step is not None}
    newest = next(((step, rec) for step in sorted(complete, reverse=True)
                   if (rec := read_record(complete[step])) is not None), None)
    if newest is None:
        return Chain(None, None, (), f"no complete checkpoint in {ckpt_dir} has a replay record ({RECORD})")
    links = [Link(complete[newest[0]], newest[1])]
    while True:
        start = links[0].record.from_step
        if start is None:
            return Chain(None, None, tuple(links))
        if start not in complete:
            if len(links) == 1:
                return Chain(None, None, (), f"checkpoint {start}, where the interval of checkpoint "
                             f"{links[0].record.step} begins, is no longer on disk")
            dropped = links.pop(0)
            return Chain(dropped.path, dropped.record.step, tuple(links))
        earlier = read_record(complete[start])
        if (since is not None and start <= since) or earlier is None:
            return Chain(complete[start], start, tuple(links))
        links.insert(0, Link(complete[start], earlier))


@dataclass(frozen=True)
class Difference:
    """The first value of a replay that is not the record's."""

    step: int
    metric: str
    expected: float | str | None
    got: float | str | None
    rank: int | None = None


def _same(expected: object, got: float | None) -> bool:
    """Bitwise: the replayed float as JSON holds it equals the recorded one (NaN equals "NaN")."""
    shown = metric_json(got)
    if isinstance(shown, float) and isinstance(expected, float):
        return shown == expected and math.copysign(1.0, shown) == math.copysign(1.0, expected)
    return shown == expected


def first_difference(record: Record, replayed: Sequence[StepValues], state_sha256: str | None) -> Difference | None:
    """Step by step in order: the step numbers, then at each step its loss, every rank's own gradient
    norm (rank order: it names the first rank that differs), the global gradient norm; last, the hash of
    the state at the record's step. None: all equal."""
    expected_steps = [int(s[0]) for s in record.steps]
    got_steps = [int(s[0]) for s in replayed]
    for want, got in zip(record.steps, replayed, strict=False):
        step = int(want[0])
        if int(got[0]) != step:
            break
        if not _same(want[1], got[1]):
            return Difference(step, "loss", want[1], metric_json(got[1]))
        if want[3] is not None and got[3] is not None:
            for rank, (w, g) in enumerate(zip(want[3], got[3], strict=False)):
                if not _same(w, g):
                    return Difference(step, "rank_grad_norm", w, metric_json(g), rank)
        if not _same(want[2], got[2]):
            return Difference(step, "grad_norm", want[2], metric_json(got[2]))
    if expected_steps != got_steps:
        return Difference(record.step, "steps", _span(expected_steps), _span(got_steps))
    if state_sha256 != record.state_sha256:
        return Difference(record.step, "state_sha256", record.state_sha256, state_sha256)
    return None


def _span(steps: list[int]) -> str:
    return f"{len(steps)} steps {steps[0]}-{steps[-1]}" if steps else "no steps"


def verdict(chain: Chain, verified: list[tuple[int, int]], diff: Difference | None, reason: str | None = None
            ) -> ReplayVerdict:
    """The heartbeat's verdict: `verified` intervals so far, and the difference that stopped it, if any."""
    if not chain.links:
        return ReplayVerdict(None, None, None, reason=chain.reason)
    if diff is None and reason is not None:
        return ReplayVerdict(chain.start_step, chain.end_step, None, tuple(verified), reason=reason)
    if diff is None:
        return ReplayVerdict(chain.start_step, chain.end_step, True, tuple(verified))
    return ReplayVerdict(chain.start_step, chain.end_step, False, tuple(verified), step=diff.step, metric=diff.metric,
                         rank=diff.rank, expected=_plain(diff.expected), got=_plain(diff.got), reason=reason)


def _plain(value: object) -> float | str | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return value if isinstance(value, str) or value is None else str(value)
