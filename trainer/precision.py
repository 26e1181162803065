"""bf16 autocast where the hardware does bf16 natively, fp32 elsewhere.

H100/H200/B200 have native bf16 and the seed always uses it. CPUs differ: with AVX512-BF16 or
AMX, bf16 matmuls are fast; without them torch emulates bf16 and a step gets slower than fp32, so
"auto" keeps fp32 there. `True` forces bf16 anywhere torch supports it (for tests of the path).
"""

from __future__ import annotations

import contextlib
from functools import cache
from typing import Any

import torch


@cache
def cpu_has_native_bf16() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool(flags & {"avx512_bf16", "amx_bf16"})
    except OSError:
        pass
    return False


def resolve_bf16(setting: bool | str, device: torch.device) -> bool:
    if setting == "auto":
        if device.type == "cuda":
            return torch.cuda.is_bf16_supported()
        return cpu_has_native_bf16()
    if isinstance(setting, str):
        raise ValueError(f"bf16 must be True, False or 'auto', got {setting!r}")
    return bool(setting)


def autocast_context(device: torch.device, enabled: bool) -> Any:
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
