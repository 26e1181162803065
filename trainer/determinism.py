"""Deterministic algorithms on, without paying for torch's compiler at start-up.

`torch.use_deterministic_algorithms(True)` sets one flag in torch's C++ core and, since torch 2.x,
also `torch._inductor.config.deterministic` — importing all of TorchInductor to do so: 2-4 s of every
worker's start-up on a CPU host (measured with `spx status --timeline`: it was most of
`torch_imported` → `rendezvous`), paid again by every restart, for a compiler most jobs never use.

`enable()` sets the same two things lazily: the core flag directly, and inductor's through the
environment variable its config reads when (if ever) it is imported — or on the module itself when
something imported it already. The effect on every op is the same flag, so resume stays bitwise
exact. Where torch lacks the private setter, it falls back to the public call.
"""

from __future__ import annotations

import os
import sys

import torch

INDUCTOR_ENV = "TORCHINDUCTOR_DETERMINISTIC"


def enable(warn_only: bool = True) -> None:
    """What `torch.use_deterministic_algorithms(True, warn_only=warn_only)` does, minus the import."""
    setter = getattr(torch._C, "_set_deterministic_algorithms", None)
    if setter is None:
        torch.use_deterministic_algorithms(True, warn_only=warn_only)
        return
    os.environ[INDUCTOR_ENV] = "1"  # read by torch._inductor.config at its import
    inductor = sys.modules.get("torch._inductor.config")
    if inductor is not None:
        inductor.deterministic = True  # type: ignore[attr-defined]
    setter(True, warn_only=warn_only)
