"""A stable fingerprint of a model's weights, for bitwise comparison of two runs.

The digest covers every entry's name, dtype, shape and raw bytes in sorted-name order, each field
length-prefixed so that no two different state dicts can serialise to the same byte stream. It is
independent of pickling, zip layout and device, unlike hashing a `torch.save` file.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import torch


def _field(h: hashlib._Hash, data: bytes) -> None:
    h.update(len(data).to_bytes(8, "little"))
    h.update(data)


def state_sha256(state_dict: Mapping[str, torch.Tensor]) -> str:
    """sha256 over (name, dtype, shape, bytes) of every tensor, sorted by name."""
    h = hashlib.sha256()
    for name in sorted(state_dict):
        value = state_dict[name]
        _field(h, name.encode())
        if not isinstance(value, torch.Tensor):
            _field(h, repr(value).encode())
            continue
        t = value.detach().to("cpu").contiguous()
        _field(h, str(t.dtype).encode())
        _field(h, repr(tuple(t.shape)).encode())
        _field(h, t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
