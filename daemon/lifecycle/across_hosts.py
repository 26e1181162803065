"""The machine's edges for a job across hosts (limits.gang): every attempt runs in a generation the
hosts share (userfs/gang_dir.py, run/gang.py), and

- RUNNING: a beat every BEAT_SECONDS says this host's share runs (BeatGang); its answer (GangSeen)
  brings the generation now: a newer one than the attempt's means another host ended the round, and
  this share stops (SIGTERM, the grace) to follow that host's decision, uncounted (`peer-restart`);
- DIAGNOSING → AGREEING: before its end is recorded, an attempt's end is told to the other hosts;
  unless it only followed another host (or succeeded), its decision begins the next generation —
  if no other host's did first (`agree`, then `take_agreement` with the answer; ending.py records);
- PREPARING: a generation that ended the job for good (failed, cancelled) ends it here too.

PURE; the handlers that record the end after AGREEING live in ending.py, which calls `agree`.
"""

from __future__ import annotations

from dataclasses import replace

from spx.daemon.core.causes import NOT_THE_JOBS, ReasonClass, StopCause
from spx.daemon.lifecycle.actions import AgreeGeneration, BeatGang, Log, Note, RecordStop, SignalTerm
from spx.daemon.lifecycle.moves import Result, term, to
from spx.daemon.lifecycle.observations import GangSeen, GenerationAgreed
from spx.daemon.lifecycle.policy import Decision
from spx.daemon.lifecycle.record import GangTurn, Phase, TrackedJob
from spx.daemon.state.states import JobState

# How often a running share says so in the shared dir (a host's line older than
# run/gang.HOST_STALE_SECONDS is a daemon that is gone).
BEAT_SECONDS = 1.0
# Telling the others that an attempt ended comes back by then, or the end is recorded on this host's
# own decision alone (the others see it stop, and follow at their next beat or join).
AGREE_DEADLINE_SECONDS = 30.0


def on_host(turn: GangTurn) -> str:
    return f"{turn.reason or 'no reason given'} on host {turn.by or '(unknown)'}"


def beat(s: TrackedJob, now: float) -> Result:
    """running: the share's beat, when one is due and none is under way."""
    share = s.share
    if (not s.limits.gang or share.generation is None or share.beating
            or (share.beat_at is not None and now - share.beat_at < BEAT_SECONDS)):
        return s, []
    return replace(s, share=replace(share, beat_at=now, beating=True)), [
        BeatGang(s.number, share.generation, s.attempt.last_step, s.attempt.started_wall)]


def beat_failed(s: TrackedJob, error: str) -> Result:
    """A beat that failed is logged: the share goes on, and the next beat tries again."""
    return replace(s, share=replace(s.share, beating=False)), [Log("gang_beat_failed", "warning", (("error", error),))]


def gang_seen(s: TrackedJob, obs: GangSeen, now: float) -> Result:
    s = replace(s, share=replace(s.share, beating=False))
    turn = obs.turn
    if turn is None:  # the shared dir named no generation: nothing new
        return s, []
    s = replace(s, share=replace(s.share, missing_host=obs.missing))
    generation = s.share.generation
    if (generation is None or turn.gen <= generation or s.attempt.stop_cause is not None
            or s.attempt.beat_status == "finished"):
        # Its own round still (or already being stopped, or training done here): nothing new.
        return s, []
    # running → stopping: another host ended this round (its share failed, or was stopped): this
    # host's share stops too (SIGTERM, the grace) and follows that host's decision, uncounted.
    s = replace(term(s, now, StopCause.PEER_RESTART), share=replace(s.share, peer=turn))
    return s, [
        RecordStop(s.number, StopCause.PEER_RESTART),
        Log("peer_restart", "warning", (("generation", turn.gen), ("host", turn.by), ("reason", turn.reason),
                                        ("final", turn.final.value if turn.final else None))),
        Note(f"another host of the job began generation {turn.gen} ({on_host(turn)}); "
             f"SIGTERM, {s.limits.grace_seconds:.0f} s grace, then " + ("the job ends" if turn.final else
                                                                       "a relaunch into the new generation")),
        SignalTerm()]


def must_agree(s: TrackedJob) -> bool:
    """This attempt's end is to be told to the other hosts before it is recorded."""
    return s.limits.gang and not s.share.agreed and s.share.generation is not None


def agree(s: TrackedJob, d: Decision, now: float) -> Result:
    # diagnosing → agreeing: this host's share ended; unless it only followed another host (or
    # succeeded), its decision begins the next generation — if no other host's did first.
    bump = None
    if s.share.peer is None and d.state is not JobState.SUCCEEDED:
        counted = d.state is JobState.RESTARTING and s.attempt.stop_cause not in NOT_THE_JOBS
        bump = GangTurn(gen=(s.share.generation or 0) + 1, reason=d.reason, counted=counted, delay=d.delay_seconds,
                        final=d.state if d.state.terminal else None)
    return to(s, Phase.AGREEING, now), [AgreeGeneration(s.number, s.share.generation, bump, s.attempt.last_step)]


def take_agreement(s: TrackedJob, obs: GenerationAgreed) -> TrackedJob:
    """agreeing → recorded: on this host's decision, or on the one another host took first."""
    s = replace(s, share=replace(s.share, agreed=True))
    generation = s.share.generation
    if not obs.won and obs.turn is not None and s.share.peer is None and generation is not None \
            and obs.turn.gen > generation:
        s = replace(s, share=replace(s.share, peer=obs.turn))
    return s


def peer_decision(s: TrackedJob, turn: GangTurn) -> Decision:
    """What another host decided when it began `turn`, for this host's share: the same end, or a
    restart after the same delay — never counted here (that host counted it, once)."""
    if turn.final is not None:
        return Decision(turn.final, on_host(turn), ReasonClass.PEER_RESTART, backoff_level=s.ledger.backoff_level,
                        no_progress_streak=s.ledger.no_progress_streak)
    cap = s.limits.restart.backoff_seconds[1]
    return Decision(JobState.RESTARTING, f"restarted with the job's other hosts: {on_host(turn)}",
                    ReasonClass.PEER_RESTART, min(max(0.0, turn.delay), cap), s.ledger.backoff_level,
                    s.ledger.no_progress_streak)


def host_lost(s: TrackedJob) -> Decision | None:
    """The job fails naming a host when this attempt trained no step while that host stayed away past
    the host timeout (its agent waited as long at the rendezvous; a wait that long is no "healthy
    stretch")."""
    a = s.attempt
    if (s.share.missing_host is None or a.progressed or a.exit_code == 0
            or a.stop_cause == StopCause.CANCEL or a.stop_cause in NOT_THE_JOBS):
        return None
    return Decision(JobState.FAILED, s.share.missing_host, ReasonClass.HOST_LOST,
                    backoff_level=s.ledger.backoff_level, no_progress_streak=s.ledger.no_progress_streak + 1)
