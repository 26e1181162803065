"""The exec shim every attempt starts through: enter the attempt's cgroup, become the job's user, exec.

    python -I -S .../spx/daemon/run/enter_attempt.py REQUEST_FD STATUS_FD     (launcher.spawn runs this)

Why a shim: the launcher must be in its attempt's cgroup before it can fork a single worker, or a
fast child could be born outside it. subprocess has no cgroup argument, and its `preexec_fn` runs
after the uid switch (a job user cannot write `cgroup.procs`) and is unsafe in the threaded daemon.
So this runs as root in the new session subprocess made, does the steps in order — cgroup, umask,
nice, groups, gid, uid, working directory, signal dispositions — and execs the attempt's argv (no shell).
The working directory is entered only *after* the switch to the job's user (not as root, as
subprocess's `cwd=` would): a workdir in another user's private tree fails the launch ("workdir:
Permission denied") instead of being entered with root's rights and read from there. Every attempt takes this path, cgroup or not, so there is one
way of becoming the job's user.

It runs as root, so nothing of the job may steer it: `-I -S` (no PYTHON* variables, no site
packages, no working-directory imports), stdlib only, its own fixed environment. The job's argv,
environment and working directory arrive as JSON on REQUEST_FD — not in its environment, where
LD_PRELOAD & co. would act on a root process, nor in argv, which every user can read in /proc.
STATUS_FD is close-on-exec: EOF means the exec happened; a JSON error means it did not, and why
(the daemon raises it as the launch error, as subprocess does with its own error pipe).
"""

from __future__ import annotations

import errno
import json
import os
import signal
import sys


def _execvpe(argv: list[str], env: dict[str, str]) -> None:
    """os.execvpe without its lazy `import warnings`: once the shim is the job's user, the stdlib
    itself may be unreadable (a python under /root), so nothing may be imported after the switch."""
    if os.sep in argv[0]:
        os.execve(argv[0], argv, env)
    denied: OSError | None = None  # as execvp: the first error other than "not there" says the most
    missing: OSError = FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), argv[0])
    for directory in env.get("PATH", os.defpath).split(os.pathsep):
        try:
            os.execve(os.path.join(directory, argv[0]), argv, env)
        except (FileNotFoundError, NotADirectoryError) as e:
            missing = e
        except OSError as e:
            denied = denied or e
    raise denied or missing


def _report(status_fd: int, step: str, err: int | None, strerror: str, filename: str | None) -> None:
    os.write(status_fd, json.dumps({"step": step, "errno": err, "strerror": strerror, "filename": filename}).encode())
    print(f"spx: cannot start the attempt ({step}): {strerror}{f': {filename}' if filename else ''}", file=sys.stderr)


def main(argv: list[str]) -> int:
    request_fd, status_fd = int(argv[1]), int(argv[2])
    os.set_inheritable(status_fd, False)
    with os.fdopen(request_fd, "rb") as f:
        req = json.loads(f.read())
    step = "cgroup"
    try:
        if req["cgroup"]:
            with open(os.path.join(req["cgroup"], "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        os.umask(req["umask"])
        if req["nice"] is not None:  # a standby's: it takes only the CPU that nothing else wants until its plan
            os.setpriority(os.PRIO_PROCESS, 0, req["nice"])
        step = "user"
        if req["uid"] is not None:
            os.setgroups(req["groups"])
            os.setresgid(req["gid"], req["gid"], req["gid"])
            os.setresuid(req["uid"], req["uid"], req["uid"])
        step = "workdir"
        os.chdir(req["cwd"])
        # Python ignores SIGPIPE and SIGXFSZ at start-up, and ignored signals stay ignored across exec.
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)
        step = "exec"
        _execvpe(req["argv"], req["env"])
    except OSError as e:
        _report(status_fd, step, e.errno, e.strerror or str(e), e.filename)
    except Exception as e:  # anything short of the exec is a failed launch, and must be told as one
        _report(status_fd, step, None, f"{type(e).__name__}: {e}", None)
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv))
