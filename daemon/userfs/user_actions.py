"""The child side of `as_user`: one small action, run as the job's owner, answered as JSON.

    python -I -m spx.daemon.userfs.user_actions   < {"action": ..., "args": {...}}   (as_user.run runs it)
    python -I -m spx.daemon.userfs.user_actions --serve   (a session: as_user_session keeps it)

A session reads {"as": ...} first, becomes that user, then answers one request per line, one JSON
line each, until its stdin closes: a job's once-a-second work (the generation beat across hosts)
costs a line on a pipe, not a process start.

It starts as root (the interpreter may be unreadable to the user), imports everything, then becomes
the owner — uid, gid and supplementary groups — before reading the request's paths, so `os.access`,
`mkdir` and every open here are the kernel's answer for that user: a decision root could only guess
from mode bits.
stdlib, core.bounded and the torch-free checkpoint contract only; it prints exactly one JSON document.
"""

from __future__ import annotations

import encodings.cp437  # noqa: F401  zipfile decodes member names with it, lazily: load it while root
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

from spx.daemon.contract import checkpoint_tiers
from spx.daemon.contract.checkpoint_layout import step_of_dirname
from spx.daemon.userfs import gang_dir, spx_dir, webhook
from spx.daemon.userfs.identity import become

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _mkdirs(args: dict[str, Any]) -> list[str]:
    """mkdir -p each path; a problem per path that is not a directory this user can write into."""
    problems = []
    for path in args["paths"]:
        try:
            os.makedirs(path, mode=int(args.get("mode", 0o750)), exist_ok=True)
        except OSError as e:
            problems.append(f"cannot create {path}: {e.strerror}")
            continue
        if not os.access(path, os.W_OK | os.X_OK):
            problems.append(f"{path} is not writable")
    return problems


def _nearest_existing(path: str) -> str:
    probe = Path(path)
    while not os.path.lexists(probe) and probe != probe.parent:
        probe = probe.parent
    return str(probe)


def _check(path: str, what: str) -> str | None:
    """None if this user can do `what` with `path`, else why not."""
    if what in ("enter-dir", "read-tree"):
        # Not there (yet) is decided when it is used — the launch or the copier says so then; what
        # exists and is closed to this user is refused now.
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        except OSError as e:
            return f"{path} cannot be reached ({e.strerror})"
        if not stat.S_ISDIR(st.st_mode):
            return f"{path} is not a directory"
        if what == "enter-dir":
            return None if os.access(path, os.X_OK) else f"{path} cannot be entered (no search permission)"
        return None if os.access(path, os.R_OK | os.X_OK) else f"{path} is not readable"
    if what == "write-or-create":
        if os.path.isdir(path):
            return None if os.access(path, os.W_OK | os.X_OK) else f"{path} is not writable"
        if os.path.lexists(path):
            return f"{path} exists and is not a directory"
        parent = _nearest_existing(path)
        if not os.path.isdir(parent):
            return f"{path} cannot be created: {parent} is not a directory"
        return None if os.access(parent, os.W_OK | os.X_OK) else f"{path} cannot be created ({parent} is not writable)"
    if what == "read-file":
        # What the job runs (its script, its DeepSpeed config) must be there at submit: a missing
        # one would only show as a crash loop of "can't open file" attempts.
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return f"{path} does not exist"
        except OSError as e:
            return f"{path} cannot be reached ({e.strerror})"
        if not stat.S_ISREG(st.st_mode):
            return f"{path} is not a regular file"
        return None if os.access(path, os.R_OK) else f"{path} is not readable"
    if what == "owned":
        # Root's own jobs included: no job resumes from, or renames inside, a directory another
        # user controls (a reused name, a squatted default dir).
        try:
            uid = os.stat(path).st_uid
        except FileNotFoundError:
            return None
        except OSError as e:
            return f"{path}: {e.strerror}"
        return None if uid == os.getuid() else f"{path} exists and belongs to uid {uid}"
    raise ValueError(f"unknown check {what!r}")


def _access(args: dict[str, Any]) -> list[str | None]:
    return [_check(c["path"], c["what"]) for c in args["checks"]]


def _own_checkpoint_dir(path: str) -> None:
    """PermissionError unless the checkpoint dir (if there) belongs to this user: a job never resumes
    from, or sets aside files in, a directory another user controls (root's jobs included)."""
    try:
        uid = os.stat(path).st_uid
    except FileNotFoundError:
        return
    if uid != os.geteuid():
        raise PermissionError(f"checkpoint dir {path} belongs to uid {uid}, not to the job's owner "
                              f"(uid {os.geteuid()}): refused")


