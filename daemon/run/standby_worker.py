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
kept, which is why it is opt-in: their import read the standby's environment, not the plan's. So
until the script's first import of one of them (`import torch`, or of spx), the environment is
watched: a script that set, changed or removed a variable before that (`OMP_NUM_THREADS`,
`TORCHINDUCTOR_CACHE_DIR`, …) would have had a cold worker's torch read it, so it is started cold
instead, in the same pid, with the plan's environment (its rank's log says why). Left to the job: a
variable set after `import torch` that torch would have read only later (`torch._dynamo`, which a
cold worker imports at its first optimizer step).
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

import builtins
import ctypes
import json
import os
import runpy
import sys
from collections.abc import Mapping

PREIMPORTS = ("torch", "torch._dynamo", "spx.trainer")
CUDA_DRIVER = b"libcuda.so"
READ_AFTER_THE_GO = ("CUDA_VISIBLE_DEVICES",)
"""Variables a script may set before `import torch` that nothing imported ahead has read: CUDA
reads this one when it starts, after the hand-over (which checks that no import touched CUDA)."""
READ_AFTER_THE_GO_PREFIXES = ("NCCL_",)
"""And these families: NCCL reads them when a communicator starts."""


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


def env_changed(plan_env: Mapping[str, str], now: Mapping[str, str]) -> list[str]:
    """The variables set, changed or removed since the hand-over that a module imported ahead might
    have read at its import (not those read only after the go), sorted."""
    return sorted(k for k in plan_env.keys() | now.keys()
                  if plan_env.get(k) != now.get(k) and k not in READ_AFTER_THE_GO
                  and not k.startswith(READ_AFTER_THE_GO_PREFIXES))


def watch_first_import(roots: set[str], plan_env: dict[str, str], cold: list[str]) -> None:
    """Until the script's first import of a module under `roots` (imported ahead): if it changed the
    environment before, exec `cold` with `plan_env` (the command as torchrun gave it), so that torch
    reads what the script set, as in a cold start. The watch ends at that first import, either way."""
    original = builtins.__import__

    def first_import(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0 and name.partition(".")[0] in roots:
            builtins.__import__ = original
            changed = env_changed(plan_env, os.environ)
            if changed:
                print(f"spx: this rank's script set {', '.join(changed[:5])} before `import {name}`, which its "
                      "standby worker had imported ahead: starting it again in a cold interpreter",
                      file=sys.stderr, flush=True)
                sys.stdout.flush()
                os.execve(cold[0], cold, plan_env)
        return original(name, globals, locals, fromlist, level)

    builtins.__import__ = first_import


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
    watch_first_import({name.partition(".")[0] for name in PREIMPORTS if name in sys.modules}, env, argv)
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
