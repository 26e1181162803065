"""The goodput ledger of one job: every second of its life, from submission to its end (or now), by
the cause it went to. Pure: it reads only the facts it is given (`JobFacts`, from the store's job,
attempt and event rows: `ledger_view.py` gathers them) and does no I/O.

The job's life is cut at the instants the daemon recorded, in order; each piece between two of
them goes to one cause (or is unsettled, below), so they sum to the wall time exactly (a recorded instant out of order
is clamped to its neighbours: a piece is never negative and never counted twice). The instants:

    submitted ─queued─ GPUs allocated ─staging─ placed ─startup─ first beat ─productive─ kept save
    ─recomputed─ last progress ─(hang | checkpoint | restart_detect | daemon)─ launcher exit
    ─restart_detect─ failure seen ─restart_teardown─ end recorded ─backoff─ backoff over
    ─restart_placed─ placed ─restart_relaunch─ spawn ─restart_restore─ first beat ─productive─ …

Time is *settled* into a cause only once that cause is final, so a cause's seconds never go down
(they are Prometheus counters, `spx_job_seconds_total`); the rest is `unsettled` (a gauge):

- `productive`: training whose steps were kept, less `checkpoint`: settled up to where the attempt
  reached the step of its newest published checkpoint (`Progress.kept`) while it runs; once it
  ended, up to the step the next attempt resumed from (never less than was settled), or all of it
  if it ended the job successfully. `recomputed`: the rest of an ended attempt's training — past the
  checkpoint the next attempt resumed from (its steps were trained again; the time from that save,
  or by interpolation between the attempt's own (time, step) points, to the last progress), or past
  the last checkpoint of a job that ended without success. A resume from before a checkpoint already
  settled (the crash-loop fallback) trains those steps again as `productive`: settled time stays.
- `unsettled`: a running attempt's time since it last reached a checkpointed step, and a failed
  attempt's training past its last checkpoint until its next attempt begins (which step it resumes
  from decides what was kept) or the job ends; an attempt's time before its first heartbeat (a
  restore, or a script without heartbeat: told only when it ends).
- `checkpoint`: the seconds the trainer reports its loop waited on saves, and a stop's save (SIGTERM
  after the last progress, a save of the last step published): then nothing is recomputed.
- `hang`: from the last progress to the exit of an attempt stopped as hung.
- `restart_*`: a failure surfacing (`detect`: last progress → failure seen), its processes and end
  (`teardown`), GPUs being free again after the backoff (`placed`), the relaunch (`relaunch`:
  checkpoint found, launcher spawned) and the worker's start and restore until its first beat
  (`restore`); `backoff`: the delay the policy decided. `startup` is the first attempt's `relaunch`
  and `restore` (and the time from the GPUs' allocation to it); `shutdown` the end of the attempt
  that ended the job (its final save, exit, its record).
- `daemon`: time lost to the daemon: an attempt found lost when the daemon came back (it lost its
  steps; an adopted attempt lost none and has no such time), the wait after a daemon stopped an
  attempt for its own stop or restart.
- `running`: an ended attempt that never beat (the daemon could not tell its progress).
- `queued`, `staging`; `unknown`: time the record does not place (none when everything was recorded).

GPU-seconds are seconds × the job's GPUs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import pairwise

from spx.daemon.state.attempt_progress import Progress

CAUSES = ("productive", "recomputed", "checkpoint", "hang", "restart_detect", "restart_teardown", "backoff",
          "restart_placed", "restart_relaunch", "restart_restore", "startup", "shutdown", "daemon", "running",
          "queued", "staging", "unknown")
# Not a cause: time whose cause is not known yet (see the module's doc).
UNSETTLED = "unsettled"
# Attempt ends that the daemon's own outage caused: found lost when it came back (a host or daemon
# loss), or stopped for its own stop or restart.
_LOST = frozenset({"lost", "host-lost"})
_DAEMON_STOPS = frozenset({"daemon-stop", "daemon-restart"})


@dataclass(frozen=True)
class AttemptFacts:
    """What the store recorded of one attempt. `phases` are its timeline (state/phases.py) and
    `progress` its heartbeats' record (None: no heartbeat was seen); `backoff` the seconds of
    backoff decided at its end."""

    start: float
    end: float | None = None
    phases: dict[str, float] = field(default_factory=dict)
    progress: Progress | None = None
    resumed_from_step: int | None = None
    reason_class: str | None = None
    stop_cause: str | None = None
    backoff: float | None = None
    exited: float | None = None


@dataclass(frozen=True)
class JobFacts:
    """A job's record: submitted, when GPUs were first allocated (its first 'starting' event), when
    it was last placed (its latest 'starting' event: a relaunch's GPUs free, before its attempt's
    row exists), when it ended (None: live), whether it staged and succeeded, its GPUs and attempts
    in order."""

    submitted: float
    gpus: int
    attempts: tuple[AttemptFacts, ...] = ()
    allocated: float | None = None
    placed: float | None = None
    ended: float | None = None
    staged: bool = False
    succeeded: bool = False


@dataclass(frozen=True)
class Ledger:
    seconds: dict[str, float]   # cause → settled seconds, every cause present (0 where none)
    unsettled: float            # seconds not yet known kept or recomputed; with `seconds`, the wall time
    wall: float                 # the job's wall time so far
    gpus: int
    pieces: tuple[tuple[float, float, str], ...] = ()  # (from, to, cause or UNSETTLED), in order, covering it

    def between(self, start: float, end: float) -> dict[str, float]:
        """Seconds by cause (and UNSETTLED) of the part of the job's life in [start, end]."""
        out = dict.fromkeys((*CAUSES, UNSETTLED), 0.0)
        for a, b, cause in self.pieces:
            out[cause] += max(0.0, min(b, end) - max(a, start))
        return out

    @property
    def gpu_seconds(self) -> dict[str, float]:
        return {cause: s * self.gpus for cause, s in self.seconds.items()}

    @property
    def goodput(self) -> float | None:
        """The share of the job's settled time after it was queued (while it held GPUs) that
        produced kept training: the recording rule `instance_spx_job:spx_job_goodput:ratio` computes
        the same from the counters."""
        held = sum(self.seconds.values()) - self.seconds["queued"]
        return self.seconds["productive"] / held if held > 0 else None

    def to_json(self) -> dict:
        return {"wall_seconds": round(self.wall, 3), "gpus": self.gpus,
                "goodput": None if self.goodput is None else round(self.goodput, 4),
                "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
                "unsettled_seconds": round(self.unsettled, 3),
                "gpu_seconds": {k: round(v, 3) for k, v in self.gpu_seconds.items()}}


