"""What an attempt's heartbeats said about its progress, kept in its store row (`attempts.progress`):
the smallest record from which the goodput ledger (`goodput.py`) tells kept from recomputed time
exactly.

- `first`: (time, step) of the attempt's first heartbeat — where its restore ends and training begins;
- `last`: (time, step) of the last heartbeat whose step moved — where its progress ended (a hang or a
  crash begins after it);
- `saves`: the checkpoints it published, (step, time), the newest `SAVES_KEPT` — the next attempt
  resumes from one of them, and that save's time is where this attempt's kept work ends;
- `stall`: seconds its training loop waited on checkpoint saves, as the trainer reports them (0 for a
  script that reports none).

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
    stall: float = 0.0

    def seen(self, step: int, time: float, ckpt_step: int | None, ckpt_time: float | None,
             stall: float | None, since: float) -> Progress:
        """This record after a heartbeat (step, time, its last checkpoint, its reported stall) of the
        attempt that began at `since`: a beat or a checkpoint from before it is the previous
        attempt's and is not this one's."""
        if time < since:
            return self
        first = self.first or (time, step)
        last = self.last if self.last is not None and self.last[1] == step else (time, step)
        saves = self.saves
        if (ckpt_step is not None and ckpt_time is not None and ckpt_time >= since
                and all(s != ckpt_step for s, _ in saves)):
            saves = (*saves, (ckpt_step, ckpt_time))[-SAVES_KEPT:]
        return Progress(first, last, saves, max(self.stall, stall or 0.0))

    def to_json(self) -> str:
        return json.dumps({"first": self.first, "last": self.last, "saves": self.saves, "stall": self.stall})


def stored(raw: str | None) -> Progress | None:
    """An attempt row's `progress` column; None when there is none or it is not one (a store the
    daemon wrote, so an odd one is a bug: it is not worth an exception in every reader)."""
    try:
        doc = json.loads(raw) if raw else None
        if not isinstance(doc, dict):
            return None
        saves = tuple(sorted((int(s), _time(t)) for s, t in doc.get("saves") or ()))
        return Progress(_point(doc.get("first")), _point(doc.get("last")), saves, _time(doc.get("stall") or 0.0))
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
