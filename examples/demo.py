"""The demo: the whole product in a few minutes, narrated as it happens.

    make demo                      # creates .venv on first run, then runs this
    .venv/bin/python examples/demo.py

Starts the daemon rooted in .demo/root with the fake 8×H100 backend, submits the example DDP job
(2 workers on 2 GPUs, a checkpoint every 10 steps), kills one worker with `kill -9` partway, and
shows the crash being detected, the resume from the last checkpoint, the job finishing, `spx
status`, some of `/metrics`, and where the logs are. Ctrl-C stops everything it started. The demo's
daemon ends with the demo; what it prints last is how to run one yourself, in the foreground of one
terminal, and `spx` from the venv in a second (the README's try section, whose lines they are).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
ROOT = REPO / ".demo" / "root"
JOB = "ddp-demo"
KILL_AT_STEP = 25


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


class DaemonWatch:
    """The daemon subprocess; its JSON log lines are turned into plain-words narration."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [str(BIN / "spx-trainer"), "--root", str(ROOT), "--gpu-backend", "fake", "--metrics-address", "127.0.0.1:0"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        self.metrics_url: str | None = None
        self.ready = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            self._narrate(ev)

    def _narrate(self, ev: dict) -> None:
        name = ev.get("event")
        if name == "daemon_ready":
            self.metrics_url = f"http://{ev['metrics']}/metrics"
            say(f"daemon up: spool {ev['spool']}, GPUs: {ev['gpu_backend']}, metrics {self.metrics_url}")
            self.ready.set()
        elif name == "job_queued":
            say(f"daemon: picked up the job file from the spool; {ev['job']} is queued")
        elif name == "attempt_started":
            where = f"resuming from step {ev['resumed_from_step']} ({ev['resumed_from']})" if ev.get("resumed_from") else "fresh start"
            say(f"daemon: attempt {ev['attempt']} of {ev['job']} launched on GPUs {ev['gpus']} (torchrun, 2 workers): {where}")
        elif name == "attempt_ended":
            cause = f" — {ev['root_cause']}" if ev.get("root_cause") else ""
            nxt = ev["next_state"]
            then = f"; relaunching in {ev['delay_seconds']:.0f} s" if nxt == "restarting" else f"; job {nxt}"
            say(f"daemon: attempt {ev['attempt']} ended: {ev['reason']}{cause}{then}")
        elif name == "hang_detected":
            say(f"daemon: {ev['job']} made no progress for {ev['idle_seconds']} s: hang")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.reader.join(timeout=5)


def spx(*args: str) -> str:
    return subprocess.run([str(BIN / "spx"), "--root", str(ROOT), *args], capture_output=True, text=True,
                          check=False).stdout


def job_doc() -> dict:
    out = spx("status", JOB, "--json")
    return json.loads(out) if out.strip() else {}


