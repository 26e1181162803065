"""A worker's death seen through its pidfd, its status read while its launcher has not reaped it:
real processes — a stand-in launcher that reaps its children a tenth of a second late (as torchrun's
monitor does), workers with LOCAL_RANK/RANK, one of them with a child of its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from harness import wait_for
from spx.daemon.run.exit_wake import ExitWatch
from spx.daemon.run.worker_watch import WorkerWatch, find_workers

# The launcher: two workers, each waiting for a byte on its stdin to exit 0; rank 1 forks a child of
# its own (as a data-loader worker would: LOCAL_RANK inherited), which is no worker.
LAUNCHER = r"""
import os, subprocess, sys, time
workers = []
for rank in (0, 1):
    env = dict(os.environ, LOCAL_RANK=str(rank), RANK=str(rank))
    code = ("import os, sys, time\n"
            "if os.environ['RANK'] == '1' and os.fork() == 0:\n    time.sleep(600); os._exit(0)\n"
            "sys.stdin.read(1); sys.exit(0)")
    workers.append(subprocess.Popen([sys.executable, "-c", code], env=env, stdin=subprocess.PIPE))
print(" ".join(str(w.pid) for w in workers), flush=True)
while any(w.poll() is None for w in workers):
    time.sleep(0.1)  # torchrun's monitor interval: a dead worker stays a zombie until then
"""


def test_a_killed_worker_is_reported_with_its_rank_and_signal_and_an_exit_0_is_not():
    # The "monitor": a process whose child is the launcher, as the attempt monitor's is.
    monitor = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys; sys.exit(subprocess.call([sys.executable, '-c', {LAUNCHER!r}]))"],
                               stdout=subprocess.PIPE, text=True, start_new_session=True)
    exits = ExitWatch()
    woke = threading.Event()
    watch = WorkerWatch(exits, woke.set)
    try:
        rank0, rank1 = (int(p) for p in monitor.stdout.readline().split())
        watch.attempt(7, 1, monitor.pid, expected=2)
        # Both workers are found (not rank 1's own child), and watched.
        wait_for(lambda: watch.watched(7, 1) == {rank0: 0, rank1: 1}, 30, "both workers found and watched")
        assert find_workers(monitor.pid) == {rank0: 0, rank1: 1}
        # Rank 0 ends normally: exit 0 is never a death.
        with open(f"/proc/{rank0}/fd/0", "w") as stdin:
            stdin.write("x")
        wait_for(lambda: not os.path.exists(f"/proc/{rank0}"), 30, "rank 0 reaped by its launcher")
        assert watch.deaths(7, 1) == [] and not woke.is_set()
        # Rank 1 is killed: seen at once, with its rank and signal, before its launcher reaps it.
        t0 = time.time()
        os.kill(rank1, signal.SIGKILL)
        assert woke.wait(10), "the loop was woken"
        [(death, seen)] = watch.deaths(7, 1)
        assert (death.pid, death.rank, death.code, death.signal) == (rank1, 1, None, signal.SIGKILL)
        assert t0 <= seen < t0 + 1.0
        assert death.describe() == f"worker rank 1 (pid {rank1}) killed by SIGKILL"
        assert watch.deaths(7, 1) == [], "each death is told once"
    finally:
        exits.close()
        os.killpg(monitor.pid, signal.SIGKILL)  # its session: the launcher, workers, rank 1's child
        monitor.wait()
