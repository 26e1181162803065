"""Run one checkpoint write at a time on a background thread.

The writer thread serialises and fsyncs while training continues (torch's zip writer and fsync
release the GIL). At most one job is in flight: `submit` first waits for the previous one, which
bounds host memory to one snapshot and keeps checkpoints published in step order. A job that
raises is logged at once and its exception is kept for `wait()`; the job itself is responsible for
never publishing a checkpoint it did not finish, so a failure leaves only a staging directory.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger("spx.trainer")


class BackgroundSaver:
    """A single-slot background executor with error reporting."""

    def __init__(self, name: str = "spx-checkpoint") -> None:
        self._name = name
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.failures = 0

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def submit(self, job: Callable[[], None], label: str) -> BaseException | None:
        """Start `job` in the background after the previous job finished; returns that one's error."""
        previous_error = self.wait()
        thread = threading.Thread(target=self._run, args=(job, label), name=self._name, daemon=False)
        self._thread = thread
        thread.start()
        return previous_error

    def _run(self, job: Callable[[], None], label: str) -> None:
        try:
            job()
        except BaseException as exc:  # reported, never silently dropped
            self.failures += 1
            self._error = exc
            log.error("background checkpoint %s failed: %r (it was not published)", label, exc, exc_info=exc)

    def wait(self) -> BaseException | None:
        """Block until no job is in flight; return (and clear) the error of the last job, if any."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        return error
