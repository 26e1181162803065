"""`restart.standby_workers` under the daemon: a spx.trainer DDP job (2 gloo ranks) has a worker
`kill -9`'d once the next attempt's workers are started ahead; the relaunch runs on those very
processes (their pids, started before the kill) and the job ends bitwise in the state of the same
script run uninterrupted, without the daemon; the next standby's workers go with the job's end."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest
from trainer_runs import DDP_ARGS, start_ddp

from harness import EXAMPLES, Daemon, attempt_tag, job_pids, wait_for

pytestmark = pytest.mark.slow


def standby_workers(name: str) -> list[int]:
    """The job's standby workers waiting for their command (blocked reading stdin: imports done)."""
    found = []
    for pid in job_pids(name):
        try:
            if ("standby_worker.py" in Path(f"/proc/{pid}/cmdline").read_text()
                    and Path(f"/proc/{pid}/syscall").read_text().startswith("0 0x0 ")):
                found.append(pid)
        except OSError:
            continue
    return sorted(found)


def next_attempts_workers(name: str) -> tuple[list[int], list[int]] | None:
    """(the next attempt's 2 standby workers, waiting; the running attempt's 2 workers), once both
    are there. The first attempt runs on standby workers too (its standby starts with its checkpoint
    search): a worker is told by its LOCAL_RANK, its attempt by its tag."""
    workers = {}
    for pid in job_pids(name):
        try:
            if b"LOCAL_RANK=" in Path(f"/proc/{pid}/environ").read_bytes():
                workers[pid] = attempt_tag(pid)
        except OSError:
            continue
    waiting = standby_workers(name)
    running = sorted(p for p in workers if p not in waiting)
    ready = [p for p in waiting if workers.get(p) not in {workers[r] for r in running}]
    return (ready, running) if len(ready) == 2 and len(running) == 2 else None


def test_a_relaunch_on_standby_workers_ends_bitwise_as_the_uninterrupted_run(tmp_path):
    reference = start_ddp(tmp_path, "reference")
    assert reference.wait(300) == 0, reference.output()[-3000:]

    argv = ", ".join(f'"{a}"' for a in (*DDP_ARGS, "--sleep-per-step", "0.3"))
    d = Daemon(tmp_path / "root", gpu_backend="fake").start()
    try:
        d.drop("sw.yaml", f"name: sw\nlauncher: torchrun\nscript: {EXAMPLES / 'train_ddp.py'}\npython: {sys.executable}\n"
                          f"args: [{argv}]\ngpus: 2\nprocs: 2\n"
                          "restart: {max_restarts: 2, backoff_seconds: [1, 5], standby_workers: true}\n")
        ready, victims = wait_for(lambda: next_attempts_workers("sw"), 240,
                                  "attempt 1 training and attempt 2's standby workers with their imports done",
                                  interval=0.2)
        assert re.search(r"^  standby: next attempt's launcher and 2 workers ready, \d+ MiB "
                         r"\(launch_standby, restart.standby_workers\)$", d.spx("status", "sw").stdout, re.M)
        second = attempt_tag(ready[0])  # the standby's tag: its attempt's, once it is the attempt
        killed_at = time.time()
        os.kill(victims[1], signal.SIGKILL)

        def training_on(pids: list[int]) -> bool:
            job = d.job("sw") or {}
            return job.get("attempts", 0) >= 2 and (job.get("step") or 0) > 0 and all(
                Path(f"/proc/{p}").exists() and not Path(f"/proc/{p}/syscall").read_text().startswith("0 0x0 ")
                for p in pids)
        wait_for(lambda: training_on(ready), 120, "attempt 2 training on the standby workers")
        workers = sorted(p for p in job_pids("sw", second)
                         if b"LOCAL_RANK=" in Path(f"/proc/{p}/environ").read_bytes())
        assert workers == ready, f"attempt 2's workers are the standby workers {ready}: {workers}"
        d.wait_state("sw", {"succeeded", "failed"}, 300)
        st = d.status("sw")
        assert st["state"] == "succeeded", st
        assert len(st["history"]) == 2 and st["history"][1]["resumed_from_step"] is not None, st["history"]
        # The standby started for attempt 3 went with the job's end, its workers (sessions of their own) too.
        wait_for(lambda: job_pids("sw") == [], 30, "no process of the job left")
        log = (d.root / "log" / "sw" / "attempt-2.log").read_text()
        found = set(re.findall(r"final_state_sha256=([0-9a-f]{64})$", log, re.M))
        assert found == {reference.final_hash()}, "the relaunch ends in the uninterrupted run's state"
        assert "cold interpreter" not in log, "the example sets nothing before its imports: run in place"
        rows = json.loads(d.spx("status", "sw", "--timeline", "--json").stdout)
        phases = {r["phase"]: r["time"] for r in rows if r["attempt"] == 2}
        print(f"standby workers: kill -> first step {phases['first_step'] - killed_at:.2f} s")
        assert phases["spawn"] <= phases["interpreter_up"] <= phases["first_step"], phases
    finally:
        d.stop()
