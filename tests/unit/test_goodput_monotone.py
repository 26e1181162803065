"""The goodput ledger's counters never go down: a job's life is replayed through every quarter
second, the store's facts at each instant built as the daemon records them (phases as they happen,
the start phases a moment after the attempt's row, the progress record from each heartbeat so far),
and no settled cause of the job nor of the host ever decreases, while settled and unsettled time
sum to the wall time at every instant. Two lives: a crash past its checkpoint, a hang, a daemon
restart with a JIT save and a success; and a script that never beats, an attempt lost in a daemon
outage, a resume from an older checkpoint than the newest (the crash-loop fallback), a crash, and a
cancel during the backoff."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from spx.daemon.state.attempt_progress import Progress
from spx.daemon.state.goodput import CAUSES, HOST_CAUSES, AttemptFacts, JobFacts, account, host_account

STEP_SECONDS = 0.25   # one optimizer step
SAVE_EVERY = 40       # steps
SAVE_SECONDS = 1.5    # the loop's stall per save


@dataclass
class Script:
    """One attempt as it happened: its recorded instants, when it trained, how it ended."""

    start: float
    phases: dict[str, float]
    train: tuple[float, float]                  # first step → last progress
    first_step: int
    end: float
    reason_class: str | None = None
    stop_cause: str | None = None
    backoff: float | None = None
    stop_save: float | None = None              # a save of the last step at this time (SIGTERM/JIT)
    heartbeat: bool = True                      # False: a script that writes none
    fallback: bool = False                      # resumes from the checkpoint before its predecessor's newest
    beats: list[tuple[float, int, tuple[int, float] | None, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        """The heartbeats spx.trainer writes: one per step; a save every SAVE_EVERY steps stalls the
        loop and is reported, with the stall, by the next step's beat."""
        t, step, ckpt, stall = self.train[0], self.first_step, None, 0.0
        while self.heartbeat and t <= self.train[1]:
            self.beats.append((t, step, ckpt, stall))
            if step % SAVE_EVERY == 0 and t + SAVE_SECONDS < self.train[1]:
                t += SAVE_SECONDS
                stall += SAVE_SECONDS
                ckpt = (step, t)
            t += STEP_SECONDS
            step += 1
        if self.stop_save is not None:
            self.beats.append((self.stop_save, self.last_step, (self.last_step, self.stop_save), stall + 1.0))

    def resumed_by(self, first_step: int) -> Script:
        """This attempt as it runs when it resumes at `first_step`."""
        return Script(self.start, self.phases, self.train, first_step, self.end, self.reason_class, self.stop_cause,
                      self.backoff, self.stop_save, self.heartbeat, self.fallback)

    @property
    def last_step(self) -> int:
        return max(step for _, step, _, _ in self.beats)

    def saved_steps(self) -> list[int]:
        return sorted({c[0] for _, _, c, _ in self.beats if c is not None})

    def facts(self, now: float, resumed: int | None) -> AttemptFacts:
        """What the store holds of this attempt at `now`."""
        progress = Progress()
        for t, step, ckpt, stall in self.beats:
            if t <= now:
                progress = progress.seen(step, t, *(ckpt or (None, None)), stall, since=self.start)
        ended = self.end <= now
        return AttemptFacts(
            start=self.start, end=self.end if ended else None, resumed_from_step=resumed,
            # The start phases are written a moment after the row (run/timeline.py `spawned`).
            phases={k: v for k, v in self.phases.items() if v <= now and (now >= self.start + 0.5 or v > self.start)},
            progress=progress if progress.first is not None else None,
            reason_class=self.reason_class if ended else None, stop_cause=self.stop_cause,
            backoff=self.backoff if ended else None)


@dataclass
class Life:
    attempts: list[Script]
    ended: float
    succeeded: bool


