"""Run the example scripts as real torchrun / deepspeed process groups and observe them.

Each run gets its own checkpoint dir and heartbeat file, a free rendezvous port, and an
SPX_ATTEMPT_ID tag, so a test can SIGKILL or SIGTERM every process of it the way the daemon does:
torchrun starts its workers in sessions of their own, so signalling the launcher's group is not
enough (a worker outlives a kill -9 of the agent).
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from harness import EXAMPLES, wait_for
from spx.daemon.contract.worker_env import ENV_ATTEMPT_ID, read_heartbeat
from spx.daemon.run import proctree
from spx.daemon.run.launcher import free_port

PY = sys.executable
# DeepSpeed JIT-builds its CPU ops (cpu_adam, the shm collectives) on first use, under a FileBaton: a
# `lock` file that a build killed part way leaves behind, and every later build then waits on it for
# ever. The suite builds them beside its own venv (a fresh clone builds afresh), and a lock older than
# this session belongs to no build of it (this suite's one DeepSpeed test starts after collection).
DS_OPS_DIR = Path(sys.prefix) / "torch_extensions"
_SESSION_START = time.time()


def deepspeed_ops_dir() -> Path:
    """The suite's DeepSpeed op dir, with locks left by builds that died before this session removed."""
    for lock in DS_OPS_DIR.glob("*/lock"):
        if lock.stat().st_mtime < _SESSION_START:
            lock.unlink(missing_ok=True)
    return DS_OPS_DIR
# 2 ranks × batch 8 over 256 sequences: 16 steps per epoch, so 60 steps cross 3 epoch boundaries
# and a checkpoint every 10 steps lands mid-epoch.
DDP_ARGS = ["--batch_size", "8", "--model-size", "tiny", "--seed", "1234", "--steps", "60",
            "--checkpoint-every", "10", "--dataset-size", "256", "--gradient_checkpointing"]
STEPS_PER_EPOCH = 16


@dataclass
class Run:
    proc: subprocess.Popen
    tag: str
    ckpt: Path
    heartbeat: Path
    log: Path

    def step(self) -> int:
        beat = read_heartbeat(self.heartbeat)
        return beat.step if beat else -1

    def wait_step(self, step: int, timeout: float = 120) -> int:
        return wait_for(lambda: self.step() >= step or self._died(), timeout, f"step {step}", interval=0.02) and self.step()

    def _died(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"run exited with {self.proc.returncode} early:\n{self.output()[-3000:]}")
        return False

    def signal_all(self, sig: int) -> list[int]:
        return proctree.signal_attempt(self.tag, self.proc.pid, sig)

    def wait(self, timeout: float = 300) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"run still going after {timeout:g} s:\n{self.output()[-3000:]}") from None

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def final_hash(self) -> str:
        found = re.findall(r"^final_state_sha256=([0-9a-f]{64})$", self.output(), re.M)
        assert len(found) == 1, f"expected one final_state_sha256 line:\n{self.output()[-3000:]}"
        return found[0]


def start_ddp(work: Path, name: str, *extra: str, attempt: int = 1, ckpt: Path | None = None, nproc: int = 2,
              env: dict[str, str] | None = None) -> Run:
    ckpt = ckpt or work / f"{name}-ckpt"
    hb = work / f"{name}-a{attempt}.heartbeat"
    log = work / f"{name}-a{attempt}.log"
    env = {**os.environ, "SPX_CHECKPOINT_DIR": str(ckpt), "SPX_HEARTBEAT_FILE": str(hb),
           "SPX_ATTEMPT": str(attempt), "OMP_NUM_THREADS": "1", ENV_ATTEMPT_ID: (tag := uuid.uuid4().hex), **(env or {})}
    argv = [PY, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc-per-node={nproc}", "--master-addr=127.0.0.1",
            f"--master-port={free_port()}", str(EXAMPLES / "train_ddp.py"), *DDP_ARGS, *extra]
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return Run(proc, tag, ckpt, hb, log)


def start_deepspeed(work: Path, name: str, *extra: str, attempt: int = 1) -> Run:
    ckpt = work / f"{name}-ckpt"
    hb = work / f"{name}-a{attempt}.heartbeat"
    log = work / f"{name}-a{attempt}.log"
    env = {**os.environ, "SPX_CHECKPOINT_DIR": str(ckpt), "SPX_HEARTBEAT_FILE": str(hb),
           "SPX_ATTEMPT": str(attempt), "OMP_NUM_THREADS": "1", ENV_ATTEMPT_ID: (tag := uuid.uuid4().hex),
           "TORCH_EXTENSIONS_DIR": str(deepspeed_ops_dir())}
    world = base64.urlsafe_b64encode(json.dumps({"localhost": [0, 1]}).encode()).decode()
    argv = [PY, "-m", "deepspeed.launcher.launch", f"--world_info={world}", "--master_addr=127.0.0.1",
            f"--master_port={free_port()}", str(EXAMPLES / "train_deepspeed.py"), "--deepspeed",
            "--deepspeed_config", str(EXAMPLES / "ds_config.json"), "--model-size", "tiny", "--seed", "5", *extra]
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return Run(proc, tag, ckpt, hb, log)


def kill9_everything(run: Run) -> None:
    """SIGKILL the launcher and every worker of `run`, and wait until none is left."""
    run.signal_all(signal.SIGKILL)
    run.wait(30)
    wait_for(lambda: not proctree.attempt_pids(run.tag), 10, "every process of the killed run to be gone")