class _Cuts:
    """The job's life cut in order: `to(t, cause)` gives (cursor, t] to `cause`, t clamped to
    [cursor, horizon], so the pieces never overlap and always sum to horizon - start."""

    def __init__(self, start: float, horizon: float):
        self.at = start
        self.horizon = horizon
        self.seconds = dict.fromkeys((*CAUSES, UNSETTLED), 0.0)
        self.pieces: list[tuple[float, float, str]] = []

    def to(self, t: float | None, cause: str) -> None:
        if t is None:
            return
        t = min(max(t, self.at), self.horizon)
        if t > self.at:
            self.seconds[cause] += t - self.at
            if self.pieces and self.pieces[-1][2] == cause and self.pieces[-1][1] == self.at:
                self.pieces[-1] = (self.pieces[-1][0], t, cause)
            else:
                self.pieces.append((self.at, t, cause))
        self.at = t

    def training(self, until: float, cause: str, stall: float) -> float:
        """Training up to `until` as `cause`, its last `stall` seconds (at most all of it) as
        `checkpoint` (where in it the trainer's saves stalled is not recorded, only how long: the
        sums are exact, the pieces' places are not). Returns the stall left to place."""
        began = self.at
        until = min(max(until, began), self.horizon)
        here = min(stall, until - began)
        self.to(until - here, cause)
        self.to(until, "checkpoint")
        return stall - here


