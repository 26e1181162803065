"""Helpers of the GPU tests: reading a scrape, counting NVML calls, launching torchrun runs.

Stdlib, prometheus-client and spx.daemon only: nothing here imports torch.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metrics_text import samples

from harness import job_pids, wait_for
from spx.daemon.contract.worker_env import (
    ENV_ATTEMPT,
    ENV_ATTEMPT_ID,
    ENV_CHECKPOINT_DIR,
    ENV_HEARTBEAT_FILE,
    ENV_NAMES,
)
from spx.daemon.gpu.xid import handle_key
from spx.daemon.run import proctree
from spx.daemon.run.launcher import free_port

PY = sys.executable

# --- scrapes ------------------------------------------------------------------------------------


def error_counts(text: str) -> dict[str, float]:
    return {lab["function"]: v for lab, v in samples(text, "spx_nvml_errors_total")}


# --- NVML -----------------------------------------------------------------------------------------


class CountingNvml:
    """The real `pynvml` module behind a proxy that records every `nvmlDevice*` call.

    `GpuBackend` takes any module-like object as its NVML (that is how the fake plugs in), so a
    backend built on this proxy runs the real driver calls and the test sees each one as
    (function name, handle key); constants, structs and `NVMLError` pass through untouched.
    """

    def __init__(self, module: Any) -> None:
        self._module = module
        self.calls: list[tuple[str, int | None]] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._module, name)
        if not (name.startswith("nvmlDevice") and callable(attr) and not isinstance(attr, type)):
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, handle_key(args[0]) if args else None))
            return attr(*args, **kwargs)

        return counted

    def per_gpu(self, handles: list[Any]) -> list[dict[str, int]]:
        """{function: calls} for each GPU (by index) since the last `calls.clear()`."""
        index = {handle_key(h): i for i, h in enumerate(handles)}
        out: list[dict[str, int]] = [{} for _ in handles]
        for function, key in list(self.calls):
            if key in index:
                counts = out[index[key]]
                counts[function] = counts.get(function, 0) + 1
        return out


def text_of(value: Any) -> str:
    """pynvml returns str or bytes depending on its version."""
    return value.decode() if isinstance(value, bytes) else str(value)


def nvlink_states(nvml: Any, handle: Any) -> dict[int, int]:
    """{link: nvmlDeviceGetNvLinkState} for every link the GPU has, asked link by link through the
    legacy per-link API (not the field-values call the collector uses). {} on a GPU without NVLink."""
    states = {}
    for link in range(nvml.NVML_NVLINK_MAX_LINKS):
        try:
            states[link] = int(nvml.nvmlDeviceGetNvLinkState(handle, link))
        except nvml.NVMLError as err:
            if err.value in (nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_INVALID_ARGUMENT):
                continue
            raise
    return states


def nvidia_smi_uuids(smi: str) -> list[str]:
    """UUIDs of the GPUs `nvidia-smi -L` lists, in its (= NVML's) index order; MIG lines skipped."""
    out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60, check=True).stdout
    return [m.group(1) for m in re.finditer(r"^GPU \d+: .*\(UUID: (GPU-[^)]+)\)", out, re.M)]


# --- processes ------------------------------------------------------------------------------------


@dataclass
class Finished:
    """A torchrun launch that has ended: exit status and its combined output."""

    returncode: int
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def tail(self, chars: int = 4000) -> str:
        return self.output()[-chars:]

    def final_hash(self) -> str:
        found = re.findall(r"final_state_sha256=([0-9a-f]{64})$", self.output(), re.M)
        assert len(found) == 1, f"expected one final_state_sha256 line:\n{self.tail()}"
        return found[0]


def torchrun(script: Path, args: list[str], *, nproc: int, work: Path, name: str, attempt: int = 1,
             ckpt: Path | None = None, env: dict[str, str] | None = None, timeout: float = 600) -> Finished:
    """Run `script` under `python -m torch.distributed.run --nproc-per-node=nproc` to its end.

    The environment is the daemon's contract for attempt `attempt` (checkpoint dir, heartbeat file,
    no SPX_RESUME_FROM, so the trainer resumes from the latest complete checkpoint in the dir) plus
    `env`. Every process of the run carries an attempt tag: on timeout all of them are killed, and
    the call returns only when none is left, so the GPUs are free for the next run.
    """
    tag = uuid.uuid4().hex
    log = work / f"{name}-a{attempt}.log"
    full_env = {k: v for k, v in os.environ.items() if k not in ENV_NAMES}
    full_env.update({
        ENV_ATTEMPT: str(attempt), ENV_ATTEMPT_ID: tag, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
        ENV_CHECKPOINT_DIR: str(ckpt or work / f"{name}-ckpt"),
        ENV_HEARTBEAT_FILE: str(work / f"{name}-a{attempt}.heartbeat"),
        **(env or {}),
    })
    argv = [PY, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc-per-node={nproc}", "--master-addr=127.0.0.1",
            f"--master-port={free_port()}", str(script), *args]
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=full_env, start_new_session=True)
    try:
        rc = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proctree.signal_attempt(tag, proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError(f"{name} (attempt {attempt}) ran over {timeout:.0f} s:\n{log.read_text()[-4000:]}") from None
    finally:
        wait_for(lambda: not proctree.attempt_pids(tag), 60, f"every process of {name} to exit")
    return Finished(rc, log)


def worker_pids(job: str, script_name: str) -> list[int]:
    """The training workers of `job`: its processes running `script_name`, launcher excluded."""
    pids = []
    for pid in job_pids(job):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(c.endswith(script_name.encode()) for c in cmd) and b"torch.distributed.run" not in cmd:
            pids.append(pid)
    return pids


def opens_nvidia_device(pid: int) -> bool:
    """True if `pid` holds an open /dev/nvidiaN (a CUDA context), judged from /proc/PID/fd."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if re.fullmatch(r"/dev/nvidia\d+", os.readlink(f"/proc/{pid}/fd/{fd}")):
                return True
        except OSError:
            continue
    return False


def pid_namespace_depth() -> int:
    """How many PID namespaces this process is in (1 on a plain host; more in a container)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return len(line.split()) - 1
    return 1
