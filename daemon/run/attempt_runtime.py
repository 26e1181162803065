"""The live side of each job's current attempt, and what the executor sees of it each turn.

`AttemptHandles` holds what a value of the machine cannot: the attempt's files, its store row and
tag, its launcher's Popen (the attempt monitor) and log relay, its process group and cgroup, the
pids seen. `AttemptRuntime` keeps them per job and turns what changed into observations (`observe`:
heartbeat, activity, a worker's abnormal death, the launcher's exit, nothing left), and performs what touches the attempt's
processes and log (signals, cgroup removal, notes, log lines with its pids). On the main loop's
thread only; everything here is quick and never waits on a user (the heartbeat is read through
userfs, non-blocking and capped, once a second and at the launcher's exit; every attempt's pids
come from one scan of /proc every PIDS_EVERY_SECONDS).
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from spx.daemon.core.config import DaemonConfig
from spx.daemon.core.log import get_logger
from spx.daemon.lifecycle.actions import Log, RemoveCgroup, SignalKill, SignalTerm
from spx.daemon.lifecycle.observations import (
    ActivitySeen,
    AllGone,
    HeartbeatSeen,
    LauncherExited,
    Observation,
    WorkerDied,
)
from spx.daemon.lifecycle.record import Phase, TrackedJob
from spx.daemon.run import attempt_files, cgroups, launcher, proctree, timeline
from spx.daemon.run.attempt_files import AttemptFiles
from spx.daemon.run.exit_wake import ExitWatch
from spx.daemon.run.progress_log import ProgressLog
from spx.daemon.run.worker_watch import WorkerWatch
from spx.daemon.state.jobs_table import JobRow
from spx.daemon.userfs.heartbeat import HeartbeatFile

log = get_logger()

# How often every attempt's pids are looked up (one scan of every process's environment on the host,
# ~2 ms here): they feed `spx status`, the per-job metrics and the OOM check's set of pids seen. No
# death waits for it — a launcher's and a worker's exit are seen through their pidfds (exit_wake.py,
# worker_watch.py), and at an exit the pids are looked up afresh.
PIDS_EVERY_SECONDS = 5.0
# How often a running attempt's heartbeat is read: a worker writes it about once a second (hang
# detection's unit is seconds), as often as a quiet loop turns; on its launcher's exit it is read
# at once, so the last beat before an exit is always seen before the exit is.
HEARTBEAT_EVERY_SECONDS = 1.0
ACTIVITY_EVERY_SECONDS = 5.0  # how often an attempt without heartbeat progress is looked at
_WITH_PROCESSES = ("leftover_processes", "adopted_after_restart")


@dataclass
class AttemptHandles:
    """The live side of one attempt."""

    number: int
    files: AttemptFiles | None = None
    row_id: int | None = None
    attempt_id: str | None = None
    port: int = 0
    discovery: dict | None = None  # checkpoint discovery's answer for this attempt (stored with its row)
    proc: subprocess.Popen | None = None     # the attempt monitor; None: adopted after a daemon restart
    relay: subprocess.Popen | None = None
    launching: bool = False  # its launch is under way off the loop (a standby's handoff, a cold start's status)
    pgid: int | None = None
    cgroup: Path | None = None
    pids: list[int] = field(default_factory=list)
    seen_pids: set[int] = field(default_factory=set)  # every pid ever seen, for the OOM check
    beat_due: float = float("-inf")  # when its heartbeat is read next (HEARTBEAT_EVERY_SECONDS)
    pids_looked: bool = False  # its pids were looked up once (then with every attempt's, see begin_turn)
    activity_checked: float = 0.0
    log_size: int | None = None
    exit_reported: bool = False
    standby_age: float | None = None  # seconds its launcher waited as a standby (None: launched cold)
    spawned_wall: float = 0.0  # when this daemon spawned it (0: adopted; any heartbeat is then its own)
    memory_peak: int | None = None  # its cgroup's memory.peak, read as the cgroup is removed (stored at its end)
    heartbeat: HeartbeatFile | None = field(init=False, default=None)  # read once a second, parsed on change

    def __post_init__(self) -> None:
        if self.files is not None:
            self.heartbeat = HeartbeatFile(self.files.heartbeat_file)

    @property
    def procs(self) -> proctree.AttemptProcesses:
        return proctree.AttemptProcesses(self.attempt_id or "-", self.pgid, self.cgroup)


def make_attempt_cgroup(tree: cgroups.CgroupTree | None, job: JobRow, number: int, attempt_id: str) -> Path | None:
    """The attempt's own cgroup, where cgroups are managed. If it cannot be made, the attempt
    still runs, found by tag and process group only, as where cgroups are not managed."""
    if tree is None:
        return None
    cgroup = tree.attempt(job.name, number, attempt_id)
    try:
        cgroup.mkdir()
        return cgroup
    except OSError as e:
        log.warning("attempt_cgroup_failed", job=job.name, attempt=number, cgroup=str(cgroup), error=str(e))
        return None


def adopted_end(h: AttemptHandles) -> LauncherExited | None:
    """How an adopted attempt (not our child) ended, or None while it runs. Its monitor records the
    launcher's end before it exits itself: with a record the launcher is gone, even if workers are
    left (a launcher killed while no daemon watched leaves its workers training, unsupervised:
    they are leftovers now, killed as any), and with none and no process left it is lost."""
    record = (launcher.recorded_exit(h.files.log_dir, h.files.log_name, h.attempt_id)
              if h.files is not None and h.attempt_id else None)
    if record is None:
        return None if h.pids else LauncherExited(None, None, lost=True)
    return LauncherExited(record.exit_code, record.signal, launched=record.launched, stopped=record.stopped,
                          ended_wall=record.ended)


class AttemptRuntime:
    def __init__(self, cfg: DaemonConfig, recorder: timeline.Recorder, clock: Callable[[], float] = time.monotonic,
                 gpu_computing: Callable[[int], bool | None] | None = None, progress: ProgressLog | None = None,
                 exits: ExitWatch | None = None, workers: WorkerWatch | None = None):
        self.cfg = cfg
        self.exits = exits if exits is not None else ExitWatch(clock)  # the thread every pidfd is polled on
        self.workers = workers  # each attempt's workers' deaths, seen as they happen (worker_watch.py)
        self.timeline = recorder
        # Each attempt's progress record, for the goodput ledger (run/progress_log.py).
        self.progress = progress if progress is not None else ProgressLog(recorder.store, clock)
        self.clock = clock
        self.gpu_computing = gpu_computing  # backend.computing: None means "cannot say" (busy)
        self.handles: dict[int, AttemptHandles] = {}
        self._index: dict[str, list[int]] | None = None  # this turn's tagged pids (proctree.tag_index)
        self._pids_due = False  # this turn looks up every attempt's pids (once every PIDS_EVERY_SECONDS)
        self._next_pids = 0.0

    def begin_turn(self) -> None:
        """A new loop turn: the next pid lookup scans /proc afresh (once for all attempts). Every
        attempt's pids are looked up in the same turn, every PIDS_EVERY_SECONDS: one scan serves
        them all (each on its own schedule, 8 attempts made 8 scans of every process's environment
        per period)."""
        self._index = None
        now = self.clock()
        self._pids_due = now >= self._next_pids
        if self._pids_due:
            self._next_pids = now + PIDS_EVERY_SECONDS

    def prepared(self, job: JobRow, number: int, files: AttemptFiles, found: dict) -> None:
        """Attempt `number`'s files are made and its checkpoint found: its handles (kept if a retried
        spawn made its row already)."""
        current = self.handles.get(job.id)
        if current is None or current.number != number or current.row_id is None:
            self.handles[job.id] = AttemptHandles(number=number, files=files)
        self.handles[job.id].discovery = found

    def row_of(self, job_id: int, number: int) -> int | None:
        """The store row of the job's attempt `number`, if it has one."""
        h = self.handles.get(job_id)
        return h.row_id if h is not None and h.number == number else None

    def memory_peak(self, job_id: int, number: int) -> int | None:
        """Attempt `number`'s memory.peak, where its cgroup was measured before removal."""
        h = self.handles.get(job_id)
        return h.memory_peak if h is not None and h.number == number else None

    def attempt_over(self, job_id: int, number: int) -> None:
        """The attempt's end is recorded: nothing of it is ours to poll (its relay drains on its own)."""
        h = self.handles.get(job_id)
        if h is not None and h.number == number:
            self.progress.forget(h.row_id)
            h.row_id, h.proc, h.pids = None, None, []
        if self.workers is not None:
            self.workers.drop(job_id)

    def forget(self, job_id: int) -> None:
        """The job is done: its handles go (a relay still draining, no longer ours to poll, is
        collected by the orphan reaper; a launch still under way is ended when it lands)."""
        h = self.handles.pop(job_id, None)
        if h is not None:
            self.progress.forget(h.row_id)
        if self.workers is not None:
            self.workers.drop(job_id)

    # --- observing -----------------------------------------------------------------------------------

    def observe(self, job: JobRow, s: TrackedJob) -> list[Observation]:
        h = self.handles.get(job.id)
        if h is None:
            return []
        obs = self._observe_attempt(s, h) if s.phase.has_processes and h.number == s.number and not h.launching else []
        if h.relay is not None and h.relay.poll() is not None:
            h.relay = None
        return obs

    def _observe_attempt(self, s: TrackedJob, h: AttemptHandles) -> list[Observation]:
        obs: list[Observation] = []
        now = self.clock()
        ended = None if h.exit_reported else self._launcher_status(h)
        deaths = self.workers.deaths(s.job.id, h.number) if self.workers is not None and not h.exit_reported else []
        # At an exit (the launcher's, a worker's) the heartbeat is read at once: the machine sees the
        # last beat before the exit (whether the attempt writes one decides what a worker's death does).
        if h.heartbeat is not None and (now >= h.beat_due or ended is not None or h.exit_reported or deaths):
            h.beat_due = now + HEARTBEAT_EVERY_SECONDS
            beat = h.heartbeat.read().beat
            if beat is not None:
                if beat.time != s.attempt.last_beat_time:  # the machine takes each beat once: the same is no news
                    obs.append(HeartbeatSeen(beat.step, beat.time, beat.status, beat.loss, beat.grad_norm, beat.diverged,
                                             beat.replay))
                self.timeline.beat(s.job.id, h.row_id, beat)
                self.progress.beat(s.job.id, h.row_id, beat)
        for death, seen in deaths:
            obs.append(WorkerDied(death))
            self.timeline.phase(h.row_id, "worker_exit", seen)  # the first death's, once
        if self._pids_due or not h.pids_looked or h.exit_reported or h.proc is None:
            h.pids_looked = True
            if self._index is None:
                self._index = proctree.tag_index()
            h.pids = h.procs.pids(self._index)
            h.seen_pids.update(h.pids)
        if (s.phase is Phase.RUNNING and s.attempt.last_progress is None and s.ledger.gpus and h.files is not None
                and self.gpu_computing is not None and now - h.activity_checked >= ACTIVITY_EVERY_SECONDS):
            obs.append(self._activity(s, h, now))
        if ended is not None:
            h.exit_reported = True
            obs.append(ended)
            self._timeline_exit(h)
            h.pids = h.procs.pids()  # a fresh look (the turn's index may predate the exit): all gone now?
        if h.exit_reported and h.procs.gone(h.pids):
            obs.append(AllGone())
            self.timeline.phase(h.row_id, "group_dead")
        return obs

    def _activity(self, s: TrackedJob, h: AttemptHandles, now: float) -> ActivitySeen:
        """Did any of the attempt's GPUs compute, or its log grow, since the last look?"""
        assert h.files is not None and self.gpu_computing is not None
        h.activity_checked = now
        size = attempt_files.log_size(h.files)
        grew, h.log_size = size != h.log_size, size
        return ActivitySeen(grew or any(self.gpu_computing(g) is not False for g in s.ledger.gpus))

    @staticmethod
    def _launcher_status(h: AttemptHandles) -> LauncherExited | None:
        """How the launcher ended, or None while it runs. Ours: Popen's status (negative codes are
        signals). Adopted (not our child): what its monitor recorded (`adopted_end`)."""
        if h.proc is None:
            return adopted_end(h)
        rc = h.proc.poll()
        if rc is None:
            return None
        return LauncherExited(None, -rc) if rc < 0 else LauncherExited(rc, None)

    def _timeline_exit(self, h: AttemptHandles) -> None:
        """The failure phases known at the exit: when the monitor recorded it, when we saw it."""
        record = (launcher.recorded_exit(h.files.log_dir, h.files.log_name, h.attempt_id)
                  if h.files is not None and h.attempt_id and h.row_id is not None else None)
        if record is not None and record.ended is not None:
            self.timeline.phase(h.row_id, "launcher_exit", record.ended)
        self.timeline.phase(h.row_id, "failure_seen")
        self.progress.exited(h.row_id)

    # --- performing ----------------------------------------------------------------------------------

    def signal(self, job: JobRow, a: SignalTerm | SignalKill) -> None:
        h = self.handles.get(job.id)
        if h is not None and h.attempt_id is not None and not h.launching:
            h.procs.signal(signal.SIGTERM if isinstance(a, SignalTerm) else signal.SIGKILL)

    def remove_cgroup(self, job: JobRow, a: RemoveCgroup) -> None:
        h = self.handles.get(job.id)
        if h is not None and h.cgroup is not None:
            # Read before it goes: the kernel's high-water mark of the attempt's memory (`spx history`).
            h.memory_peak = cgroups.memory_peak(h.cgroup)
            if not cgroups.remove(h.cgroup):  # the sweep retries it
                log.warning("attempt_cgroup_not_removed", job=job.name, attempt=h.number, cgroup=str(h.cgroup))
            h.cgroup = None

    def note(self, job: JobRow, text: str) -> None:
        h = self.handles.get(job.id)
        if h is not None and h.files is not None:
            attempt_files.note(h.files, text)

    def log(self, job: JobRow, s: TrackedJob, a: Log, number: int | None = None) -> None:
        fields = dict(a.fields)
        if a.event in _WITH_PROCESSES:  # the machine knows no pids or cgroups: they are added here
            h = self.handles.get(job.id)
            fields["pids"] = list(h.pids) if h else []
            fields["cgroup"] = str(h.cgroup) if h and h.cgroup else None
        getattr(log, a.level)(a.event, job=job.name, attempt=number or s.number or None, **fields)

    # --- views ---------------------------------------------------------------------------------------

    def live_pids(self, names: dict[int, str]) -> dict[str, list[int]]:
        return {names[j]: list(h.pids) for j, h in list(self.handles.items()) if j in names and h.attempt_id}

    def children(self) -> set[int]:
        """Our own children whose status Popen reads (monitors, relays): not for the reaper."""
        return {p.pid for h in list(self.handles.values()) for p in (h.proc, h.relay) if p is not None}

    def cgroups(self) -> set[Path]:
        return {h.cgroup for h in list(self.handles.values()) if h.cgroup is not None}
