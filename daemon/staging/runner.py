"""Run data staging for a job before its first attempt, as the job's user, without blocking.

The copier is `python -m spx.daemon.staging.copier SRC DST` in its own process (running as the owner, so
the user's permissions apply, and killable like any attempt); this module reads its JSON progress
lines without blocking the main loop and turns them into the job's `staging` text.
"""

from __future__ import annotations

import os
import pwd
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from spx.daemon.staging import copier

STAGED_PREFIX = "staged "


@dataclass
class StagingRun:
    job_id: int
    proc: subprocess.Popen
    log_file: Path
    buffer: bytes = b""
    last: copier.StageProgress | copier.StageResult | copier.StageFailure | None = None
    lines: list[str] = field(default_factory=list)

    def poll(self) -> bool:
        """Read what is available; True once the copier has exited."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            self.buffer += chunk
        *complete, self.buffer = self.buffer.split(b"\n")
        for raw in complete:
            line = raw.decode("utf-8", "replace")
            try:
                self.last = copier.parse_event(line)
            except (ValueError, TypeError):
                continue
            with self.log_file.open("a") as f:
                f.write(f"spx: {self.text()}\n")
        return self.proc.poll() is not None

    def text(self) -> str:
        if isinstance(self.last, copier.StageFailure):
            return f"staging failed: {self.last.error}"
        if self.last is None:
            return "staging: starting"
        return self.last.summary()

    @property
    def succeeded(self) -> bool:
        return self.proc.returncode == 0 and isinstance(self.last, copier.StageResult)


def start_staging(job_id: int, src: Path, dst: Path, uid: int, log_file: Path) -> StagingRun:
    user = pwd.getpwuid(uid)
    proc = copier.spawn(src, dst, uid=uid, gid=user.pw_gid)
    assert proc.stdout is not None
    os.set_blocking(proc.stdout.fileno(), False)
    return StagingRun(job_id, proc, log_file)


def staging_done(staging_text: str | None) -> bool:
    return bool(staging_text and staging_text.startswith(STAGED_PREFIX))
