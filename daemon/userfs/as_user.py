"""Run a small action as the job's owner: decisions about the user's tree are made by the kernel,
for that user, with that user's groups — never by root guessing from mode bits, and never by root
walking a tree the user can rearrange under it.

`run(user, action, args, timeout)` starts `python -I -m spx.daemon.userfs.user_actions` (the daemon's
own interpreter, in its own session, in `/`, with a fixed environment; with `session=True`, a kept
child of as_user_session answers instead of a new one); the child imports all it
needs while still root — the interpreter may live where the user cannot read (a pyenv under /root) —
then `become`s the owner: supplementary groups (`os.getgrouplist`), gid, uid, all three ids, before
it touches a single user path. The request goes in on stdin, one JSON document comes back on stdout. A child
that outlives `timeout` is killed with its session and the call raises UserPathError, so a hung NFS
mount or a FIFO maze in the user's tree costs one timeout, not the daemon. Slow: a process start
(~50 ms) per call — call it off the main loop where it can wait on storage.
"""

from __future__ import annotations

import errno
import json
import os
import pwd
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from spx.daemon.core import bounded
from spx.daemon.userfs import user_actions
from spx.daemon.userfs.as_user_session import Sessions
from spx.daemon.userfs.fsafe import UserPathError
from spx.daemon.userfs.identity import become

__all__ = ["Owner", "become", "check_access", "find_latest", "mkdirs", "owner", "run"]

SAFE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1"}
MAX_REPLY_BYTES = 1 << 20
# Actions that never block on what they find (stat, access, mkdir): run in-process when no switch of
# user is needed. Checkpoint discovery opens files (a FIFO would block) and always gets a process.
IN_PROCESS = frozenset({"access", "mkdirs"})
DEFAULT_TIMEOUT_SECONDS = 10.0
SESSIONS = Sessions(SAFE_ENV)


@dataclass(frozen=True)
class Owner:
    """A job's owner as the host knows them now: what a process needs to become them."""

    uid: int
    gid: int
    name: str
    home: str
    groups: tuple[int, ...]

    def to_json(self) -> dict[str, Any] | None:
        """What a child needs to `identity.become` this user; None when it already is (a non-root daemon
        cannot switch and runs everything as itself)."""
        if os.geteuid() != 0 or self.uid == os.geteuid():
            return None
        return {"uid": self.uid, "gid": self.gid, "groups": list(self.groups)}


def owner(uid: int) -> Owner:
    """The account of `uid`; UserPathError if it has none any more (deleted while its job lived)."""
    try:
        pw = pwd.getpwuid(uid)
    except KeyError:
        raise UserPathError(errno.ENOENT, f"the job's owner (uid {uid}) has no account on this host any more") from None
    return Owner(pw.pw_uid, pw.pw_gid, pw.pw_name, pw.pw_dir, tuple(os.getgrouplist(pw.pw_name, pw.pw_gid)))


