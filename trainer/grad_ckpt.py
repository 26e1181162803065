"""Gradient (activation) checkpointing for Hugging Face models and plain modules.

Hugging Face models know where their blocks are: `gradient_checkpointing_enable()` is used when
present. For any other module, the repeated blocks are the children of its largest `ModuleList`
(or `Sequential`); each block's forward is replaced on the instance by a non-reentrant
`torch.utils.checkpoint` call. Patching the instance rather than wrapping it keeps the state dict
keys unchanged, so checkpoints load with or without the flag. Non-reentrant checkpointing restores
the RNG state on recompute, so dropout masks (and therefore exact resume) are unaffected.
"""

from __future__ import annotations

import functools
from typing import Any

from torch import nn
from torch.utils.checkpoint import checkpoint


def _largest_block_list(model: nn.Module) -> nn.Module | None:
    lists = [m for m in model.modules() if isinstance(m, (nn.ModuleList, nn.Sequential)) and len(m) > 0]
    return max(lists, key=len) if lists else None


def _checkpointed(forward: Any, *args: Any, **kwargs: Any) -> Any:
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def enable_gradient_checkpointing(model: nn.Module) -> int:
    """Turn on activation checkpointing; returns how many blocks were wrapped (-1: HF's own).

    Raises ValueError when a plain module has no block list to checkpoint (say which to wrap:
    give the model a `gradient_checkpointing_enable()` method).
    """
    hf_enable = getattr(model, "gradient_checkpointing_enable", None)
    if callable(hf_enable):
        try:
            hf_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        except TypeError:  # older transformers, or a user method without kwargs
            hf_enable()
        return -1
    blocks = _largest_block_list(model)
    if blocks is None:
        raise ValueError(
            f"{type(model).__name__} has no ModuleList/Sequential of blocks to checkpoint; "
            "define gradient_checkpointing_enable() on it or do not pass gradient_checkpointing"
        )
    for block in blocks:
        if not getattr(block, "_spx_checkpointed", False):
            block.forward = functools.partial(_checkpointed, block.forward)  # type: ignore[method-assign]
            block._spx_checkpointed = True  # type: ignore[assignment]
    return len(blocks)
