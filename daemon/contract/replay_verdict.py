"""A replay's verdict, as its last heartbeat carries it (`replay`): which checkpoint intervals a
verification run (SPX_REPLAY) trained again, and whether every step's numbers came out the same.

    {"from_step": 0, "to_step": 40, "verified": false, "intervals": [[0, 10], [10, 20]],
     "step": 25, "metric": "rank_grad_norm", "rank": 1, "expected": "0.8311", "got": "0.8312",
     "reason": null}

`verified` is true (every interval from `from_step` to `to_step` gave the same numbers, bitwise, and
the same model hash at each checkpoint), false (the first difference: `step`, which `metric` —
"loss", "grad_norm", "rank_grad_norm" (then `rank`: whose own gradient before the all-reduce) or
"state_sha256" — what the checkpoint recorded, `expected`, and what the replay computed, `got`) or
null (nothing could be replayed: `reason`). `intervals` are the ones verified, (start, end) steps.

The daemon reads it from a file the job's user writes: every field is bounded, and an odd one costs
only the verdict (None), never the beat. Stdlib only (spx.trainer writes it).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from spx.daemon.core import bounded

METRICS = ("loss", "grad_norm", "rank_grad_norm", "state_sha256")
MAX_INTERVALS = 1000
MAX_VALUE_CHARS = 80
MAX_REASON_CHARS = 300
_WORDS = {"loss": "loss", "grad_norm": "gradient norm", "state_sha256": "model hash"}


@dataclass(frozen=True)
class ReplayVerdict:
    from_step: int | None
    to_step: int | None
    verified: bool | None
    intervals: tuple[tuple[int, int], ...] = ()
    step: int | None = None
    metric: str | None = None
    rank: int | None = None
    expected: str | None = None
    got: str | None = None
    reason: str | None = None

    def to_json(self) -> dict:
        doc = asdict(self)
        doc["intervals"] = [list(i) for i in self.intervals]
        return doc

    def difference(self) -> str:
        """The first difference in words: "rank 1's gradient norm 0.8312, recorded 0.8311"."""
        if self.metric == "rank_grad_norm":
            what = f"rank {self.rank}'s gradient norm" if self.rank is not None else "a rank's gradient norm"
        else:
            what = _WORDS.get(self.metric or "", self.metric or "a number")
        return f"{what} {self.got}, recorded {self.expected}"

    def describe(self) -> str:
        """One line for `spx status`: what was verified, or where it first differs, or why nothing was."""
        if self.verified is None:
            return f"not verified: {self.reason or 'nothing to replay'}"
        verified = (f"checkpoints {self.intervals[0][1]}–{self.intervals[-1][1]} verified"
                    if self.intervals else "no checkpoint verified")
        if self.verified:
            return f"{verified} (replayed steps {self.from_step or 0}–{self.to_step})"
        return f"differs at step {self.step}: {self.difference()}; {verified} before it"


def parse_verdict(raw: object) -> ReplayVerdict | None:
    """The heartbeat's `replay` field, bounded; None for anything that is not a verdict."""
    if not isinstance(raw, dict):
        return None
    f = bounded.Fields(raw, "heartbeat", "replay.")
    try:
        verified = raw.get("verified")
        if verified is not None and not isinstance(verified, bool):
            return None
        intervals = tuple(_interval(i) for i in f.items("intervals", MAX_INTERVALS, missing=[]))
        metric = f.text("metric", 32, missing=None)
        if metric is not None and metric not in METRICS:
            return None
        return ReplayVerdict(
            from_step=f.whole("from_step", missing=None), to_step=f.whole("to_step", missing=None), verified=verified,
            intervals=intervals, step=f.whole("step", missing=None), metric=metric,
            rank=f.whole("rank", 0, 1 << 20, missing=None), expected=_value(raw.get("expected")),
            got=_value(raw.get("got")), reason=f.text("reason", MAX_REASON_CHARS, missing=None))
    except bounded.Garbage:
        return None


def _interval(raw: object) -> tuple[int, int]:
    pair = bounded.items(raw, "heartbeat", 2, name="replay.intervals[]")
    if len(pair) != 2:
        raise bounded.Garbage("heartbeat", "replay.intervals: an interval is [start, end]")
    return bounded.whole(pair[0], "heartbeat"), bounded.whole(pair[1], "heartbeat")


def _value(raw: object) -> str | None:
    """A recorded or replayed value, as text (a float's repr, a hash): shown, never computed with."""
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise bounded.Garbage("heartbeat", "replay: a value is a number or text")
    return (raw if isinstance(raw, str) else repr(raw))[:MAX_VALUE_CHARS]
