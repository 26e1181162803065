"""The standby: an attempt's launcher started before its plan, its modules already imported.

    PYTHON .../spx/daemon/run/standby_agent.py PREIMPORT MODULE [WORKERS [FIRST_RANK]]
                           (the attempt monitor starts it, through the exec shim, as the job's user with
                            the job's python; standby.py says which PREIMPORT each launcher MODULE gets,
                            and WORKERS, the local ranks, for a job with `restart.standby_workers`,
                            FIRST_RANK where the global ranks are known ahead: one host)

Why: half of a relaunch is the launcher's own start — an interpreter, `import torch`, torchrun's
modules — before a single worker exists. The daemon starts this for the next attempt while the
current one trains (and, for a first attempt, while it still looks for the checkpoint): it imports
PREIMPORT and waits on stdin. The attempt's plan — argv `[python, -m, MODULE, …]` and its
environment, one line — arrives there once the daemon knows it (GPUs, port, resume checkpoint); the
agent reads it whole, closes its stdin (which tells its monitor it took the plan), takes that
environment as its own and runs MODULE as `python -m` would, in this process. A torchrun across
hosts gets one change: its rendezvous looks for the other agents every 0.1 s, not every second
(quicker_rendezvous).
With WORKERS, it also starts that many standby workers (standby_worker.py: torch imported, waiting
for their command) and, once the plan runs torchrun, torchrun's worker start hands each local rank's
command to its standby worker instead of a new interpreter (StandbyWorkers); a rank with none, or a
start torchrun makes differently, is started as torchrun would.
Until then it sees no GPU (`CUDA_VISIBLE_DEVICES` is empty): nothing imported ahead can create a
CUDA context, or settle on a device, before the plan says which; each worker still starts fresh
with its devices, as torchrun starts it.

Once the launcher module is done (it returned, exited, or raised: a worker died), the agent says
what Python would (the traceback of an exception, the text of a non-numeric exit), flushes logging
and its streams, and leaves with `os._exit` and Python's status. The interpreter's own teardown
with torch loaded — modules and C++ statics freed, nothing the job can see — took 0.35–0.41 s here
between torchrun's last word and its exit (a 2-rank torchrun with one rank `kill -9`'d, 3 runs each
way): time every relaunch waited for before the daemon heard the launcher had ended. torchrun has
stopped its workers and drained their log tails by then, and registers no exit handler but
logging's.

It is the job's code from the start (the user's interpreter, the user's environment), so it is no
more trusted than the job; it only must not change what the job sees: this file's directory is
taken off `sys.path` (the daemon's modules never shadow the job's), stdin is /dev/null again for
the launcher and its workers, and an import that fails here is left for the launch itself to
report, exactly as a cold start would. No plan (EOF: the daemon discarded the standby, or died)
ends it with 127, which its monitor records as an attempt that never launched.
"""

from __future__ import annotations

import json
import logging
import os
import runpy
import subprocess
import sys
from pathlib import Path

RENDEZVOUS_MODULE = "torch.distributed.elastic.rendezvous.dynamic_rendezvous"
HANDLER_MODULE = "torch.distributed.elastic.multiprocessing.subprocess_handler.subprocess_handler"
CONTEXT_MODULE = "torch.distributed.elastic.multiprocessing.api"
WORKER = Path(__file__).with_name("standby_worker.py")
TITLE_ROOM = 1024  # blanks on a standby worker's command line: room for the command it is handed
POLL_SECONDS_PER_HOST = 1 / 80  # each look reads the whole rendezvous state, which grows with the hosts
MIN_POLL_SECONDS = 0.1


def rendezvous_poll_seconds(argv: list[str]) -> float | None:
    """How often a waiting agent of this launch re-reads the rendezvous state: every 0.1 s up to 8
    hosts, 1/80 s per host beyond, torch's own 1 s from 80 hosts (the store serves every waiting
    agent the whole state at each look). None: one host (no one to wait for), or `--nnodes` not
    readable."""
    for i, arg in enumerate(argv):
        if arg == "--nnodes" and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith("--nnodes="):
            value = arg.partition("=")[2]
        else:
            continue
        try:
            hosts = int(value.rpartition(":")[2])  # "N" or "MIN:MAX"
        except ValueError:
            return None
        return None if hosts <= 1 else min(1.0, max(MIN_POLL_SECONDS, hosts * POLL_SECONDS_PER_HOST))
    return None


def quicker_rendezvous(poll: float) -> None:
    """torchrun's rendezvous (c10d, etcd) looks at the shared state at most once a second while an
    agent waits for the others: it sleeps a second between looks (`_delay(seconds=1)` in its join
    loop) and serves a look within a second of the last from its cache (its state holder's
    `cache_duration`). Across hosts that cost every relaunch about a second after the last agent had
    joined, waiting rather than working. Here both are `poll` instead, for this launcher only. Its
    other delays (the 0–0.3 s spread of the agents' first write) stay torch's own, and a torch
    without these names is left as it is."""
    try:
        module = __import__(RENDEZVOUS_MODULE, fromlist=["_delay"])
    except BaseException:  # noqa: BLE001 — not this torch's layout: its own pace stays
        return
    delay = getattr(module, "_delay", None)
    holder = getattr(module, "_BackendRendezvousStateHolder", None)
    if not callable(delay) or holder is None:
        return
    holder_init = holder.__init__

    def poll_sooner(seconds: float | tuple[float, float]) -> None:
        delay(poll if seconds == 1 else seconds)

    def cache_shorter(self: object, *args: object, **kwargs: object) -> None:
        holder_init(self, *args, **kwargs)
        if getattr(self, "_cache_duration", 0) > poll:
            self._cache_duration = poll  # type: ignore[attr-defined]

    module._delay = poll_sooner  # type: ignore[attr-defined]
    holder.__init__ = cache_shorter


