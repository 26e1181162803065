"""What a job's status document (`spx status NAME --json`) says about its life, for `spx report`:
its training step over wall time, its failures, the recoveries after them, and where its seconds
went. Pure: it reads the document it is given and a `now` for a live job.

The step line is drawn through the (time, step) points the document has. Per attempt:
- where training began: its `progress.first` when the daemon keeps a progress record, else the
  `first_step` (or `first_beat`) phase at the step it resumed from (`resumed_from_step`, 0 if none);
- its checkpoint saves, `progress.saves` ((step, time) pairs), when recorded;
- where its progress ended: `progress.last`, else (its launcher's exit or its end, `max_step`) — for
  a hung attempt without a progress record that point is late (its steps stopped earlier);
- the live attempt ends at (`now`, the job's current `step`).
Between attempts the line drops at the failure to the step the next attempt resumed from and stays
there through the recovery (the shaded span: the failure → the next attempt's first step).

The account: the daemon's own ledger (`ledger`: seconds per cause, goodput, and a live job's
`unsettled` seconds, not yet known kept or recomputed) when the document has one; else `estimate`, cut from the attempts' recorded instants into the ledger's causes, summing to
the wall time exactly, but coarser (the backoff and the wait for GPUs are one `backoff`, a hang's
lost time is `productive`, and recomputed time is interpolated between the attempt's first and last
steps).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from spx.daemon.core.causes import NOT_FAILURES

NOT_FAILURE_WORDS = frozenset(c.value for c in NOT_FAILURES)
Point = tuple[float, float]


@dataclass(frozen=True)
class Failure:
    attempt: int
    time: float
    step: float | None
    reason: str | None
    reason_class: str | None
    root_cause: str | None


@dataclass
class Story:
    """The job's step line, its failures, recoveries (start, end) and checkpoint saves (time, step)."""

    origin: float
    end: float
    steps: list[Point] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    recoveries: list[tuple[float, float]] = field(default_factory=list)
    saves: list[Point] = field(default_factory=list)


@dataclass(frozen=True)
class Account:
    """Seconds per cause (the ledger's names), the wall time, goodput, and where they came from."""

    seconds: dict[str, float]
    wall: float
    goodput: float | None
    source: str  # "ledger" (the daemon's) or "estimate" (from the attempts' phases here)
    gpu_seconds: dict[str, float] | None = None


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _first(*values: float | None) -> float | None:
    """The first of `values` that is known (a time of 0.0 is one)."""
    return next((v for v in values if v is not None), None)


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def _pair(value: object) -> Point | None:
    if isinstance(value, (list, tuple)) and len(value) == 2:
        a, b = _number(value[0]), _number(value[1])
        if a is not None and b is not None:
            return a, b
    return None


def is_failure(attempt: dict) -> bool:
    cls = attempt.get("reason_class")
    return cls is not None and cls not in NOT_FAILURE_WORDS


def began_training(attempt: dict) -> float | None:
    """When the attempt's training began: its first beat's time, or the first_step/first_beat phase."""
    progress = attempt.get("progress") or {}
    first = _pair(progress.get("first"))
    if first:
        return first[0]
    phases = attempt.get("phases") or {}
    return _first(_number(phases.get("first_step")), _number(phases.get("first_beat")))


def failed_at(attempt: dict) -> float | None:
    """When the attempt's failure happened: its launcher's exit as the monitor recorded it, else its end."""
    return _first(_number((attempt.get("phases") or {}).get("launcher_exit")), _number(attempt.get("end")))


def attempt_points(attempt: dict, live_step: float | None, now: float) -> list[Point]:
    """The attempt's (time, step) points in time order (see the module doc); [] if it never trained."""
    start = began_training(attempt)
    if start is None:
        return []
    progress = attempt.get("progress") or {}
    first = _pair(progress.get("first")) or (start, float(attempt.get("resumed_from_step") or 0))
    saves = sorted((t, s) for s, t in (p for p in map(_pair, progress.get("saves") or ()) if p))
    last = _pair(progress.get("last"))
    if last is None:
        if attempt.get("end") is None:
            last = (now, live_step) if live_step is not None else None
        elif _number(attempt.get("max_step")) is not None:
            last = (_or(failed_at(attempt), now), float(attempt["max_step"]))
    points = [first, *(p for p in saves if p[0] >= first[0]), *([last] if last else [])]
    out: list[Point] = []
    for t, s in points:  # time never goes back: a point out of order is moved up to its neighbour
        out.append((max(t, out[-1][0]) if out else t, s))
    return out