def _find_latest(args: dict[str, Any]) -> dict[str, Any]:
    """checkpoint_discovery's answer (capped): the checkpoint to resume from, its layout, the
    candidates skipped and why, the older complete ones; `exclude` maps paths not to choose to why;
    `before_step` (a divergence rollback) passes over checkpoints at or after that step."""
    _own_checkpoint_dir(str(args["dir"]))
    exclude = {str(k): str(v) for k, v in dict(args.get("exclude") or {}).items()}
    local = args.get("local_dir")
    before = args.get("before_step")
    found, _tier = checkpoint_tiers.discover_tiers(Path(args["dir"]), Path(local) if local else None,
                                                   args.get("pattern"), exclude,
                                                   int(before) if before is not None else None)
    return found.to_json()


def _set_aside(args: dict[str, Any]) -> list[str]:
    """`checkpoints.resume: never`: move what `dir` held before the job was submitted (mtime before
    `before`, hidden entries left alone) into `dir/<into>/`, so neither the daemon's discovery nor
    the trainer's own scan resumes from it; after a replay differed (`from_step`), the spx.trainer
    checkpoints of that step and later. Moved, not deleted: it is the user's data. Returns the
    names moved (none on a second call: the job's own checkpoints are newer). By directory fds:
    `into` must be a real directory of this user's (a link planted there is refused, never
    followed), and so must the checkpoint dir."""
    _own_checkpoint_dir(str(args["dir"]))
    try:
        base = os.open(args["dir"], os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # the owner's own path
    except FileNotFoundError:
        return []
    try:
        if os.fstat(base).st_uid != os.geteuid():
            raise PermissionError(f"checkpoint dir {args['dir']} is not the job owner's: refused")
        with os.scandir(base) as it:
            entries = [e for e in it if not e.name.startswith(".")]
        if args.get("from_step") is not None:
            first = int(args["from_step"])
            old = [e.name for e in entries if (step_of_dirname(e.name) or -1) >= first]
        else:
            old = [e.name for e in entries if e.stat(follow_symlinks=False).st_mtime < float(args["before"])]
        if not old:
            return []
        into = str(args["into"])
        if "/" in into or into in (".", ".."):
            raise ValueError(f"set-aside dir {into!r}")
        try:
            os.mkdir(into, 0o700, dir_fd=base)
        except FileExistsError:
            pass
        into_fd = os.open(into, _DIR_FLAGS, dir_fd=base)  # O_NOFOLLOW: a link at `into` is ELOOP
        try:
            if os.fstat(into_fd).st_uid != os.geteuid():
                raise PermissionError(f"{args['dir']}/{into} is not the job owner's: refused")
            for name in old:
                os.rename(name, name, src_dir_fd=base, dst_dir_fd=into_fd)
        finally:
            os.close(into_fd)
        return old
    finally:
        os.close(base)


ACTIONS = {"mkdirs": _mkdirs, "access": _access, "find_latest": _find_latest, "set_aside": _set_aside,
           # the job's .spx/ record, lease and end marker (host loss: intake/job_record.py)
           "spx_publish": spx_dir.publish, "spx_renew": spx_dir.renew, "spx_mark_ended": spx_dir.mark_ended,
           "spx_claim": spx_dir.claim,
           # a job across hosts: the generation its hosts' daemons agree on (run/gang.py)
           "gang_advance": gang_dir.advance, "gang_join": gang_dir.join, "gang_beat": gang_dir.beat,
           # a job's `notify.webhook` (run/notify_send.py)
           "post_webhook": webhook.post}


def _answer(req: dict[str, Any]) -> tuple[bool, str]:
    try:
        return True, json.dumps({"ok": True, "result": ACTIONS[req["action"]](req["args"])})
    except Exception as e:  # the parent turns this into UserPathError with the text
        return False, json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}"})


def serve() -> int:
    """A session: become the first line's user once, then one answer line per request line."""
    become(json.loads(sys.stdin.readline(1 << 16)).get("as"))
    for line in sys.stdin:
        try:
            req = json.loads(line)
        except ValueError as e:
            return _say(json.dumps({"ok": False, "error": f"ValueError: {e}"}), 1)
        sys.stdout.write(_answer(req)[1] + "\n")
        sys.stdout.flush()
    return 0


def _say(text: str, code: int) -> int:
    sys.stdout.write(text)
    return code


def main() -> int:
    if sys.argv[1:] == ["--serve"]:
        return serve()
    try:
        req = json.loads(sys.stdin.read(1 << 20))
        become(req.get("as"))
    except Exception as e:
        return _say(json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}"}), 1)
    ok, text = _answer(req)
    return _say(text, 0 if ok else 1)


if __name__ == "__main__":
    sys.exit(main())