def account(job: JobFacts, now: float) -> Ledger:
    """The job's ledger at `now` (its end, if it ended)."""
    horizon = max(job.submitted, job.ended if job.ended is not None else now)
    cuts = _Cuts(job.submitted, horizon)
    attempts = job.attempts
    first_placed = _placed(attempts[0]) if attempts else None
    cuts.to(job.allocated if job.allocated is not None else first_placed, "queued")
    if job.staged:
        cuts.to(first_placed, "staging")
    for i, a in enumerate(attempts):
        nxt = attempts[i + 1] if i + 1 < len(attempts) else None
        _attempt(cuts, a, nxt, job, first=i == 0)
    if not attempts:  # GPUs allocated: staging its data, or its first attempt being made
        cuts.to(horizon, "queued" if job.allocated is None else "staging" if job.staged else "startup")
    cuts.to(horizon, "unknown")
    return Ledger({c: cuts.seconds[c] for c in CAUSES}, cuts.seconds[UNSETTLED], horizon - job.submitted, job.gpus,
                  tuple(cuts.pieces))


def _placed(a: AttemptFacts, job: JobFacts | None = None) -> float:
    """When the attempt was placed: its `placed` phase; for the newest attempt whose phases are not
    written yet (its row is, a moment before), the job's latest placement (a placement before it)."""
    if "placed" in a.phases:
        return a.phases["placed"]
    if job is not None and job.placed is not None and job.placed <= a.start:
        return job.placed
    return a.phases.get("spawn", a.start)


def _attempt(cuts: _Cuts, a: AttemptFacts, nxt: AttemptFacts | None, job: JobFacts, *, first: bool) -> None:
    cuts.to(_placed(a, job), "startup" if first else "restart_placed")
    cuts.to(a.phases.get("spawn", a.start), "startup" if first else "restart_relaunch")
    # The attempt that ended the job: its end moved the job to its final state (one transaction, one time).
    ends_job = nxt is None and job.ended is not None and a.end is not None and job.ended <= a.end
    p = a.progress
    if p is None or p.first is None or p.last is None:
        if a.end is None:  # no beat yet: still restoring, or a script without heartbeat (told at its end)
            cuts.to(cuts.horizon, UNSETTLED)
            return
        cuts.to(_exit(a) or a.end, "running")
    else:
        cuts.to(p.first[0], "startup" if first else "restart_restore")
        _training(cuts, a, p, nxt, job, ends_job)
        if a.end is None:
            cuts.to(cuts.horizon, UNSETTLED)
            return
        cuts.to(_exit(a), _tail(a, p, ends_job))
    if a.reason_class in _LOST or a.stop_cause == "lost":
        cuts.to(a.end, "daemon")
    cuts.to(a.phases.get("failure_seen"), "shutdown" if ends_job else "restart_detect")
    cuts.to(a.end, "shutdown" if ends_job else "restart_teardown")
    if ends_job:
        return
    if a.reason_class in _DAEMON_STOPS or a.stop_cause in _DAEMON_STOPS:
        cuts.to(_placed(nxt, job) if nxt is not None else _relaunch(job, a.end) or cuts.horizon, "daemon")
    else:
        cuts.to(a.end + (a.backoff or 0.0), "backoff")
        if nxt is None:  # waiting for its GPUs now (or it was cancelled meanwhile)
            cuts.to(_relaunch(job, a.end) or cuts.horizon, "restart_placed")
    if nxt is None:  # placed again: its attempt being made
        cuts.to(cuts.horizon, "restart_relaunch")


def _relaunch(job: JobFacts, after: float) -> float | None:
    """When the job was placed again after its attempt ended at `after` (None: not yet)."""
    return job.placed if job.placed is not None and job.placed >= after else None


