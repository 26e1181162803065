"""SIGTERM as a request to checkpoint and stop, not an instant death.

Spot reclaim, `systemctl stop` and `spx cancel` all arrive as SIGTERM (the daemon signals the whole
process group; torchrun's agent forwards it to its workers and SIGKILLs them ~30 s later). The
handler only sets a flag: the training loop finishes the current step, all ranks agree on the
stop, write a synchronous checkpoint and exit with `EXIT_PREEMPTED`.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any

from spx.daemon.contract.worker_env import EXIT_PREEMPTED

log = logging.getLogger("spx.trainer")


class Preempted(SystemExit):
    """Raised after the preemption checkpoint is written; uncaught it exits with status 75."""

    def __init__(self, step: int) -> None:
        super().__init__(EXIT_PREEMPTED)
        self.step = step


class StopFlag:
    """Set by SIGTERM (or `request()`); installing needs the main thread, as `signal` does."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._previous: Any = None
        self._installed = False

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            log.warning("not on the main thread: SIGTERM will not trigger a preemption checkpoint")
            return
        self._previous = signal.signal(signal.SIGTERM, self._on_signal)
        self._installed = True

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if not self._event.is_set():
            # Logging from a signal handler can deadlock on the handler's lock; write directly.
            os.write(2, b"spx.trainer: SIGTERM received, checkpointing after this step\n")
        self._event.set()

    def request(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def uninstall(self) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous if self._previous is not None else signal.SIG_DFL)
            self._installed = False