class StandbyWorkers:
    """One standby worker per local rank, the agent's children, until torchrun takes or leaves them."""

    def __init__(self, count: int, first_rank: int | None):
        self.ready: dict[int, subprocess.Popen] = {}
        for rank in range(count):
            # Its ranks from the start (a process's /proc environ is the one it started with): whoever
            # watches the attempt's workers finds them, and tells which rank died, by them.
            ranks = {"LOCAL_RANK": str(rank), **({"RANK": str(first_rank + rank)} if first_rank is not None else {})}
            try:
                self.ready[rank] = subprocess.Popen(
                    [sys.executable, "-u", str(WORKER), " " * TITLE_ROOM], stdin=subprocess.PIPE, start_new_session=True,
                    env={**os.environ, **ranks})
            except OSError:  # that rank starts cold
                pass

    def hand(self, rank: int, argv: tuple, env: dict[str, str], stdout: str | None,
             stderr: str | None) -> subprocess.Popen | None:
        """Local rank `rank`'s standby worker, given the command torchrun would run for it; None: none
        ready (never started, or gone), torchrun starts that rank itself."""
        proc = self.ready.pop(rank, None)
        if proc is None or proc.stdin is None:
            return None
        command = {"argv": [str(a) for a in argv], "env": env, "cwd": os.getcwd(), "stdout": stdout, "stderr": stderr}
        try:
            if proc.poll() is not None:
                return None
            proc.stdin.write(json.dumps(command).encode() + b"\n")
            proc.stdin.close()
        except OSError:  # it died under us: it ends, the rank starts cold
            proc.kill()
            return None
        return proc

    def release(self) -> None:
        """The ones torchrun did not take: EOF ends each (exit 0)."""
        for proc in self.ready.values():
            if proc.stdin is not None:
                proc.stdin.close()
        self.ready.clear()


def hand_workers_to(workers: StandbyWorkers) -> None:
    """torchrun's worker start (`SubprocessHandler._popen`) takes a local rank's standby worker where
    one is ready, and each round of starts (`SubprocessContext._start`) lets the rest go. A torch
    without these names starts every worker itself, the standby workers released at once."""
    try:
        handlers = __import__(HANDLER_MODULE, fromlist=["SubprocessHandler"])
        contexts = __import__(CONTEXT_MODULE, fromlist=["SubprocessContext"])
    except BaseException:  # noqa: BLE001 — not this torch's layout
        workers.release()
        return
    handler, context = getattr(handlers, "SubprocessHandler", None), getattr(contexts, "SubprocessContext", None)
    popen, start = getattr(handler, "_popen", None), getattr(context, "_start", None)
    if not callable(popen) or not callable(start):
        workers.release()
        return

    def popen_prepared(self: object, args: tuple, env: dict[str, str]) -> subprocess.Popen:
        files = [getattr(getattr(self, name, None), "name", None) for name in ("_stdout", "_stderr")]
        rank = getattr(self, "local_rank_id", None)
        taken = workers.hand(rank, args, env, *files) if isinstance(rank, int) else None
        return taken if taken is not None else popen(self, args, env)

    def start_then_release(self: object) -> None:
        try:
            start(self)
        finally:
            workers.release()

    handler._popen = popen_prepared  # type: ignore[union-attr]
    context._start = start_then_release  # type: ignore[union-attr]


def _read_plan() -> dict | None:
    """The plan's line (None: EOF before a whole one — the standby was discarded)."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(0, 65536)
        if not chunk:
            return None
        data += chunk
    plan = json.loads(data)
    return plan if isinstance(plan, dict) else None


def _module_search_path() -> None:
    """sys.path as `python -m` has it: the working directory first, unless PYTHONSAFEPATH says not."""
    del sys.path[0]
    if not os.environ.get("PYTHONSAFEPATH"):
        sys.path.insert(0, os.getcwd())


def main(argv: list[str]) -> int:
    preimport, module = argv[1], argv[2]
    _module_search_path()
    workers = StandbyWorkers(int(argv[3]), int(argv[4]) if len(argv) > 4 else None) if len(argv) > 3 else None
    try:
        __import__(preimport)
    except BaseException:  # noqa: BLE001 — the launch, not the standby, reports a broken install
        pass
    plan = _read_plan()
    if plan is None:
        return 127
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.environ.clear()
    os.environ.update(plan["env"])
    launch = plan["argv"]
    if launch[1:3] != ["-m", module]:  # not what was prepared: run it as a cold start would
        os.execve(launch[0], launch, plan["env"])
    poll = rendezvous_poll_seconds(launch) if module == "torch.distributed.run" else None
    if poll is not None:
        quicker_rendezvous(poll)
    if workers is not None:
        hand_workers_to(workers)
    sys.argv = [module, *launch[3:]]
    # As `python -m`: the module runs afresh as __main__ (its own imports are kept, that is the gain).
    sys.modules.pop(module, None)
    return run_launcher(module)


def run_launcher(module: str) -> int:
    """Run `module` as __main__; its exit status as Python's would be, having said what Python says
    (an uncaught exception's traceback, a non-numeric exit's text). Ctrl-C is left to Python."""
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return int(e.code or 0)
        print(e.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        raise
    except BaseException:  # noqa: BLE001 — reported as the interpreter would, then the status
        sys.excepthook(*sys.exc_info())
        return 1
    return 0


def leave(status: int) -> None:
    """Exit with `status` without the interpreter's teardown (module docstring), output flushed."""
    try:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(status & 0xFF)


if __name__ == "__main__":
    leave(main(sys.argv))