def _training(cuts: _Cuts, a: AttemptFacts, p: Progress, nxt: AttemptFacts | None, job: JobFacts,
              ends_job: bool) -> None:
    """The attempt's training, first beat → last progress: settled up to where it is known kept
    (`p.kept`: its newest checkpoint) while it runs; once it ended, kept up to the step the next
    attempt resumed from (never less than was settled), all of it if it ended the job successfully,
    and the rest `recomputed`. Until then (it runs, or it failed and its next attempt has not begun)
    the time past `p.kept` is unsettled."""
    assert p.first is not None and p.last is not None
    settled, stall = p.kept if p.kept is not None else (p.first[0], 0.0)
    if a.end is None or (nxt is None and job.ended is None):
        cuts.training(settled, "productive", stall)
        cuts.to(p.last[0], UNSETTLED)
        return
    if nxt is not None:
        kept = max(settled, kept_until(p, nxt.resumed_from_step))
    else:
        kept = p.last[0] if ends_job and job.succeeded else settled
    cuts.training(kept, "productive", stall)
    cuts.to(p.last[0], "recomputed")


def _exit(a: AttemptFacts) -> float | None:
    """When the attempt's launcher exited: its monitor's record, else when the daemon saw it."""
    return a.phases.get("launcher_exit", a.exited)


def _tail(a: AttemptFacts, p: Progress, ends_job: bool) -> str:
    """Where the time from an ended attempt's last progress to its exit went."""
    assert p.last is not None
    if a.stop_cause == "hang" or a.reason_class == "hang":
        return "hang"
    if a.reason_class in _LOST or a.stop_cause == "lost":
        return "daemon"
    if any(step >= p.last[1] and when >= p.last[0] for step, when in p.saves):
        return "checkpoint"  # a save of the last step after it: SIGTERM's (or the final) checkpoint
    return "shutdown" if ends_job else "restart_detect"


def kept_until(p: Progress, resumed: int | None) -> float:
    """When the attempt of `p` reached the step the next attempt resumed from (`resumed`; None: it
    started afresh). Exact at one of its saves or points; between two, interpolated linearly in steps."""
    assert p.first is not None and p.last is not None
    if resumed is not None and resumed >= p.last[1]:
        return p.last[0]
    if resumed is None or resumed < p.first[1]:
        return p.first[0]
    points = sorted({(p.first[1], p.first[0]), *p.saves, (p.last[1], p.last[0])})
    for (s0, t0), (s1, t1) in pairwise(points):
        if s0 <= resumed <= s1:
            return t0 if s1 == s0 else t0 + (t1 - t0) * (resumed - s0) / (s1 - s0)
    return p.last[0]


# The host's account: what its GPUs' time went to. A job's `queued` time held no GPU.
HOST_CAUSES = (*(c for c in CAUSES if c != "queued"), "quarantined", "idle")


@dataclass(frozen=True)
class HostSeconds:
    settled: dict[str, float]   # HOST_CAUSES → GPU-seconds; each only grows
    unsettled: float            # the live attempts' GPU-seconds not yet known kept or recomputed


def host_account(ledgers: Iterable[Ledger], gpus: int, quarantined: Iterable[tuple[float, float | None]],
                 start: float, end: float, held: HostSeconds | None = None) -> HostSeconds:
    """The host's GPU-seconds in [start, end]: each job's time while it held GPUs × its GPUs by cause
    (its unsettled time apart), the quarantined GPUs' time (each (since, until), None: still), and the
    rest of the host's `gpus` × (end - start) idle. Idle time is what no job held, so it grows too.
    `held`: jobs' GPU-seconds summed already (jobs that ended, accounted once), added to `ledgers`'."""
    out = dict(held.settled) if held is not None else dict.fromkeys(HOST_CAUSES, 0.0)
    unsettled = held.unsettled if held is not None else 0.0
    for ledger in ledgers:
        for cause, seconds in ledger.between(start, end).items():
            if cause == UNSETTLED:
                unsettled += seconds * ledger.gpus
            elif cause != "queued":
                out[cause] += seconds * ledger.gpus
    for since, until in quarantined:
        out["quarantined"] += max(0.0, min(end, until if until is not None else end) - max(since, start))
    out["idle"] = max(0.0, gpus * max(0.0, end - start) - sum(out.values()) - unsettled)
    return HostSeconds(out, unsettled)
