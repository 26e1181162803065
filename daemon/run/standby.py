"""A pre-started launcher for an attempt, so the attempt does not wait for torch to import.

Where a relaunch's time goes (docs/recovery.md): after the failure is handled, a new torchrun must
start an interpreter and import torch and its own modules (~1 s on a small host, more with CUDA
libraries) before it can start a single worker. A `Standby` does that ahead: the daemon starts the
next attempt's launcher — as the job's user, in the attempt's cgroup and session, under its attempt
monitor, logging to the attempt's log, exactly as a launch would — but with the standby agent
(standby_agent.py) in place of the launcher, which imports the launcher's module and waits for the
plan. `go(plan)` hands it the attempt's final argv and environment (its GPUs, port, resume
checkpoint) and returns once the agent has *taken* it (read it whole and closed its stdin: its
imports are done); from then on it *is* the attempt's launcher: the same monitor, pids, log and exit
record as a cold launch. For a first attempt it is started as the checkpoint search begins, so the
import overlaps that search. Until `go` it runs at nice NICE, so its imports take the CPU the running
attempt leaves idle rather than slowing its steps; `go` brings every thread of it back first.

The agent is the job's user's process running the user's interpreter and modules, so `go` may wait
on the user (an import that never returns, a working directory on a hung mount): the daemon calls it
off the main loop with a deadline, and a standby that does not take its plan in time is discarded —
`discard` kills its whole session and waits for nothing (the daemon's reaper collects it) — and the
attempt launches cold.

Only launchers that are a `python -m MODULE` of their own get one (torchrun, DeepSpeed's
launcher): their process runs no job code before the plan. A standby fits a plan only if it was
started with the same interpreter, working directory and module (`fits`); otherwise, or when it is
gone, the attempt launches cold. What a GPU host cannot do ahead is CUDA: neither the agent nor
anything before the plan creates a CUDA context, and workers start fresh, as torchrun starts them.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from spx.daemon.core.users import LogAccess
from spx.daemon.run import device_filter, launcher, proctree

AGENT = Path(__file__).with_name("standby_agent.py")
# Each launcher module, and what its standby imports ahead. DeepSpeed's launcher gets torch only:
# importing deepspeed settles its accelerator (CUDA or CPU) for good, which must wait for the GPUs.
PREIMPORTS = {"torch.distributed.run": "torch.distributed.run", "deepspeed.launcher.launch": "torch"}
# A standby imports at the lowest priority: its interpreters' seconds of CPU (torch, and torch again in
# each standby worker) come out of the time the running attempt leaves idle, not out of its steps.
# Its plan brings every thread of it back to the daemon's own nice, the one a cold launch inherits.
NICE = 19


def module_of(plan: launcher.LaunchPlan) -> str | None:
    """The launcher module a standby can prepare for this plan, or None (no standby)."""
    argv = plan.argv
    return argv[2] if len(argv) > 2 and argv[1] == "-m" and argv[2] in PREIMPORTS else None


@dataclass
class Standby:
    """A launcher waiting for attempt `number`'s plan (see the module doc)."""

    number: int
    attempt_id: str
    cgroup: Path | None
    python: str
    cwd: str
    module: str
    started: float                  # monotonic
    monitor: launcher.Started
    devices: device_filter.Pending | None = None  # its cgroup's filter, no GPU until `go` (the executor's)
    workers: int = 0                # standby workers it started, each in a session of its own

    @property
    def pid(self) -> int:
        return self.monitor.proc.pid

    def fits(self, plan: launcher.LaunchPlan) -> bool:
        return (self.monitor.proc.poll() is None and plan.argv[0] == self.python and plan.cwd == self.cwd
                and module_of(plan) == self.module)

    def go(self, plan: launcher.LaunchPlan, deadline: float | None = None) -> launcher.Spawned:
        """The plan, to the agent: from here on the attempt runs. Raises OSError as `launcher.spawn`
        does (the shim could not start the agent, or the agent was gone before its plan), and
        TimeoutError past the monotonic `deadline` (the agent did not take its plan by then)."""
        started = self.monitor
        status_r, go_r, plan_w = started.status_r, started.go_r, started.plan_w
        started.status_r = started.go_r = started.plan_w = -1  # each is closed below, whatever happens
        try:
            launcher.raise_launch_failure(started, status_r, deadline)
        except BaseException:
            os.close(plan_w)
            os.close(go_r)
            raise
        proctree.AttemptProcesses(self.attempt_id, self.pid, self.cgroup).renice(os.getpriority(os.PRIO_PROCESS, 0))
        try:
            launcher.write_all(plan_w, launcher.plan_json(plan), deadline)
        except BrokenPipeError:  # the monitor is gone: the go status says nothing, its exit does
            pass
        except BaseException:
            os.close(go_r)
            raise
        finally:
            os.close(plan_w)
        launcher.raise_launch_failure(started, go_r, deadline)
        return launcher.Spawned(proc=started.proc, relay=started.relay)

    def discard(self) -> None:
        """End it unlaunched: its whole session killed, its pipes closed; nothing is waited for (a
        killed monitor records nothing, the agent never ran job code, and the daemon's reaper
        collects the monitor and the relay)."""
        started = self.monitor
        for fd in (started.status_r, started.plan_w, started.go_r):
            if fd >= 0:
                os.close(fd)
        started.status_r = started.plan_w = started.go_r = -1
        if started.proc.poll() is not None and not proctree.group_alive(started.proc.pid):
            return  # ended and reaped (a failed go), nothing of its group left: the number may be another's now
        if self.workers:  # theirs are sessions of their own: found by the attempt's tag
            proctree.signal_attempt(self.attempt_id, started.proc.pid, signal.SIGKILL)
            return
        try:
            os.killpg(started.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def start(number: int, attempt_id: str, plan: launcher.LaunchPlan, uid: int, log_dir_fd: int, log_name: str,
          cgroup: Path | None, max_log_bytes: int, readers: LogAccess | None = None, workers: int = 0) -> Standby | None:
    """A standby for attempt `number` from a provisional `plan` (its GPUs, port and checkpoint may
    still change: only the interpreter, working directory, module and user count), or None where
    the plan's launcher gets none. It sees no GPU until its plan (standby_agent.py), and runs at
    nice NICE until then. Does not wait
    for the agent's start: its errors come at `go`. Its log is the attempt's, for `readers`.
    `workers`: standby workers for that many local ranks (torchrun only; 0: none), each with its
    LOCAL_RANK (and, on one host, its RANK) in its environment from the start: the daemon's worker
    watch and operators' tools find a worker by them in /proc."""
    module = module_of(plan)
    if module is None:
        return None
    env = {k: v for k, v in plan.env.items() if k != "CUDA_DEVICE_ORDER"} | {"CUDA_VISIBLE_DEVICES": ""}
    workers = workers if module == "torch.distributed.run" else 0
    # One host: the global ranks are the local ones, known ahead (FIRST_RANK 0).
    ranks = [str(workers), *(["0"] if "--nnodes=1" in plan.argv else [])] if workers > 0 else []
    agent = launcher.LaunchPlan(argv=[plan.argv[0], str(AGENT), PREIMPORTS[module], module, *ranks], env=env,
                                cwd=plan.cwd)
    started = launcher.start_monitor(agent, uid, log_dir_fd, log_name, cgroup, max_log_bytes, standby=True,
                                     readers=readers, nice=NICE)
    return Standby(number, attempt_id, cgroup, plan.argv[0], plan.cwd, module, time.monotonic(), started,
                   workers=max(workers, 0))
