"""What an attempt's heartbeats said about its progress, kept in its store row (`attempts.progress`):
the smallest record from which the goodput ledger (`goodput.py`) tells kept from recomputed time
exactly.

- `first`: (time, step) of the attempt's first heartbeat — where its restore ends and training begins;
- `last`: (time, step) of the last heartbeat whose step moved — where its progress ended (a hang or a
  crash begins after it);
- `saves`: the checkpoints it published, (step, time), the newest `SAVES_KEPT` — the next attempt
  resumes from one of them, and that save's time is where this attempt's kept work ends;
- `kept`: (time, stall): how far its training is known kept while it runs — when it reached the step
  of its newest checkpoint — and how many seconds of that its loop waited on saves, as the trainer
  reports them (0 for a script that reports none). Both only grow, and the stall never by more than
  the time gained (`seen`), so the ledger's settled `productive` and `checkpoint` seconds (time up
  to `kept` less its stall, and the stall) never go down. A save after the last progress (a stop's
  save of the last step, or a periodic one not yet followed by a step) keeps the training up to the
  last progress; its stall is not counted here: the ledger counts the time after the last progress
  as that save's (`checkpoint`), and a later save's report, cumulative, carries it on if training
  went on.

Built by `seen` from the heartbeats' fields (already bounded by the contract's parser), one beat at a
time; pure and stdlib-only, so the recorder (run/progress_log.py) and the readers share it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

# A resume goes back to one of the newest checkpoints (the crash-loop fallback passes over one);
# older saves are kept only as bounds of the interpolation (goodput.kept_until).
SAVES_KEPT = 16


@dataclass(frozen=True)
class Progress:
    first: tuple[float, int] | None = None
    last: tuple[float, int] | None = None
    saves: tuple[tuple[int, float], ...] = ()
    kept: tuple[float, float] | None = None

    def seen(self, step: int, time: float, ckpt_step: int | None, ckpt_time: float | None,
             stall: float | None, since: float) -> Progress:
        """This record after a heartbeat (step, time, its last checkpoint, its reported stall) of the
        attempt that began at `since`: a beat or a checkpoint from before it is the previous
        attempt's and is not this one's."""
        if time < since:
            return self
        first = self.first or (time, step)
        last = self.last if self.last is not None and self.last[1] == step else (time, step)
        saves, kept = self.saves, self.kept
        if (ckpt_step is not None and ckpt_time is not None and ckpt_time >= since
                and all(s != ckpt_step for s, _ in saves)):
            saves = (*saves, (ckpt_step, ckpt_time))[-SAVES_KEPT:]
            kept = _kept_after(kept or (first[0], 0.0), ckpt_step, ckpt_time, last, stall or 0.0)
        return Progress(first, last, saves, kept)

    def to_json(self) -> str:
        return json.dumps({"first": self.first, "last": self.last, "saves": self.saves, "kept": self.kept})


def _kept_after(kept: tuple[float, float], ckpt_step: int, ckpt_time: float, last: tuple[float, int],
                reported_stall: float) -> tuple[float, float]:
    """`kept` after a new checkpoint of `ckpt_step` published at `ckpt_time`, the attempt's last
    progress being `last`: the training up to where it reached that step is kept (a save published
    after the last progress keeps up to it); the stall grows by what the trainer reports beyond the
    kept stall, at most the time gained, and not at all for a save after the last progress."""
    at, stalled = kept
    after_last = ckpt_time > last[0] and ckpt_step >= last[1]
    now_at = max(at, last[0] if after_last else min(ckpt_time, last[0]))
    gained = 0.0 if after_last else max(0.0, min(reported_stall - stalled, now_at - at))
    return now_at, stalled + gained


def stored(raw: str | None) -> Progress | None:
    """An attempt row's `progress` column; None when there is none or it is not one (a store the
    daemon wrote, so an odd one is a bug: it is not worth an exception in every reader)."""
    try:
        doc = json.loads(raw) if raw else None
        if not isinstance(doc, dict):
            return None
        saves = tuple(sorted((int(s), _time(t)) for s, t in doc.get("saves") or ()))
        kept = doc.get("kept")
        if kept is not None and (not isinstance(kept, list) or len(kept) != 2):
            raise ValueError("not a (time, stall) pair")
        return Progress(_point(doc.get("first")), _point(doc.get("last")), saves,
                        None if kept is None else (_time(kept[0]), _time(kept[1])))
    except (TypeError, ValueError):
        return None


def _point(raw: object) -> tuple[float, int] | None:
    if raw is None:
        return None
    if not isinstance(raw, list) or len(raw) != 2:
        raise ValueError("not a (time, step) pair")
    return _time(raw[0]), int(raw[1])


def _time(raw: object) -> float:
    if not isinstance(raw, (int, float)) or isinstance(raw, bool) or not math.isfinite(raw):
        raise ValueError("not a time")
    return float(raw)
