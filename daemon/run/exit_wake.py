"""One thread that waits on every pidfd the daemon holds: a launcher's exit wakes the main loop at
once, and a worker's exit is looked at the moment it happens (worker_watch.py).

The loop learns of an exit by polling each attempt's Popen once per turn, and when nothing wakes it
it turns once a second while its jobs run quietly (service/cadence.py): half a second on average, a
whole one at worst, added to every recovery (`spx status --timeline`: `launcher_exit` →
`failure_seen` was 0.22 s when it turned every 0.25 s, 0.03 s with the wake-up).
A pidfd becomes readable when its process exits, without reaping it (Popen still reads the status
on the loop's thread; a worker stays a zombie until its launcher reaps it, which is when its exit
status can still be read from /proc), so one thread polling all of them wakes the loop — one thread
for the daemon, however many launchers and workers it watches.

The thread decides nothing and touches no state: each watch's `on_exit` is called on it once, and
must be quick (a /proc read, a queue append, a wake). A missed call (no pidfd on an old kernel, a
pid already gone) costs exactly the tick it saves. `repeat` runs a function on the same thread every
few tenths of a second until it says it is done (worker_watch looks for an attempt's workers so).
The thread is a daemon thread and every fd it holds is close-on-exec, so a re-exec of the daemon
leaves nothing behind.
"""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Callable

from spx.daemon.core.log import get_logger

log = get_logger()


class ExitWatch:
    """Every pidfd the daemon waits on, polled by one thread (started at the first watch)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._lock = threading.Lock()
        self._watched: dict[int, tuple[int, Callable[[], None]]] = {}  # pidfd → (pid, on_exit)
        self._repeats: list[tuple[float, Callable[[], bool]]] = []  # (every, fn): fn() False = done
        self._interrupt_r, self._interrupt_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._thread: threading.Thread | None = None
        self._closed = False

    def watch(self, pid: int, on_exit: Callable[[], None]) -> bool:
        """Call `on_exit()` on the watch thread once process `pid` has exited; False if it cannot
        be watched (no pidfd on this kernel, or it is gone already: the caller's own polling sees it)."""
        try:
            fd = os.pidfd_open(pid)
        except OSError:  # ENOSYS on kernels before 5.3, ESRCH if it is gone already
            return False
        with self._lock:
            if self._closed:
                os.close(fd)
                return False
            self._watched[fd] = (pid, on_exit)
        self._poke()
        return True

    def repeat(self, every: float, fn: Callable[[], bool]) -> None:
        """Call `fn()` on the watch thread every `every` seconds (the first at once) until it
        returns False."""
        with self._lock:
            if self._closed:
                return
            self._repeats.append((every, fn))
        self._poke()

    def close(self) -> None:
        """Stop the thread; every pidfd is closed (the processes are not touched)."""
        with self._lock:
            self._closed = True
            if self._thread is None:
                self._close_pipe()
        self._poke()

    def _close_pipe(self) -> None:
        """(With the lock held.)"""
        if self._interrupt_w >= 0:
            os.close(self._interrupt_r)
            os.close(self._interrupt_w)
            self._interrupt_r = self._interrupt_w = -1

    def _poke(self) -> None:
        """Start the thread, or interrupt its poll so it takes in what changed."""
        with self._lock:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name="spx-exits", daemon=True)
                self._thread.start()
            if self._interrupt_w < 0:
                return
            try:
                os.write(self._interrupt_w, b"x")
            except BlockingIOError:  # a poke is pending already
                pass

    def _run(self) -> None:
        due: dict[Callable[[], bool], float] = {}
        try:
            while True:
                with self._lock:
                    if self._closed:
                        return
                    fds = list(self._watched)
                    repeats = list(self._repeats)
                now = self.clock()
                for every, fn in repeats:
                    if now >= due.setdefault(fn, now):
                        due[fn] = now + every
                        if not self._call(fn):
                            with self._lock:
                                self._repeats.remove((every, fn))
                            due.pop(fn, None)
                timeout = min((due[fn] for _, fn in repeats if fn in due), default=None)
                poller = select.poll()
                poller.register(self._interrupt_r, select.POLLIN)
                for fd in fds:
                    poller.register(fd, select.POLLIN)
                ready = poller.poll(None if timeout is None else max(0, int((timeout - self.clock()) * 1000) + 1))
                for fd, _ in ready:
                    if fd == self._interrupt_r:
                        self._drain()
                        continue
                    with self._lock:
                        pid_cb = self._watched.pop(fd, None)
                    os.close(fd)
                    if pid_cb is not None:
                        self._call(pid_cb[1])
        finally:
            with self._lock:
                for fd in self._watched:
                    os.close(fd)
                self._watched.clear()
                self._close_pipe()

    def _drain(self) -> None:
        try:
            while os.read(self._interrupt_r, 4096):
                pass
        except BlockingIOError:
            pass

    @staticmethod
    def _call(fn: Callable[[], object]) -> object:
        """`fn()`; an error is logged, never the end of the thread (one job's watch is not another's)."""
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 — contained: the loop's own polling still sees every exit
            log.error("exit_watch_error", job=None, attempt=None, error=f"{type(e).__name__}: {e}")
            return False