def worker_pids() -> list[int]:
    """The job's training processes (not the torchrun agent), found by their SPX_JOB tag."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            env = Path(entry.path, "environ").read_bytes().split(b"\0")
            cmd = Path(entry.path, "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"SPX_JOB={JOB}".encode() in env and any(c.endswith(b"train_ddp.py") for c in cmd) \
                and b"torch.distributed.run" not in cmd:
            found.append(int(entry.name))
    return sorted(found)


def write_job(dir_: Path) -> Path:
    job = dir_ / f"{JOB}.yaml"
    job.write_text(
        f"name: {JOB}\nlauncher: torchrun\nscript: {REPO / 'examples' / 'train_ddp.py'}\npython: {sys.executable}\n"
        'args: ["--batch_size", "8", "--steps", "60", "--checkpoint-every", "10", "--seed", "1234",'
        ' "--model-size", "tiny", "--sleep-per-step", "0.15", "--gradient_checkpointing"]\n'
        "gpus: 2\nprocs: 2\n"
        "restart: {max_restarts: 3, backoff_seconds: [2, 30], hang_timeout_seconds: 120}\n"
        "stop: {grace_seconds: 30}\n"
    )
    return job


def follow_until_done(killed: list[bool], metrics_url: str | None, snapshot: list[str]) -> dict:
    """Narrate progress, kill a worker once, and keep one /metrics scrape taken while attempt 2
    trains (so it shows the job on its GPUs)."""
    shown_step = last_ckpt = None
    while True:
        doc = job_doc()
        step, ckpt = doc.get("step"), doc.get("last_checkpoint_step")
        # Every 5 steps or so (the status is polled, so a step can fall between two polls).
        if doc.get("state") == "running" and step is not None and (shown_step is None or not 0 <= step - shown_step < 5):
            say(f"training: step {step}, {doc.get('samples_per_second') or 0:.0f} samples/s, last checkpoint: step {ckpt}")
            shown_step = step
        if ckpt is not None and ckpt != last_ckpt:
            say(f"trainer: checkpoint step-{ckpt:09d} complete (written atomically, manifest last)")
            last_ckpt = ckpt
        if not killed[0] and doc.get("attempts") == 1 and (step or 0) >= KILL_AT_STEP:
            pids = worker_pids()
            if pids:
                say(f"demo: kill -9 {pids[-1]} (one of the two workers) at step {step}")
                os.kill(pids[-1], signal.SIGKILL)
                killed[0] = True
        if metrics_url and not snapshot and doc.get("attempts") == 2 and doc.get("state") == "running" and doc.get("gpus"):
            snapshot.append(urllib.request.urlopen(metrics_url, timeout=10).read().decode())
        if doc.get("state") in ("succeeded", "failed", "cancelled"):
            return doc
        time.sleep(0.5)


def show_metrics(text: str) -> None:
    """The lines an operator looks at first: the job's state, step and restarts, its GPUs (with the
    `spx_job` label), and the fixture's one NVLink link that is down."""
    wanted = ("spx_job_state{", "spx_job_restarts_total{", "spx_job_step{", "spx_job_samples_per_second{",
              "spx_gpu_utilization_ratio{", "spx_gpu_memory_used_bytes{", 'spx_gpu_nvlink_up{gpu="3",link="7"')
    for line in text.splitlines():
        if not line.startswith(wanted):
            continue
        if line.startswith("spx_job_state{") and not line.endswith(" 1.0"):
            continue  # one line per possible state; show the current one
        if line.startswith("spx_gpu_") and "nvlink" not in line and 'spx_job="' not in line:
            continue  # GPUs not allocated to the job
        print("    " + line)


def main() -> int:
    shutil.rmtree(ROOT, ignore_errors=True)
    ROOT.mkdir(parents=True)
    say("starting the daemon: spx-trainer --root .demo/root --gpu-backend fake (8 fake H100 SXM GPUs)")
    daemon = DaemonWatch()
    killed = [False]
    try:
        if not daemon.ready.wait(60):
            say("the daemon did not come up; see its output above")
            return 1
        job = write_job(ROOT.parent)
        say(f"submitting {job.name}: spx submit (drops the file into {ROOT / 'spool'})")
        spx("submit", str(job))
        snapshot: list[str] = []
        doc = follow_until_done(killed, daemon.metrics_url, snapshot)
        print()
        say(f"job {doc['state']} after {doc['attempts']} attempts. spx status {JOB}:")
        print(spx("status", JOB))
        if snapshot:
            say(f"a few lines of {daemon.metrics_url}, scraped while attempt 2 was training:")
            show_metrics(snapshot[0])
        log2 = ROOT / "log" / JOB / "attempt-2.log"
        digest = [line for line in log2.read_text().splitlines() if "final_state_sha256=" in line] if log2.exists() else []
        print()
        say(f"logs: {shown(ROOT / 'log' / JOB)}/attempt-N.log; "
            f"checkpoints: {shown(ROOT / 'checkpoints' / pwd.getpwuid(os.getuid()).pw_name / JOB)}")
        if digest:
            say(f"final model state hash (rank 0): {digest[-1].split('final_state_sha256=')[-1][:16]}…")
        return 0 if doc["state"] == "succeeded" and doc["attempts"] >= 2 else 1
    except KeyboardInterrupt:
        say("interrupted; stopping the daemon and its job")
        return 130
    finally:
        daemon.stop()
        say("the demo's daemon is stopped; nothing it started is left running")


def shown(path: Path) -> str:
    """`path` as the user can type it: relative to where they ran the demo when it is below it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


NEXT_STEPS = """
Try it yourself (README.md, "Try it in 2 minutes"), in the checkout:

  terminal 1 - the daemon; it stays in the foreground, printing its log, until Ctrl-C:
    .venv/bin/spx-trainer --root ./spx-root --gpu-backend fake

  terminal 2 - spx is in .venv: activate it, and say which daemon to talk to:
    . .venv/bin/activate
    export SPX_ROOT=$PWD/spx-root
    spx submit examples/jobs/ddp-crash-resume.yaml
    spx ls
    spx logs ddp-crash-resume -f
"""


if __name__ == "__main__":
    status = main()
    if status == 0:
        print(NEXT_STEPS)
    sys.exit(status)
