"""tests/gpu/: the real backend on a real GPU host (real NVML, real CUDA, real NCCL).

Every test in this folder is marked `gpu` and skipped, with the reason, when NVML cannot be opened
or lists no GPU; the tests that train also need a CUDA build of torch with NCCL (`cuda_torch`) and
skip with their own reason without one. The probes run once per session and never import torch
into the pytest process: torch is asked in a subprocess, so the daemon-side tests stay light.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent


@cache
def nvml_problem() -> str | None:
    """Why this machine has no usable NVIDIA GPU, or None when NVML opens and lists at least one."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        return f"no NVIDIA driver/GPU on this machine (pynvml: {err})"
    try:
        count = pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError as err:
        return f"NVML opens but cannot count GPUs (pynvml nvmlDeviceGetCount: {err})"
    finally:
        pynvml.nvmlShutdown()
    if count == 0:
        return "NVML opens but lists 0 GPUs on this machine"
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test of this folder `gpu`; skip them all, with the reason, where no GPU is usable.

    The hook sees the whole session's items, so it touches only the ones under tests/gpu/ (and
    probes NVML only when there are some).
    """
    mine = [item for item in items if HERE in Path(str(item.path)).resolve().parents]
    if not mine:
        return
    problem = nvml_problem()
    for item in mine:
        item.add_marker(pytest.mark.gpu)
        if problem:
            item.add_marker(pytest.mark.skip(reason=problem))


@pytest.fixture
def nvml() -> Iterator[Any]:
    """The real `pynvml` module, initialised for this test (NVML counts inits; shut down after)."""
    import pynvml

    pynvml.nvmlInit()
    try:
        yield pynvml
    finally:
        pynvml.nvmlShutdown()


@pytest.fixture
def nvml_backend() -> Iterator[Any]:
    """`open_backend("nvml")`, exactly as `spx-trainer --gpu-backend nvml` opens it; closed after
    (which also stops the XID thread that `build_registry` starts)."""
    from spx.daemon.gpu.backend import open_backend

    backend = open_backend("nvml")
    try:
        yield backend
    finally:
        backend.close()


_TORCH_PROBE = r"""
import json, torch, torch.distributed as dist
info = {"torch": torch.__version__, "cuda_version": torch.version.cuda, "available": torch.cuda.is_available()}
if info["available"]:
    info["count"] = torch.cuda.device_count()
    info["names"] = [torch.cuda.get_device_name(i) for i in range(info["count"])]
    info["bf16"] = torch.cuda.is_bf16_supported()
    info["nccl"] = dist.is_available() and dist.is_nccl_available()
    info["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version())) if info["nccl"] else None
print(json.dumps(info))
"""


@pytest.fixture(scope="session")
def cuda_torch() -> dict:
    """What the venv's torch says about CUDA (asked in a subprocess); skips without CUDA + NCCL.

    Keys: torch, cuda_version, available, count (visible GPUs), names, bf16, nccl, nccl_version.
    """
    try:
        res = subprocess.run([sys.executable, "-c", _TORCH_PROBE], capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        pytest.fail("`import torch; torch.cuda.is_available()` took over 300 s")
    if res.returncode != 0:
        pytest.skip(f"torch cannot be imported in this venv: {res.stderr.strip()[-500:]}")
    info = json.loads(res.stdout.strip().splitlines()[-1])
    if not info["available"]:
        build = "a CPU build (torch.version.cuda is None)" if info["cuda_version"] is None else f"CUDA {info['cuda_version']}"
        pytest.skip(f"torch.cuda.is_available() is False (torch {info['torch']}, {build}): these tests need a CUDA "
                    "torch; `make venv` on a host with /proc/driver/nvidia/version installs one")
    if not info["count"]:
        pytest.skip("torch sees 0 CUDA devices (CUDA_VISIBLE_DEVICES hides them all?)")
    if not info["nccl"]:
        pytest.skip(f"torch {info['torch']} was built without NCCL (torch.distributed.is_nccl_available() is False)")
    return info
