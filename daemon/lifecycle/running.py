"""The machine's edges while an attempt runs: heartbeats restart its hang clock and teach it the
attempt's step intervals, activity (GPUs computing, the log growing) stands in for an attempt without
a heartbeat, and a hang (no progress for the hang timeout) begins the stop with a stack dump. A
"diverged" beat keeps its evidence for the restart policy; a beat reporting a NaN/Inf loss or
gradient norm from a script that went on training (the daemon's own NaN rule) stops the attempt as a
divergence. The first step of an attempt asks for the next attempt's launcher ahead (StartStandby).
PURE."""

from __future__ import annotations

import math
from dataclasses import replace

from spx.daemon.contract.worker_env import Divergence
from spx.daemon.core.causes import StopCause
from spx.daemon.lifecycle import across_hosts
from spx.daemon.lifecycle.actions import Action, DumpStacks, Log, Note, RecordStop, SignalTerm, StartStandby
from spx.daemon.lifecycle.moves import Result, term, to, with_attempt
from spx.daemon.lifecycle.observations import ActivitySeen, HeartbeatSeen, Tick
from spx.daemon.lifecycle.record import Phase, TrackedJob

# After its "finished" heartbeat (training done, final checkpoint complete) an attempt gets this long
# to exit; one that does not (seen: torch's gloo teardown deadlocking in the interpreter's exit) is a
# hang at exit — stacks dumped, killed — and succeeded: its work is done.
FINISHED_EXIT_SECONDS = 60.0
# Without `restart.hang_timeout_seconds` the hang timeout is calibrated from the attempt's own step
# intervals (as seen through the heartbeat, so at most one per second): max(floor, factor × p99 of
# the recent ones, 2 × the longest), never above the ceiling, and the ceiling until enough were seen.
# The first two step changes are warm-up (compile, first batches, a resume's load) and never count,
# nor does an interval that spans a checkpoint (heartbeat status "checkpointing").
AUTO_HANG_FLOOR_SECONDS = 10.0
AUTO_HANG_FACTOR = 5.0
AUTO_HANG_CEILING_SECONDS = 900.0
AUTO_HANG_MIN_INTERVALS = 5
STEP_INTERVALS_KEPT = 64


def hang_timeout(s: TrackedJob) -> float:
    """Seconds without step progress that make this attempt hung (see AUTO_HANG_*)."""
    limits, status = s.limits, s.attempt.beat_status
    if status == "finished":
        return min(limits.hang_timeout_seconds or AUTO_HANG_CEILING_SECONDS, FINISHED_EXIT_SECONDS)
    if limits.hang_timeout_seconds is not None:
        return limits.hang_timeout_seconds
    if len(s.hang.intervals) < AUTO_HANG_MIN_INTERVALS or status == "checkpointing":
        return AUTO_HANG_CEILING_SECONDS
    ordered = sorted(s.hang.intervals)
    p99 = ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]
    return min(AUTO_HANG_CEILING_SECONDS, max(AUTO_HANG_FLOOR_SECONDS, AUTO_HANG_FACTOR * p99, 2 * s.hang.longest))


def heartbeat(s: TrackedJob, obs: HeartbeatSeen, now: float) -> Result:
    a = s.attempt
    # A beat counts only if written during this attempt, and once.
    if obs.time < a.started_wall or obs.time == a.last_beat_time:
        return s, []
    finishing = obs.status == "finished" and a.beat_status != "finished"
    was_checkpointing = a.beat_status == "checkpointing"
    a, hang = replace(a, last_beat_time=obs.time, beat_status=obs.status), s.hang
    if obs.replay is not None:
        # A replay job's verdict (its last beat): what its end reports about the job it verified.
        a = replace(a, replay=obs.replay)
    if obs.status == "diverged" and a.diverged is None:
        # The trainer stopped on a divergence and says where: kept for the policy (class divergence).
        a = replace(a, diverged=obs.diverged or Divergence(obs.step, "training", math.nan, "diverged heartbeat"))
    if a.last_step is None or obs.step != a.last_step or finishing:
        # running: progress — the hang clock restarts (it starts at the first heartbeat: scripts
        # that write none are supervised on exit status alone), and the interval is learned.
        if a.last_progress is not None and obs.step != a.last_step:
            hang = replace(hang, step_changes=hang.step_changes + 1)
            if hang.step_changes > 2 and not was_checkpointing:
                interval = now - a.last_progress
                hang = replace(hang, intervals=(*hang.intervals, interval)[-STEP_INTERVALS_KEPT:],
                               longest=max(hang.longest, interval))
        a = replace(a, last_step=obs.step, last_progress=now)
    sampled = _non_finite(obs)
    if sampled is not None and s.phase is Phase.RUNNING and a.stop_cause is None and a.diverged is None:
        # running → stopping: the script reports a NaN/Inf and trains on (it does not check its own
        # loss): every further step is garbage. Stopped as a divergence, rolled back by the policy.
        s = term(replace(s, attempt=a, hang=hang), now, StopCause.DIVERGENCE, diverged=sampled)
        return s, [RecordStop(s.number, StopCause.DIVERGENCE),
                   Log("divergence_stop", "warning", (("step", sampled.step), ("value", sampled.describe()))),
                   Note(f"diverged at step {sampled.step}: {sampled.describe()}; SIGTERM, "
                        f"{s.limits.grace_seconds:.0f} s grace"),
                   SignalTerm()]
    s = replace(s, attempt=a, hang=hang)
    if _standby_due(s):
        # running: the attempt trained a step (its own beat, not the last attempt's still in the
        # file), so the next attempt's launcher starts now, never slowing this one's start.
        return with_attempt(s, standby_asked=True), [StartStandby(s.number + 1)]
    return s, []


