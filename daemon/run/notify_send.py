"""One notification sent, off the main loop, in the job owner's lane (run/notify.py submits these).

Both ways run as the job's owner, in a process of its own session that is killed with that
session at the call's deadline — a hook that hangs costs its owner one lane slot for at most
`timeout_seconds`, never the loop or another user:

- the webhook: `as_user.run(owner, "post_webhook", …)` (userfs/webhook.py: POST, no redirect, no
  proxy, a capped answer);
- the command: the owner's argv, started with the owner's uid, gid and groups (the kernel's switch in
  `subprocess`, before exec), in `/` with a fixed environment (PATH, HOME, USER, LOGNAME and the
  event's SPX_* fields), the event's JSON on stdin; its output is discarded but for the last
  STDERR_TAIL_BYTES of stderr, kept for the log line of a failure.

Each raises (NotifyFailed or the as_user error) when the call failed: the caller retries with backoff.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import threading
from typing import Any

from spx.daemon.userfs import as_user
from spx.daemon.userfs.as_user import SAFE_ENV, Owner

STDERR_TAIL_BYTES = 400
REAP_SECONDS = 2.0  # as_user's kill of the webhook's child comes this long after its own timeout


# The sessions of hook commands running now (their leaders' pids): a daemon that stops or re-executes
# kills them (`kill_running`), so no hook outlives the daemon that started it.
_RUNNING: set[int] = set()
_RUNNING_LOCK = threading.Lock()
_stopping = False  # set by kill_running: a hook a lane starts after it is killed at once


class NotifyFailed(RuntimeError):
    """The hook ran and failed (non-zero exit, killed at its deadline, or could not start)."""


def post_webhook(owner: Owner, url: str, body: dict[str, Any], timeout: float) -> str:
    """POST `body` to `url` as `owner`; what the server answered ("HTTP 200")."""
    # The child's own socket timeout is the deadline; as_user's kill a little later is the backstop.
    reply = as_user.run(owner, "post_webhook", {"url": url, "body": json.dumps(body), "timeout": timeout},
                        timeout + REAP_SECONDS)
    return f"HTTP {reply.get('status')}" if isinstance(reply, dict) else "sent"


def hook_env(owner: Owner, body: dict[str, Any]) -> dict[str, str]:
    """The command's environment: the fixed one, the owner's names, the event's fields as SPX_*."""
    env = dict(SAFE_ENV, HOME=owner.home, USER=owner.name, LOGNAME=owner.name)
    for key in ("event", "job", "state", "reason", "class", "attempts", "root_cause", "owner"):
        value = body.get(key)
        if value is not None:
            env[f"SPX_{key.upper()}"] = str(value).replace("\0", "")  # a log's NUL would refuse the exec
    return env


def run_command(owner: Owner, argv: list[str], body: dict[str, Any], timeout: float) -> str:
    """Run the hook `argv` as `owner` with `body` on stdin; "exit 0", or NotifyFailed."""
    switch = owner.to_json()  # None: the daemon runs as this owner already (or is not root)
    ids: dict[str, Any] = {} if switch is None else {
        "user": owner.uid, "group": owner.gid, "extra_groups": list(owner.groups)}
    with tempfile.TemporaryFile() as stdin, tempfile.TemporaryFile() as stderr:
        stdin.write(json.dumps(body).encode())
        stdin.seek(0)
        try:
            proc = subprocess.Popen(argv, stdin=stdin, stdout=subprocess.DEVNULL, stderr=stderr, cwd="/",
                                    env=hook_env(owner, body), close_fds=True, start_new_session=True,
                                    umask=0o077, **ids)
        except (OSError, ValueError) as e:
            raise NotifyFailed(f"cannot start {argv[0]!r} as {owner.name}: {e}") from None
        # A blocking wait with a timer that kills, not a polling wait: the daemon's orphan reaper
        # (proctree.reap_orphans) could collect a polled child's status between two polls.
        killer = threading.Timer(timeout, _kill_session, (proc.pid,))
        with _RUNNING_LOCK:
            _RUNNING.add(proc.pid)
            if _stopping:
                _kill_session(proc.pid)
        killer.start()
        try:
            code = proc.wait()
        finally:
            killer.cancel()
            with _RUNNING_LOCK:
                _RUNNING.discard(proc.pid)
        if killer.finished.is_set() and code < 0:
            raise NotifyFailed(f"killed at its deadline ({timeout:g} s)")
        if code != 0:
            raise NotifyFailed(f"exit {code}" + _tail(stderr))
    return "exit 0"


def _kill_session(pid: int) -> None:
    """SIGKILL the hook's whole session (what it started too); the waiting lane reaps the leader."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def kill_running() -> int:
    """SIGKILL the session of every hook command running now, and of any started after (the daemon
    stops or re-executes); how many were running."""
    global _stopping
    with _RUNNING_LOCK:
        _stopping = True
        for pid in _RUNNING:
            _kill_session(pid)
        return len(_RUNNING)


def _tail(stderr: Any) -> str:
    size = stderr.seek(0, os.SEEK_END)
    stderr.seek(max(0, size - STDERR_TAIL_BYTES))
    text = stderr.read(STDERR_TAIL_BYTES).decode("utf-8", "replace").strip()
    return f": {text.splitlines()[-1]}" if text else ""
