"""The main loop never waits on a user (issue 25), with a real daemon (fake GPUs) and real torchrun:

- a torchrun job whose launcher's import never returns (its PYTHONPATH puts a `torch` of the user's
  own first) and whose plan is larger than a pipe holds (its own args, each one its checkpoint dir):
  its standby never takes the plan, is discarded after `user_work.standby_handoff_seconds`, and the
  attempt launches cold — and runs, stuck in that same import (no heartbeat, no GPUs: nothing says it
  hangs), until it is cancelled;
- a torchrun job with the same huge args and a real torch launches and succeeds;
- meanwhile a plain job starts and succeeds, and every second the control socket answers `ls` (the
  control thread) and `cancel` of a job that does not exist (answered by the main loop itself) within
  2 s — asked on the socket, as `spx` asks, so the time is the daemon's, not a CLI's start-up on a
  loaded machine.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

from harness import Daemon, job_pids, wait_for
from spx.daemon.core.config import load_config
from spx.daemon.service import control

PY = sys.executable
HANDOFF_SECONDS = 8.0
HUGE = 3000  # args of ~90 bytes each once {checkpoint_dir} is expanded: ~270 KB, four pipe buffers


class LoopProbe:
    """Every second, on the control socket: `ls`, and `cancel` of a job nobody has (a request the main
    loop answers); the longest each took, and any answer that was not the expected one."""

    def __init__(self, daemon: Daemon) -> None:
        self.socket = load_config(None, daemon.root).socket_path
        self.longest = {"ls": 0.0, "cancel": 0.0}
        self.odd: list[dict] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(1.0):
            for op, name in (("ls", None), ("cancel", "spx-loop-probe")):
                t0 = time.monotonic()
                reply = control.request(self.socket, op, name, timeout=60)
                self.longest[op] = max(self.longest[op], time.monotonic() - t0)
                if reply.get("ok") is not (op == "ls") or (op == "cancel" and "no job named" not in reply["error"]):
                    self.odd.append(reply)

    def __enter__(self) -> LoopProbe:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=60)


@pytest.fixture
def daemon(tmp_path):
    d = Daemon(tmp_path / "root", gpu_backend="fake",
               config={"user_work": {"standby_handoff_seconds": HANDOFF_SECONDS}}).start()
    yield d
    d.stop()


def torchrun_job(name: str, script: Path, extra: str = "") -> str:
    args = ", ".join(['"{checkpoint_dir}"'] * HUGE)
    return (f"name: {name}\nlauncher: torchrun\nscript: {script}\npython: {PY}\nprocs: 1\ngpus: 0\n"
            f"args: [{args}]\nrestart: {{max_restarts: 2, backoff_seconds: [1, 2]}}\n"
            f"stop: {{grace_seconds: 2}}\n{extra}")


@pytest.mark.slow
def test_a_launcher_that_never_imports_and_a_plan_larger_than_a_pipe_never_hold_the_loop(daemon, tmp_path):
    shim = tmp_path / "their-own" / "torch"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("import time\nwhile True:\n    time.sleep(3600)\n")
    count = tmp_path / "count_args.py"
    count.write_text("import sys\nprint('args', len(sys.argv) - 1, flush=True)\n")
    sleeper = tmp_path / "sleep_a_second.py"
    sleeper.write_text("import time\ntime.sleep(1)\nprint('done', flush=True)\n")

    with LoopProbe(daemon) as probe:
        daemon.drop("stuck.yaml", torchrun_job("stuck-import", count, f"env: {{PYTHONPATH: '{shim.parent}'}}\n"))
        daemon.wait_event("job_queued", job="stuck-import", timeout=30)
        daemon.drop("big.yaml", torchrun_job("huge-args", count))
        daemon.drop("plain.yaml", f"name: plain\nlauncher: python\nscript: {sleeper}\npython: {PY}\ngpus: 0\n")
        daemon.wait_state("plain", "succeeded", 60)
        daemon.wait_state("huge-args", "succeeded", 180)
        discarded = daemon.wait_event("standby_failed", job="stuck-import", timeout=HANDOFF_SECONDS + 60)
        assert "TimeoutError" in discarded["error"], discarded
        cold = daemon.wait_event("attempt_started", job="stuck-import", timeout=60)
        assert cold["standby"] is None, "the standby never took its plan: the attempt launched cold"
        assert daemon.job("stuck-import")["state"] == "running", "stuck in the user's own import, as a cold start is"
        log = (daemon.root / "log" / "huge-args" / "attempt-1.log").read_text()
        assert f"args {HUGE}" in log, "the whole plan reached the launcher"

    assert probe.longest["cancel"] < 2.0, f"the main loop answered a request only after {probe.longest} s"
    assert probe.longest["ls"] < 2.0 and not probe.odd, (probe.longest, probe.odd[:3])
    daemon.spx("cancel", "stuck-import")
    daemon.wait_state("stuck-import", "cancelled", 60)
    wait_for(lambda: job_pids("stuck-import") == [], 30, "nothing of the stuck job left")
