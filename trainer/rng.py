"""Every random stream a training step reads, captured and restored per rank.

Exact resume needs each rank's python, numpy, torch-CPU and CUDA generators back where they were
when the checkpoint was taken: dropout masks, random augmentation and sampling all draw from them,
and each rank draws a different stream. States are stored as plain ints, tuples and tensors so the
rank files load with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import random
from typing import Any

import torch

try:  # numpy is optional for users; the library works without it.
    import numpy as np
except ImportError:  # pragma: no cover - numpy ships with the train extra
    np = None  # type: ignore[assignment]


def seed_all(seed: int) -> None:
    """Seed python, numpy and torch (CPU and every CUDA device) with one value."""
    random.seed(seed)
    if np is not None:
        np.random.seed(seed % (1 << 32))
    torch.manual_seed(seed)


def capture() -> dict[str, Any]:
    """A snapshot of every generator this process uses (copies, safe to keep across steps)."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if np is not None:
        name, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = (name, torch.from_numpy(keys.astype("int64")), int(pos), int(has_gauss), float(cached))
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two `capture`s hold the same generator states (no stream drew in between)."""
    if a.keys() != b.keys() or a["python"] != b["python"] or not torch.equal(a["torch"], b["torch"]):
        return False
    if "numpy" in a and (a["numpy"][2:] != b["numpy"][2:] or not torch.equal(a["numpy"][1], b["numpy"][1])):
        return False
    return all(torch.equal(x, y) for x, y in zip(a.get("cuda", []), b.get("cuda", []), strict=True))


def restore(state: dict[str, Any]) -> None:
    """Put every generator back to `state` (from `capture`, possibly after a save/load round trip)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
    if np is not None and "numpy" in state:
        name, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((name, keys.numpy().astype("uint32"), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
