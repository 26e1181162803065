"""What the daemon reads of an attempt that hung or failed, in the owner's lane (run/user_work.py):
its workers' stacks before the kill (DumpStacks: py-spy, into the attempt log), and why it ended
(Diagnose: root cause from the log tail, the kernel's OOM record). Answers StacksDumped / Diagnosed,
or ActionFailed; the machine's deadlines on both count from the work's start."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from spx.daemon.core.lanes import Outcome
from spx.daemon.lifecycle.actions import Diagnose, DumpStacks
from spx.daemon.lifecycle.ending import DIAGNOSE_DEADLINE_SECONDS
from spx.daemon.lifecycle.observations import ActionFailed, Diagnosed, Observation, StacksDumped
from spx.daemon.lifecycle.stopping import DUMP_DEADLINE_SECONDS
from spx.daemon.run import attempt_files
from spx.daemon.run.attempt_files import AttemptFiles
from spx.daemon.run.attempt_runtime import AttemptHandles
from spx.daemon.run.oom import oom_killed
from spx.daemon.run.rootcause import TAIL_BYTES, root_cause_of
from spx.daemon.run.user_work import UserWork
from spx.daemon.state.jobs_table import JobRow

PYSPY_TIMEOUT_SECONDS = 15.0        # per process; all of them stay below the machine's dump deadline
DUMP_BUDGET_SECONDS = 45.0


def dump(work: UserWork, job: JobRow, h: AttemptHandles, a: DumpStacks) -> None:
    files, procs = h.files, h.procs
    assert files is not None

    def done(outcome: Outcome) -> Observation:
        return StacksDumped(a.number) if outcome.ok else ActionFailed(a, str(outcome.error))

    work.submit(job, "stack dump", lambda: dump_stacks(files, procs.pids()), DUMP_DEADLINE_SECONDS + 5.0, done,
                action=a)


def diagnose(work: UserWork, job: JobRow, h: AttemptHandles | None, a: Diagnose) -> None:
    files, seen = (h.files, set(h.seen_pids)) if h is not None else (None, set())

    def read() -> tuple[str | None, bool]:
        died = a.worker
        summary = ((died.rank, died.code if died.code is not None else -(died.signal or 0), died.pid)
                   if died is not None and died.rank is not None else None)
        root = root_cause_of(attempt_files.read_log_tail(files, TAIL_BYTES), summary) if a.root_cause and files else None
        return root, oom_killed(seen) if a.oom else False

    def done(outcome: Outcome) -> Observation:
        if not outcome.ok:
            return ActionFailed(a, str(outcome.error))
        root, oom = outcome.value
        return Diagnosed(a.number, root, oom)

    work.submit(job, "diagnosis", read, DIAGNOSE_DEADLINE_SECONDS + 5.0, done, action=a)


def pyspy_path() -> str | None:
    """The py-spy the daemon runs: the one installed beside its own interpreter (a dependency of the
    package, so an installed daemon has it whatever PATH systemd gives it), else one on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("py-spy")


def dump_stacks(files: AttemptFiles, pids: list[int]) -> None:
    """Worker stacks into the attempt log (py-spy), before the kill. Off the loop."""
    pyspy = pyspy_path()
    if pyspy is None:
        attempt_files.note(files, f"hang detected; py-spy is not installed beside {sys.executable} nor on PATH, "
                                  "no stack dump (spx doctor checks it)")
        return
    deadline = time.monotonic() + DUMP_BUDGET_SECONDS
    for pid in pids:
        left = deadline - time.monotonic()
        if left <= 1:
            attempt_files.note(files, f"stack dump budget spent; pid {pid} not dumped")
            continue
        try:
            out = subprocess.run([pyspy, "dump", "--pid", str(pid)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 timeout=min(PYSPY_TIMEOUT_SECONDS, left), check=False).stdout
            text = out.decode("utf-8", "replace")
        except subprocess.TimeoutExpired:
            text = "py-spy timed out"
        attempt_files.note(files, f"hang detected; stack of pid {pid}:\n{text}")
