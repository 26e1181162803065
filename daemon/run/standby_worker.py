"""A standby worker: one of the next attempt's torchrun workers, started before its plan with torch
imported.

    PYTHON -u .../spx/daemon/run/standby_worker.py ROOM
                      (the standby agent starts one per local rank for a job with
                       `restart.standby_workers: true`, beside itself: standby_agent.py;
                       ROOM, blanks, is where its command line is written at the hand-over)

Why: after the launcher's own start (the standby agent's job), the rest of a cold start is each
worker's: an interpreter, `import torch`, and `torch._dynamo` with TorchInductor, which the first
`torch.optim` optimizer pulls in (~2 s here). This process does those imports while the attempt
before trains, then blocks on stdin. When the attempt's torchrun starts its workers, the agent hands
this one the command torchrun would have run for its local rank — one JSON line: argv, environment,
working directory and the per-rank log files — and torchrun watches this process as that worker:
it is the agent's child, in a session of its own, as torchrun starts one.

What it runs is what the cold worker would: the environment becomes the plan's (the GPUs, ranks,
rendezvous, resume checkpoint; `putenv` too, so CUDA and NCCL read them when they start, after the
go), stdin /dev/null, stdout and stderr the rank's files, `sys.argv` and `sys.path[0]` as `python -u
SCRIPT` sets them, and the script runs afresh as `__main__`. Only the modules imported ahead are
kept, which is why it is opt-in: a job whose imports read the environment (other than the variables
the plan changes) or do work must not ask for it.
And it looks so: its command line (/proc/PID/cmdline, what `ps`, `pgrep -f` and py-spy read) is
rewritten in place to the command torchrun would have run, cut to the room its own arguments held
(setproctitle's way, within argv's own bytes only). Its /proc environ stays the one it started with:
the job's and attempt's tags and its ranks.

Where running in place could differ from a cold start, it execs the command instead: a cold start in
the same pid, which torchrun already watches. That is when the command is not `PYTHON -u SCRIPT …`
or `PYTHON -u -m MODULE …` of this interpreter, and when anything imported ahead touched CUDA (the
driver's library is mapped: it read `CUDA_VISIBLE_DEVICES`, empty before the plan, for good).

EOF before a plan (the agent had no rank for it, or was discarded): it ends with 0, quietly — a
worker's nonzero end would read as a death to whoever watches the attempt's workers.
"""

from __future__ import annotations

import ctypes
import json
import os
import runpy
import sys

PREIMPORTS = ("torch", "torch._dynamo", "spx.trainer")
CUDA_DRIVER = b"libcuda.so"


def _read_command() -> dict | None:
    """The command's line (None: EOF before a whole one). The agent writes one line and closes."""
    line = sys.stdin.buffer.readline()
    command = json.loads(line) if line.endswith(b"\n") else None
    return command if isinstance(command, dict) else None


def _cuda_touched() -> bool:
    with open("/proc/self/maps", "rb") as maps:
        return any(CUDA_DRIVER in line for line in maps)


def _runnable(argv: list[str]) -> bool:
    """`PYTHON -u SCRIPT …` or `PYTHON -u -m MODULE …`, PYTHON this interpreter (torchrun's form)."""
    if len(argv) < 3 or argv[0] != sys.executable or argv[1] != "-u":
        return False
    return len(argv) > 3 if argv[2] == "-m" else not argv[2].startswith("-")


def _retitle(argv: list[str]) -> None:
    """/proc/self/cmdline as the cold worker's: `argv`, NUL-separated, written over this process's
    own argument bytes (arg_start..arg_end in /proc/self/stat: on the stack, copied by the
    interpreter at its start and never read again), cut to fit, the rest NULs. Nothing where /proc
    does not say where they are."""
    try:
        with open("/proc/self/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # fields 48, 49: arg_start, arg_end
    except (OSError, ValueError, IndexError):
        return
    room = end - start
    title = b"\0".join(a.encode(errors="replace") for a in argv)[:room - 1]
    ctypes.memmove(start, title.ljust(room, b"\0"), room)


def _redirect(fd: int, path: str | None) -> None:
    if path is None:
        return
    target = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(target, fd)
    os.close(target)


def _drop_own_dir() -> None:
    """This file's directory off sys.path (the daemon's modules never shadow the job's)."""
    if sys.path and os.path.realpath(sys.path[0]) == os.path.dirname(os.path.realpath(__file__)):
        del sys.path[0]


def _search_path(first: str) -> None:
    """sys.path[0] as the cold worker's interpreter sets it: the script's directory, or the working
    directory for `-m`; nothing under PYTHONSAFEPATH."""
    if not os.environ.get("PYTHONSAFEPATH"):
        sys.path.insert(0, first)


def main() -> int:
    _drop_own_dir()
    for name in PREIMPORTS:
        try:
            __import__(name)
        except BaseException:  # noqa: BLE001 — not this job's environment: the run itself reports it
            pass
    command = _read_command()
    if command is None:
        return 0
    argv, env = [str(a) for a in command["argv"]], {str(k): str(v) for k, v in command["env"].items()}
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    _redirect(1, command.get("stdout"))
    _redirect(2, command.get("stderr"))
    os.chdir(command["cwd"])
    if not _runnable(argv) or _cuda_touched():
        os.execve(argv[0], argv, env)
    _retitle(argv)
    os.environ.clear()
    os.environ.update(env)
    phases = sys.modules.get("spx.trainer.phases")
    if phases is not None:  # its start-up, for this attempt's timeline, ended with the command
        phases.taken_now()
    if argv[2] == "-m":
        _search_path(os.getcwd())
        sys.argv = [argv[3], *argv[4:]]
        sys.modules.pop(argv[3], None)
        runpy.run_module(argv[3], run_name="__main__", alter_sys=True)
    else:
        _search_path(os.path.dirname(os.path.realpath(argv[2])))
        sys.argv = argv[2:]
        runpy.run_path(argv[2], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
