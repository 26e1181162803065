"""One live attempt: its processes, its heartbeat, and how it is being stopped.

The supervisor owns these; this module keeps the per-attempt bookkeeping (progress, hang clock,
stop phases) so the supervisor's loop reads as policy, not as process plumbing.
"""

from __future__ import annotations

import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from spx.daemon.contract import worker_env
from spx.daemon.run import proctree

# After the launcher exits on its own, leftovers (escaped grandchildren) get this long to die
# from SIGKILL before the attempt is declared over anyway, with a warning.
LEFTOVER_KILL_SECONDS = 10.0


@dataclass
class LiveAttempt:
    job_id: int
    name: str
    number: int
    row_id: int
    attempt_id: str
    proc: subprocess.Popen | None  # None: adopted after a daemon restart (not our child)
    pgid: int | None
    started_mono: float
    started_wall: float
    grace_seconds: float
    hang_timeout_seconds: float
    heartbeat_file: Path
    log_file: Path
    resumed_from_step: int | None
    cgroup: Path | None = None  # the attempt's own cgroup, where the daemon manages cgroups
    last_step: int | None = None
    last_progress_mono: float | None = None
    last_beat_time: float = 0.0
    beat_status: str | None = None
    stop_cause: str | None = None
    term_sent_mono: float | None = None
    kill_sent_mono: float | None = None
    exited_mono: float | None = None
    returncode: int | None = None
    pids: list[int] = field(default_factory=list)
    seen_pids: set[int] = field(default_factory=set)  # every pid ever seen, for the OOM check
    pids_checked_mono: float = 0.0
    hang_idle: float | None = None

    # --- progress -------------------------------------------------------------------------------

    def observe_heartbeat(self, now_mono: float) -> None:
        """Read the heartbeat; a beat counts only if written during this attempt."""
        beat = worker_env.read_heartbeat(self.heartbeat_file)
        if beat is None or beat.time < self.started_wall or beat.time == self.last_beat_time:
            return
        self.last_beat_time = beat.time
        self.beat_status = beat.status
        if self.last_step is None or beat.step != self.last_step:
            self.last_step = beat.step
            self.last_progress_mono = now_mono

    def hung_for(self, now_mono: float) -> float | None:
        """Seconds without step progress, once past the timeout; None otherwise. The clock starts
        at the first heartbeat: scripts that write none are supervised on exit status alone."""
        if self.last_progress_mono is None or self.stop_cause is not None:
            return None
        idle = now_mono - self.last_progress_mono
        return idle if idle > self.hang_timeout_seconds else None

    @property
    def progressed(self) -> bool:
        if self.last_step is None:
            return False
        return self.resumed_from_step is None or self.last_step > self.resumed_from_step

    # --- processes ------------------------------------------------------------------------------

    @property
    def procs(self) -> proctree.AttemptProcesses:
        return proctree.AttemptProcesses(self.attempt_id, self.pgid, self.cgroup)

    def launcher_exited(self) -> bool:
        if self.returncode is not None:
            return True
        if self.proc is not None:
            rc = self.proc.poll()
            if rc is None:
                return False
            self.returncode = rc
            return True
        return not self.procs.pids()

    def begin_stop(self, cause: str, now_mono: float) -> None:
        """SIGTERM to the whole attempt; SIGKILL follows after the grace period (see `advance_stop`)."""
        # A cancel wins over any other reason to stop: the user's intent is that it ends for good.
        if self.stop_cause is None or cause == "cancel":
            self.stop_cause = cause
        if self.term_sent_mono is None:
            self.term_sent_mono = now_mono
            self.procs.signal(signal.SIGTERM)

    def advance_stop(self, now_mono: float) -> None:
        """Escalate: SIGKILL after the grace period, or at once for leftovers of a launcher that
        already exited (the attempt is over; nothing of it may keep running)."""
        due = (
            self.exited_mono is not None
            or (self.term_sent_mono is not None and now_mono - self.term_sent_mono >= self.grace_seconds)
        )
        if due and (self.kill_sent_mono is None or now_mono - self.kill_sent_mono >= 1.0):
            self.kill_sent_mono = now_mono
            self.procs.signal(signal.SIGKILL)

    def refresh_pids(self, now_mono: float, every: float = 2.0) -> None:
        """Keep `pids` (shown in metrics and used for GPU memory attribution) roughly current."""
        if now_mono - self.pids_checked_mono >= every:
            self.pids_checked_mono = now_mono
            self.pids = self.procs.pids()
            self.seen_pids.update(self.pids)

    def all_gone(self) -> bool:
        procs = self.procs
        self.pids = procs.pids()
        return procs.gone(self.pids)

    def exit_status(self) -> tuple[int | None, int | None]:
        """(exit code, signal) of the launcher; negative Popen codes are signals."""
        rc = self.returncode
        if rc is None:
            return None, None
        if rc < 0:
            return None, -rc
        if rc > 128 and self.proc is None:
            return None, rc - 128
        return rc, None
