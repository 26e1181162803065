"""The verdict of a verification replay (SPX_REPLAY), carried in the replay's last heartbeat: which
checkpoint intervals trained again bit for bit, and where the first difference was. Written by
spx.trainer (trainer/replay.py), read by the daemon through `worker_env.load_heartbeat`; each field is
bounded there, and an odd verdict costs only itself, never the beat. Stdlib only (with core.bounded)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from spx.daemon.contract.metrics import NON_FINITE_WORDS, metric_json, parse_metric
from spx.daemon.core import bounded

MAX_RANKS = 1024  # worker_env.MAX_RANKS_REPORTED: the ranks a beat can name
MAX_REPLAY_INTERVALS = 1000  # worker_env.MAX_CHECKPOINT_KEEP: a chain is at most the checkpoints kept
REPLAY_METRICS = ("loss", "grad_norm", "rank_grad_norm", "state_sha256", "steps")
MAX_REPLAY_TEXT = 400
Compared = float | str | None
"""A compared value as the verdict carries it: a float (NaN/±Inf included), a text (a hash, a list of
steps), or None (absent)."""


@dataclass(frozen=True)
class ReplayVerdict:
    """What a verification replay (SPX_REPLAY) found, replaying from checkpoint `from_step` (None: from
    scratch) to checkpoint `to_step`. `verified`: True, every interval's steps and state hash equal
    the records bit for bit; False, a difference (the first: at `step`, `metric` — one of
    REPLAY_METRICS: "rank_grad_norm" names the `rank` whose own gradient norm, before the all-reduce,
    differed first — was `got` in the replay where the checkpoint's record says `expected`); None,
    nothing could be compared (`reason` says why). `intervals` are the [start, end] step pairs
    verified (start 0: from scratch), oldest first."""

    from_step: int | None
    to_step: int | None
    verified: bool | None
    intervals: tuple[tuple[int, int], ...] = ()
    step: int | None = None
    metric: str | None = None
    rank: int | None = None
    expected: Compared = None
    got: Compared = None
    reason: str | None = None

    def to_doc(self) -> dict:
        doc = asdict(self)
        doc["intervals"] = [list(i) for i in self.intervals]
        for key in ("expected", "got"):
            value = doc[key]
            doc[key] = metric_json(value) if isinstance(value, float) else value
        return doc

    def difference(self) -> str:
        """The first difference in words: "rank 1's gradient norm 0.8312, recorded 0.8311"."""
        if self.metric == "rank_grad_norm":
            what = f"rank {self.rank}'s gradient norm" if self.rank is not None else "a rank's gradient norm"
        else:
            what = _WORDS.get(self.metric or "", self.metric or "a number")
        return f"{what} {_shown(self.got)}, recorded {_shown(self.expected)}"

    def describe(self) -> str:
        """One line for `spx status` and the logs: what was verified, or where it first differs, or why
        nothing was."""
        if self.verified is None:
            return f"not verified: {self.reason or 'nothing to replay'}"
        verified = (f"checkpoints {self.intervals[0][1]}–{self.intervals[-1][1]} verified"
                    if self.intervals else "no checkpoint verified")
        if self.verified:
            return f"{verified} (replayed steps {self.from_step or 0}–{self.to_step})"
        return f"differs at step {self.step}: {self.difference()}; {verified} before it"


_WORDS = {"loss": "loss", "grad_norm": "gradient norm", "state_sha256": "model hash", "steps": "steps trained"}


def _shown(value: Compared) -> str:
    """A compared value as a person reads it: a float in full (a difference may be in its last digit)."""
    if isinstance(value, float):
        shown = metric_json(value)
        return repr(shown) if isinstance(shown, float) else str(shown)
    return "nothing" if value is None else str(value)


def parse_replay_verdict(raw: object) -> ReplayVerdict | None:
    """The verdict of a replay, each field bounded; anything odd drops the verdict, never the beat."""
    if not isinstance(raw, dict):
        return None
    f = bounded.Fields(raw, "heartbeat", "replay.")
    try:
        verified = raw.get("verified")
        if verified is not None and not isinstance(verified, bool):
            return None
        metric = f.text("metric", 32, missing=None)
        if metric is not None and metric not in REPLAY_METRICS:
            return None
        intervals = []
        for raw_pair in f.items("intervals", MAX_REPLAY_INTERVALS, missing=[]):
            pair = bounded.items(raw_pair, "heartbeat", 2, name="replay.intervals")
            if len(pair) != 2:
                return None
            first = bounded.whole(pair[0], "heartbeat", name="replay.intervals")
            intervals.append((first, bounded.whole(pair[1], "heartbeat", first + 1, name="replay.intervals")))
        return ReplayVerdict(
            from_step=f.whole("from_step", missing=None), to_step=f.whole("to_step", missing=None),
            verified=verified, intervals=tuple(intervals), step=f.whole("step", missing=None), metric=metric,
            rank=f.whole("rank", 0, MAX_RANKS - 1, missing=None),
            expected=_compared(raw.get("expected")), got=_compared(raw.get("got")),
            reason=f.text("reason", MAX_REPLAY_TEXT, missing=None))
    except (bounded.Garbage, TypeError, ValueError):
        return None


def _compared(raw: object) -> Compared:
    """An expected/got value: a bounded metric (NaN/±Inf spelled as `metric_json` does), else a short
    text (a hash), else None."""
    if isinstance(raw, str) and raw not in NON_FINITE_WORDS:
        return raw[:MAX_REPLAY_TEXT]
    return parse_metric(raw)
