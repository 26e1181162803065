"""Kept as-user helpers: `as_user.run(..., session=True)` for work a job does every second, and for
the calls of an attempt's preparation (its checkpoint dir, its lease, checkpoint discovery), which
then start one process instead of one each (~70–110 ms a process here, on the path of every
relaunch) and release it when done (`release`): between attempts the owner keeps no process of
ours, so `userdel` of an owner whose job waits to restart works as before.

A one-shot `as_user.run` starts a Python process as the owner for each call (~50 ms of CPU): for
the generation beat of a job across hosts, once a second for the job's whole life, that is 5 % of a
core per job before any training. A session is the same child (`user_actions --serve`: imports
done as root, then it becomes the owner once) kept between calls: a request is a line on its stdin,
the answer a line on its stdout.

What a one-shot call promises, a session keeps: each call has its deadline, and a session that
misses it — the owner stopped it, their storage hangs — is killed with its process group and
dropped (the call raises UserPathError; the next call starts a fresh one), so a stuck session costs
its job one timeout, as a stuck child did. An answer longer than MAX_REPLY_BYTES or not one line
of JSON is an error too. Sessions are per user identity (uid, gid, groups), one per call in flight
(the owner's lane runs at most a few at once), and none is kept idle past IDLE_SECONDS or used past
MAX_AGE_SECONDS (a user's changed groups are picked up then): a job that ends leaves no process
behind for long. The child exits at EOF on its stdin, so a daemon that dies takes its sessions with it.
"""

from __future__ import annotations

import errno
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from spx.daemon.userfs.fsafe import UserPathError

IDLE_SECONDS = 30.0
MAX_AGE_SECONDS = 300.0
MAX_REPLY_BYTES = 1 << 20


class _Session:
    def __init__(self, ids: dict[str, Any] | None, env: dict[str, str], now: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-m", "spx.daemon.userfs.user_actions", "--serve"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd="/", env=env,
            close_fds=True, start_new_session=True, umask=0o022,
        )
        self.started = self.used = now
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._in, self._out = self.proc.stdin.fileno(), self.proc.stdout.fileno()
        os.set_blocking(self._out, False)
        os.write(self._in, json.dumps({"as": ids}).encode() + b"\n")

    def ask(self, request: bytes, deadline: float) -> bytes:
        """The answer line to `request` (one line, no newline in it), by the monotonic `deadline`."""
        os.write(self._in, request + b"\n")  # the pipe is empty: the child read the last request
        got = b""
        while b"\n" not in got:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            if not select.select([self._out], [], [], left)[0]:
                continue
            chunk = os.read(self._out, 65536)
            if not chunk:
                raise EOFError
            got += chunk
            if len(got) > MAX_REPLY_BYTES:
                raise OverflowError
        line, rest = got.split(b"\n", 1)
        if rest:  # one answer per request, never more
            raise OverflowError
        return line

    def close(self) -> None:
        """Killed with its process group (a stuck child may have started others) and reaped if it can be."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()
        try:
            self.proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:  # stuck in the kernel (a dead mount): the daemon's reaper gets it
            pass


class Sessions:
    """The kept sessions by user identity; `call` is safe from any thread."""

    def __init__(self, env: dict[str, str], clock: Callable[[], float] = time.monotonic) -> None:
        self.env = env
        self.clock = clock
        self._lock = threading.Lock()
        self._idle: dict[str, list[_Session]] = {}
        self._sweeper: threading.Thread | None = None
        self._closing = threading.Event()
        self.started = 0  # sessions started (the tests count them)

    def call(self, ids: dict[str, Any] | None, who: str, action: str, request: bytes, timeout: float) -> bytes:
        """The answer line of `request` from a session of `ids`; UserPathError when there is none in time."""
        key = json.dumps(ids, sort_keys=True)
        deadline = time.monotonic() + timeout
        try:
            session = self._take(key, ids)
        except OSError as e:
            raise UserPathError(e.errno or errno.EIO, f"cannot run as {who}: {e.strerror}") from e
        try:
            line = session.ask(request, deadline)
        except TimeoutError:
            session.close()
            raise UserPathError(errno.ETIMEDOUT, f"{action} as {who} took longer than {timeout:g} s") from None
        except (OSError, EOFError, OverflowError) as e:
            session.close()
            code = session.proc.returncode
            why = "gave an answer that is not one line" if isinstance(e, OverflowError) else f"ended (exit {code})"
            raise UserPathError(errno.EIO, f"{action} as {who} failed: its session {why}") from None
        session.used = self.clock()
        self._keep(key, session)
        return line

    def release(self, ids: dict[str, Any] | None) -> None:
        """Close the idle sessions of `ids` now (one in a call is not idle: its caller keeps it)."""
        with self._lock:
            idle = self._idle.pop(json.dumps(ids, sort_keys=True), [])
        for session in idle:
            session.close()

    def _keep(self, key: str, session: _Session) -> None:
        with self._lock:
            self._idle.setdefault(key, []).append(session)
            if self._sweeper is None:  # kept sessions are swept while there are any
                self._sweeper = threading.Thread(target=self._sweep, name="as-user-sessions", daemon=True)
                self._sweeper.start()

    def _take(self, key: str, ids: dict[str, Any] | None) -> _Session:
        now = self.clock()
        with self._lock:
            spare = self._idle.get(key, [])
            while spare:
                session = spare.pop()
                if now - session.started < MAX_AGE_SECONDS and session.proc.poll() is None:
                    return session
                session.close()
            self.started += 1
        return _Session(ids, self.env, now)

    def sweep(self) -> int:
        """Close the sessions idle past IDLE_SECONDS or older than MAX_AGE_SECONDS; how many are kept."""
        now = self.clock()
        with self._lock:
            stale = [s for spare in self._idle.values() for s in spare
                     if now - s.used >= IDLE_SECONDS or now - s.started >= MAX_AGE_SECONDS]
            for key, spare in list(self._idle.items()):
                self._idle[key] = [s for s in spare if s not in stale]
                if not self._idle[key]:
                    del self._idle[key]
            kept = sum(len(spare) for spare in self._idle.values())
        for session in stale:
            session.close()
        return kept

    def close(self) -> None:
        """Every kept session closed and the sweeper ended (the daemon's stop; a test's end)."""
        with self._lock:
            kept = [s for spare in self._idle.values() for s in spare]
            self._idle.clear()
            sweeper = self._sweeper
        for session in kept:
            session.close()
        if sweeper is not None:
            self._closing.set()
            sweeper.join()
            self._closing.clear()

    def _sweep(self) -> None:
        """The sweeper thread: runs while sessions are kept, and ends with the last one."""
        while True:
            self._closing.wait(IDLE_SECONDS / 3)
            with self._lock:
                if not self._idle:
                    self._sweeper = None
                    return
            self.sweep()
