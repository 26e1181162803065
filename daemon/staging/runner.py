"""Run data staging for a job before its first attempt, as the job's user, without blocking.

The copier is `python -m spx.daemon.staging.copier SRC DST` in its own process (running as the owner,
with the owner's groups, so the user's permissions apply, and killable like any attempt); this module
reads its JSON progress lines without blocking the main loop and turns them into the job's `staging`
text, noted in `log/NAME/staging.log` (root's directory; the file is the owner's to read, and the
config's `log_group`'s if set, as the attempt logs are: written through `fsafe`).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from spx.daemon.core.log import get_logger
from spx.daemon.core.users import LogAccess, log_access
from spx.daemon.staging import copier
from spx.daemon.userfs import as_user, fsafe

log = get_logger()

STAGED_PREFIX = "staged "


@dataclass
class StagingRun:
    job_id: int
    proc: subprocess.Popen
    log_file: Path
    readers: LogAccess = LogAccess()
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
            self._note(f"spx: {self.text()}\n")
        return self.proc.poll() is not None

    def _note(self, line: str) -> None:
        try:
            fsafe.append_text(self.log_file, self.log_file.parent.parent, line, self.readers.file_mode,
                              self.readers.uid, self.readers.gid)
        except OSError as e:
            log.warning("staging_log_failed", job=self.log_file.parent.name, attempt=None, error=str(e))

    def text(self) -> str:
        if isinstance(self.last, copier.StageFailure):
            return f"staging failed: {self.last.error}"
        if self.last is None:
            return "staging: starting"
        return self.last.summary()

    @property
    def succeeded(self) -> bool:
        return self.proc.returncode == 0 and isinstance(self.last, copier.StageResult)


def start_staging(job_id: int, src: Path, dst: Path, uid: int, log_file: Path,
                  readers: LogAccess | None = None) -> StagingRun:
    """Start the copier as `uid` with its groups; UserPathError (an OSError) if the account is gone.
    Its log is for `readers` (core.users.log_access; default: the owner alone)."""
    user = as_user.owner(uid)
    proc = copier.spawn(src, dst, uid=uid, gid=user.gid, groups=list(user.groups))
    assert proc.stdout is not None
    os.set_blocking(proc.stdout.fileno(), False)
    return StagingRun(job_id, proc, log_file, readers or log_access(user.uid, None))


def staging_done(staging_text: str | None) -> bool:
    return bool(staging_text and staging_text.startswith(STAGED_PREFIX))
