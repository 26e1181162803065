"""Copy a state tree to host memory: the only part of an async checkpoint the training loop pays.

Training mutates parameters and optimizer moments in place, so a background writer needs its own
copy taken between two steps. The copy goes into host buffers that are allocated once and reused
(pinned when CUDA is present, so device-to-host copies run at full speed without a staging
buffer); a fresh allocation per save would spend most of the stall on page faults. Reuse is safe
because the checkpointer starts a snapshot only after the previous save finished with it.
"""

from __future__ import annotations

import copy
from typing import Any

import torch


class HostSnapshotter:
    """Copies nested dicts/lists/tuples of tensors into reusable host buffers."""

    def __init__(self, pin_memory: bool | None = None) -> None:
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else pin_memory
        self._buffers: dict[tuple, torch.Tensor] = {}

    def copy(self, tree: Any) -> Any:
        """A deep copy of `tree` whose tensors live in host memory owned by this snapshotter."""
        out = self._copy(tree, ())
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()  # the non_blocking copies must land before a writer reads them
        return out

    def _copy(self, node: Any, path: tuple) -> Any:
        if isinstance(node, torch.Tensor):
            return self._copy_tensor(node, path)
        if isinstance(node, dict):
            return type(node)((k, self._copy(v, (*path, k))) for k, v in node.items())
        if isinstance(node, list):
            return [self._copy(v, (*path, i)) for i, v in enumerate(node)]
        if isinstance(node, tuple) and not hasattr(node, "_fields"):
            return tuple(self._copy(v, (*path, i)) for i, v in enumerate(node))
        return copy.deepcopy(node)

    def _copy_tensor(self, t: torch.Tensor, path: tuple) -> torch.Tensor:
        src = t.detach()
        buf = self._buffers.get(path)
        if buf is None or buf.shape != src.shape or buf.dtype != src.dtype:
            buf = torch.empty(
                src.shape, dtype=src.dtype, device="cpu", pin_memory=self.pin_memory and src.is_cuda
            )
            self._buffers[path] = buf
        buf.copy_(src, non_blocking=src.is_cuda)
        return buf

    def release(self) -> None:
        """Drop the buffers (e.g. before the final save, when no reuse will follow)."""
        self._buffers.clear()