# A script that writes no heartbeat never says it trained a step: its next launcher starts once the
# attempt has lived this long and shows work (a GPU computing, its log growing; on no GPU, having
# lived this long is the sign) — past a launcher's
# and its workers' start-up on most hosts, so the standby's imports do not slow this attempt's start.
STANDBY_WITHOUT_HEARTBEAT_SECONDS = 20.0


def _standby_due(s: TrackedJob) -> bool:
    return (s.phase is Phase.RUNNING and s.limits.standby and s.limits.restart.max_restarts > 0
            and not s.attempt.standby_asked)


DAEMON_NON_FINITE = "non-finite, in its heartbeat"


def _non_finite(obs: HeartbeatSeen) -> Divergence | None:
    """The daemon's NaN/Inf rule on what a running beat reports (the same rule spx.trainer applies)."""
    if obs.status not in ("running", "checkpointing"):
        return None
    for metric, value in (("loss", obs.loss), ("grad_norm", obs.grad_norm)):
        if value is not None and not math.isfinite(value):
            return Divergence(obs.step, metric, value, DAEMON_NON_FINITE)
    return None


def activity(s: TrackedJob, obs: ActivitySeen, now: float) -> Result:
    # running, no heartbeat progress: GPUs computing or the log growing restart the idle clock
    # (it starts at the first look after the spawn).
    a = s.attempt
    if not obs.active and a.last_activity is not None:
        return s, []
    s = with_attempt(s, last_activity=now)
    if (obs.active and a.beat_status is None and a.started is not None
            and now - a.started >= STANDBY_WITHOUT_HEARTBEAT_SECONDS and _standby_due(s)):
        # running, no beat at all so far (a plain torchrun script): its next launcher starts now,
        # as a heartbeat writer's does at its first step.
        return with_attempt(s, standby_asked=True), [StartStandby(s.number + 1)]
    return s, []


def tick_running(s: TrackedJob, obs: Tick, now: float) -> Result:
    a = s.attempt
    timeout = s.limits.hang_timeout_seconds or AUTO_HANG_CEILING_SECONDS
    if (a.last_progress is None and a.last_activity is not None and a.stop_cause is None
            and now - a.last_activity > timeout):
        # running → dumping: no heartbeat to go by, but its GPUs computed nothing and its log
        # stayed silent for the hang timeout (a hung collective, a deadlock): a hang all the same.
        idle = now - a.last_activity
        return _hung(s, idle, now, Log("hang_detected", "warning", (
            ("idle_seconds", round(idle, 1)), ("step", None), ("without_heartbeat", True))),
            f"hang detected: no heartbeat, GPUs idle and log silent for {idle:.0f} s; dumping stacks, then SIGTERM")
    if a.last_progress is not None and a.stop_cause is None:
        idle, finished = now - a.last_progress, a.beat_status == "finished"
        if idle > hang_timeout(s):
            # running → dumping: no step progress for the hang timeout; stacks first, then the stop.
            return _hung(s, idle, now, Log("hang_detected", "warning", (
                ("idle_seconds", round(idle, 1)), ("step", a.last_step), ("timeout_seconds", round(hang_timeout(s), 1)),
                ("after_finished", finished))),
                f"hang detected: not exited {idle:.0f} s after training finished; dumping stacks, then SIGTERM"
                if finished else
                f"hang detected: no step progress for {idle:.0f} s (at step {a.last_step}); dumping stacks, then SIGTERM")
    standby: list[Action] = []
    if (not s.ledger.gpus and a.beat_status is None and a.started is not None
            and now - a.started >= STANDBY_WITHOUT_HEARTBEAT_SECONDS and _standby_due(s)):
        # running, no heartbeat and no GPU whose work could be seen (a job on CPUs): having lived
        # this long is its sign of a healthy start, and its next launcher starts now.
        s, standby = with_attempt(s, standby_asked=True), [StartStandby(s.number + 1)]
    s, beat = across_hosts.beat(s, now)
    return s, [*standby, *beat]


def _hung(s: TrackedJob, idle: float, now: float, log: Log, note: str) -> Result:
    s = replace(to(s, Phase.DUMPING, now), attempt=replace(s.attempt, hang_idle=idle, stop_cause=StopCause.HANG))
    return s, [RecordStop(s.number, StopCause.HANG), log, Note(note), DumpStacks(s.number)]