def run(user: Owner, action: str, args: dict[str, Any], timeout: float = DEFAULT_TIMEOUT_SECONDS,
        session: bool = False) -> Any:
    """The result of `action` (see user_actions.ACTIONS) run as `user`; UserPathError on timeout, on
    a failed start, or when the action itself failed. `session`: in a kept child (as_user_session),
    for what a job does every second."""
    ids = user.to_json()
    if ids is None and action in IN_PROCESS:
        # Nobody to become (the owner is the daemon's own user, root's own job): the answer is the
        # same in this process, without the ~50 ms of a process start on the intake path.
        try:
            return json.loads(json.dumps(user_actions.ACTIONS[action](args)))
        except Exception as e:
            raise UserPathError(errno.EIO, f"{action} as {user.name} failed: {type(e).__name__}: {e}") from e
    if session:
        line = SESSIONS.call(ids, user.name, action, json.dumps({"action": action, "args": args}).encode(), timeout)
        return _result(line, action, user)
    request = json.dumps({"action": action, "args": args, "as": ids}).encode()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-m", "spx.daemon.userfs.user_actions"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/", env=SAFE_ENV,
            close_fds=True, start_new_session=True, umask=0o022,
        )
    except OSError as e:
        raise UserPathError(e.errno, f"cannot run as {user.name}: {e.strerror}") from e
    try:
        out, err = proc.communicate(request, timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            proc.communicate(timeout=1.0)
        except subprocess.TimeoutExpired:  # stuck in the kernel (a dead mount): the reaper gets it later
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
        raise UserPathError(errno.ETIMEDOUT, f"{action} as {user.name} took longer than {timeout:g} s") from None
    if not out.lstrip().startswith(b"{"):  # no answer: the child's last words say why
        tail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        raise UserPathError(errno.EIO, f"{action} as {user.name} failed: {tail[0]}")
    return _result(out, action, user)


def _result(out: bytes, action: str, user: Owner) -> Any:
    try:
        # What the child read in the user's tree comes back in it: through core.bounded, so no number
        # or nesting there reaches the daemon unbounded.
        reply = bounded.Fields(bounded.parse_json(out, f"the answer of {action}", max_bytes=MAX_REPLY_BYTES),
                               f"the answer of {action}").doc
    except bounded.Garbage as e:
        raise UserPathError(errno.EIO, f"{action} as {user.name} gave an unreadable answer: {e.detail}") from None
    if not reply.get("ok"):
        raise UserPathError(errno.EIO, f"{action} as {user.name} failed: {reply.get('error')}")
    return reply["result"]


def release(user: Owner) -> None:
    """The idle sessions of `user` closed: the calls that shared one (an attempt's preparation) are done."""
    SESSIONS.release(user.to_json())


def mkdirs(user: Owner, paths: list[str], mode: int = 0o750, timeout: float = DEFAULT_TIMEOUT_SECONDS,
           session: bool = False) -> None:
    """mkdir -p each of `paths` as `user`; UserPathError naming the first that fails."""
    problems = run(user, "mkdirs", {"paths": paths, "mode": mode}, timeout, session)
    if problems:
        raise UserPathError(errno.EACCES, f"{problems[0]} (as {user.name})")


def check_access(user: Owner, checks: list[tuple[str, str]],
                 timeout: float = DEFAULT_TIMEOUT_SECONDS, session: bool = False) -> list[str | None]:
    """For each (path, what), in order: None if `user` may, else why not. `what` is one of
    enter-dir, read-tree, read-file, write-or-create, owned (see user_actions)."""
    result = run(user, "access", {"checks": [{"path": p, "what": w} for p, w in checks]}, timeout, session)
    if not isinstance(result, list) or len(result) != len(checks):
        raise UserPathError(errno.EIO, f"access check as {user.name} gave an odd answer")
    return [None if p is None else str(p) for p in result]


def set_aside(user: Owner, ckpt_dir: str, before: float, into: str, timeout: float,
              from_step: int | None = None, session: bool = False) -> list[str]:
    """`user_actions._set_aside` run as `user`: the entries moved into `ckpt_dir/into` — those older
    than `before`, or (`from_step`) the spx.trainer checkpoints of that step and later."""
    result = run(user, "set_aside", {"dir": ckpt_dir, "before": before, "into": into, "from_step": from_step}, timeout,
                 session)
    if not isinstance(result, list):
        raise UserPathError(errno.EIO, f"setting aside earlier checkpoints as {user.name} gave an odd answer")
    return [str(r) for r in result]


def find_latest(user: Owner, ckpt_dir: str, pattern: str | None, timeout: float,
                exclude: dict[str, str] | None = None, local_dir: str | None = None,
                before_step: int | None = None, session: bool = False) -> dict[str, Any]:
    """`checkpoint_discovery.discover` run as `user`: its capped JSON answer ("path" None: nothing
    complete to resume from). `exclude` maps checkpoint paths not to choose to the reason;
    `before_step` (a divergence rollback) passes over those at or after it."""
    result = run(user, "find_latest", {"dir": ckpt_dir, "pattern": pattern, "exclude": exclude or {},
                                       "local_dir": local_dir, "before_step": before_step}, timeout, session)
    if not isinstance(result, dict):
        raise UserPathError(errno.EIO, f"checkpoint discovery as {user.name} gave an odd answer")
    return result