def story(doc: dict, now: float) -> Story:
    history = sorted(doc.get("history") or [], key=lambda a: a.get("number", 0))
    origin = _or(_number(doc.get("submitted")), now)
    ends = [_number(a.get("end")) for a in history]
    live = doc.get("state") not in ("succeeded", "failed", "cancelled")
    end = now if live or not history or None in ends else max(e for e in ends if e is not None)
    out = Story(origin=origin, end=max(end, origin))
    for i, attempt in enumerate(history):
        points = attempt_points(attempt, _number(doc.get("step")) if i == len(history) - 1 else None, now)
        nxt = history[i + 1] if i + 1 < len(history) else None
        progress = attempt.get("progress") or {}
        out.saves += sorted((t, s) for s, t in (p for p in map(_pair, progress.get("saves") or ()) if p))
        if out.steps and points:  # the previous attempt's drop: at its failure, to where this one resumed
            out.steps.append((max(out.steps[-1][0], points[0][0]), points[0][1]))
        out.steps += points
        if not is_failure(attempt):
            continue
        when = _or(failed_at(attempt), out.end)
        at_step = points[-1][1] if points else None
        out.failures.append(Failure(attempt.get("number", i + 1), when, at_step, attempt.get("reason"),
                                    attempt.get("reason_class"), attempt.get("root_cause")))
        if points:
            out.steps.append((max(when, points[-1][0]), points[-1][1]))
            if nxt is not None:
                out.steps.append((out.steps[-1][0], float(nxt.get("resumed_from_step") or 0)))
        if nxt is not None:
            back = _or(_first(began_training(nxt), _number(nxt.get("end"))), out.end)
            out.recoveries.append((when, max(back, when)))
    out.steps = [p for k, p in enumerate(out.steps) if k == 0 or p != out.steps[k - 1]]
    return out


def account(doc: dict, now: float) -> Account:
    """The daemon's ledger when the document has one, else the estimate from the attempts' phases."""
    ledger = doc.get("ledger")
    if isinstance(ledger, dict) and isinstance(ledger.get("seconds"), dict):
        seconds = {str(k): float(v) for k, v in ledger["seconds"].items() if _number(v) is not None}
        gpu = ledger.get("gpu_seconds")
        gpu_seconds = {str(k): float(v) for k, v in gpu.items()} if isinstance(gpu, dict) else None
        # A live job's time not settled yet (its running attempt's training since its newest
        # checkpoint): shown as its own line, so the lines still sum to the wall time.
        unsettled = _number(ledger.get("unsettled_seconds"))
        if unsettled:
            seconds["unsettled"] = unsettled
            if gpu_seconds is not None and _number(ledger.get("gpus")) is not None:
                gpu_seconds["unsettled"] = unsettled * float(ledger["gpus"])
        return Account(seconds, float(ledger.get("wall_seconds") or sum(seconds.values())), _number(ledger.get("goodput")),
                       "ledger", gpu_seconds)
    return estimate(doc, now)


class _Cuts:
    """A life cut at instants in order, each piece to a cause; an instant out of order is clamped."""

    def __init__(self, start: float, horizon: float):
        self.at = start
        self.horizon = max(horizon, start)
        self.seconds: dict[str, float] = {}

    def to(self, t: float | None, cause: str) -> None:
        if t is None:
            return
        t = min(max(t, self.at), self.horizon)
        if t > self.at:
            self.seconds[cause] = self.seconds.get(cause, 0.0) + (t - self.at)
        self.at = t


def estimate(doc: dict, now: float) -> Account:
    s = story(doc, now)
    cuts = _Cuts(s.origin, s.end)
    history = sorted(doc.get("history") or [], key=lambda a: a.get("number", 0))
    for i, attempt in enumerate(history):
        phases = {k: _number(v) for k, v in (attempt.get("phases") or {}).items()}
        first = i == 0
        cuts.to(_first(phases.get("placed"), _number(attempt.get("start"))), "queued" if first else "backoff")
        cuts.to(phases.get("spawn"), "startup" if first else "restart_relaunch")
        began = began_training(attempt)
        if began is None:  # no heartbeat: the daemon cannot tell training from anything else
            cuts.to(_first(_number(attempt.get("end")), s.end), "running")
            continue
        cuts.to(began, "startup" if first else "restart_restore")
        trained_from = cuts.at
        points = attempt_points(attempt, _number(doc.get("step")) if i == len(history) - 1 else None, now)
        cuts.to(points[-1][0] if points else _first(_number(attempt.get("end")), s.end), "productive")
        _move_recomputed(cuts, attempt, history[i + 1] if i + 1 < len(history) else None, points, trained_from)
        if is_failure(attempt) or i + 1 < len(history):
            cuts.to(phases.get("launcher_exit"), "restart_detect")
            cuts.to(phases.get("failure_seen"), "restart_detect")
            cuts.to(_first(phases.get("end_recorded"), _number(attempt.get("end"))), "restart_teardown")
        else:
            cuts.to(_number(attempt.get("end")), "shutdown")
    cuts.to(s.end, "queued" if not history else "unknown")
    wall = s.end - s.origin
    productive = cuts.seconds.get("productive", 0.0)
    return Account(cuts.seconds, wall, productive / wall if wall > 0 else None, "estimate")


def _move_recomputed(cuts: _Cuts, attempt: dict, nxt: dict | None, points: list[Point], since: float) -> None:
    """The share of the attempt's training past the step the next attempt resumed from, moved from
    productive to recomputed (by its steps: the time is interpolated between its first and last)."""
    if nxt is None or len(points) < 2:
        return
    first, last = points[0][1], points[-1][1]
    resumed = float(nxt.get("resumed_from_step") or 0)
    if last <= first or resumed >= last:
        return
    share = (last - max(resumed, first)) / (last - first)
    lost = (cuts.at - since) * share
    cuts.seconds["productive"] -= lost
    cuts.seconds["recomputed"] = cuts.seconds.get("recomputed", 0.0) + lost