def failures_and_success() -> Life:
    crash = Script(12, {"placed": 10, "spawn": 12, "launcher_exit": 81, "failure_seen": 82}, (20, 79.9), 1, 84,
                   reason_class="user-code", backoff=5.0)
    hang = Script(92, {"placed": 90, "spawn": 92, "launcher_exit": 170, "failure_seen": 171}, (100, 150), 0, 172,
                  reason_class="hang", stop_cause="hang", backoff=0.0)
    stopped = Script(176, {"placed": 175, "spawn": 176, "launcher_exit": 203, "failure_seen": 203.5}, (180, 199.9),
                     0, 204, reason_class="daemon-restart", stop_cause="daemon-restart", backoff=0.0, stop_save=201.5)
    done = Script(232, {"placed": 230, "spawn": 232, "launcher_exit": 301, "failure_seen": 302}, (240, 299), 0, 305,
                  stop_save=300)
    return Life([crash, hang, stopped, done], ended=305, succeeded=True)


def outages_and_a_cancel() -> Life:
    silent = Script(6, {"placed": 5, "spawn": 6, "launcher_exit": 40, "failure_seen": 41}, (10, 40), 1, 42,
                    reason_class="user-code", backoff=3.0, heartbeat=False)
    lost = Script(47, {"placed": 46, "spawn": 47}, (52, 110), 1, 130, reason_class="lost", stop_cause="lost",
                  backoff=0.0)
    older = Script(133, {"placed": 132, "spawn": 133, "launcher_exit": 201, "failure_seen": 202}, (140, 200), 0, 203,
                   reason_class="user-code", backoff=10.0, fallback=True)
    return Life([silent, lost, older], ended=208, succeeded=False)


def job_at(life: Life, now: float) -> JobFacts:
    attempts = []
    saved: list[int] = []
    for script in life.attempts:
        if script.start > now:
            break
        # Each attempt starts from the newest step its predecessors saved (the one before, in a fallback).
        resumed = (saved[-2] if script.fallback else saved[-1]) if saved else None
        run = script.resumed_by(resumed + 1) if resumed is not None else script
        attempts.append(run.facts(now, resumed))
        saved = sorted({*saved, *run.saved_steps()})
    ended = life.ended if now >= life.ended else None
    placed = [s.phases["placed"] for s in life.attempts if s.phases["placed"] <= now]   # its 'starting' events
    return JobFacts(submitted=0, gpus=4, allocated=placed[0] if placed else None, placed=max(placed, default=None),
                    ended=ended, succeeded=ended is not None and life.succeeded, attempts=tuple(attempts))


@pytest.mark.parametrize("life", [failures_and_success(), outages_and_a_cancel()], ids=["failures", "outages"])
def test_no_cause_of_a_job_or_its_host_ever_goes_down_and_all_sums_to_the_wall_time(life):
    before: dict[str, float] = dict.fromkeys(CAUSES, 0.0)
    host_before: dict[str, float] = dict.fromkeys(HOST_CAUSES, 0.0)
    instants = [i * 0.25 for i in range(0, int(4 * (life.ended + 20)))]   # past the job's end
    unsettled = []
    for now in instants:
        ledger = account(job_at(life, now), now)
        unsettled.append(ledger.unsettled)
        assert sum(ledger.seconds.values()) + ledger.unsettled == pytest.approx(ledger.wall, abs=1e-9), now
        for cause, seconds in ledger.seconds.items():
            assert seconds >= before[cause] - 1e-9, (now, cause, before[cause], seconds)
        before = ledger.seconds
        # A GPU quarantined from 50 s and released at 120 s (its span ends at the first look after).
        quarantine = [(50.0, None)] if 50 <= now < 120 else [(50.0, 120.0)] if now >= 120 else []
        host = host_account([ledger], gpus=8, quarantined=quarantine, start=0.0, end=now)
        assert sum(host.settled.values()) + host.unsettled == pytest.approx(8 * now), now
        for cause, seconds in host.settled.items():
            assert seconds >= host_before[cause] - 1e-9, (now, cause, host_before[cause], seconds)
        host_before = host.settled
    assert max(unsettled) > 10       # while training between saves, and across a failure
    final = account(job_at(life, life.ended + 100), life.ended + 100)
    assert final.unsettled == 0 and final.wall == life.ended and final.seconds["unknown"] == 0
    # The life's causes all showed up.
    shown = ({"productive", "recomputed", "hang", "daemon", "checkpoint", "backoff", "restart_restore", "startup",
              "shutdown", "queued"} if life.succeeded else
             {"productive", "recomputed", "running", "daemon", "backoff", "restart_placed", "startup", "queued"})
    assert {c for c, v in final.seconds.items() if v > 0} >= shown, final.seconds
