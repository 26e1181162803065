"""Sharded, reshuffled-per-epoch data whose position survives a restart.

`DistributedSampler` gives each rank a disjoint shard and reshuffles with `set_epoch`, but after a
restart it can only start an epoch from the beginning, so a resumed run would see the first
batches of the epoch twice. `ResumableDistributedSampler` skips the samples already consumed in
the current epoch, so a resumed rank yields exactly the indices the uninterrupted run would have
yielded next, without loading (and discarding) the skipped samples.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


@dataclass
class DataPosition:
    """Where a rank is in its data stream: `batches` micro-batches of `epoch` consumed."""

    epoch: int = 0
    batches: int = 0


class ResumableDistributedSampler(DistributedSampler):
    """`DistributedSampler` plus `set_epoch(epoch, skip=n)`: drop this rank's first n indices.

    The skip applies to the epoch it is set with only; the shuffle order (seed + epoch) is the
    parent's, so resumed and uninterrupted runs agree index for index.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.skip = 0

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        super().set_epoch(epoch)
        self.skip = max(0, skip)

    def __iter__(self) -> Iterator[int]:
        it = super().__iter__()
        for _ in range(min(self.skip, self.num_samples)):
            next(it)
        yield from it

    def __len__(self) -> int:
        return max(0, self.num_samples - self.skip)


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed of a loader's own generator in `epoch`: a function of (seed, epoch) only, so
    DataLoader workers get the same base seed whether or not the run was resumed."""
    return (seed * 1_000_003 + epoch) % (1 << 63)


def make_dataloader(
    dataset: Dataset,
    *,
    batch_size: int,
    rank: int,
    world_size: int,
    seed: int,
    shuffle: bool = True,
    drop_last: bool = False,
    pin_memory: bool = False,
    **loader_kwargs: Any,
) -> DataLoader:
    """A DataLoader over this rank's shard with a resumable sampler and its own generator.

    The generator keeps `iter(loader)` from drawing from the global torch RNG (which would shift
    the model's random stream by one draw per epoch); the trainer reseeds it every epoch.
    """
    sampler = ResumableDistributedSampler(
        dataset, num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last
    )
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        drop_last=drop_last,
        pin_memory=pin_memory,
        generator=torch.Generator(),
        **loader_kwargs,
    )
    loader._spx_seed = seed  # type: ignore[attr-defined]  # marks a loader whose generator we own
    return loader


def batches_per_epoch(loader: DataLoader) -> int:
    """Micro-batches in one full epoch of this rank, independent of any skip in effect."""
    sampler = loader.sampler
    if isinstance(sampler, ResumableDistributedSampler) and loader.batch_size:
        n = sampler.num_samples
        return n // loader.batch_size if loader.drop_last else math.ceil(n / loader.batch_size)
    return len(loader)


def start_epoch(loader: DataLoader, epoch: int, skip_batches: int) -> int:
    """Point the loader at `epoch` with `skip_batches` already consumed.

    Returns how many batches the caller must still discard from the iterator itself: 0 when the
    sampler can skip by index (ours), else `skip_batches` (any other sampler, correct but slower).
    """
    seed = getattr(loader, "_spx_seed", None)
    if seed is not None and loader.generator is not None:
        loader.generator.manual_seed(epoch_seed(seed, epoch))
    sampler = loader.sampler
    if isinstance(sampler, ResumableDistributedSampler) and loader.batch_size:
        sampler.set_epoch(epoch, skip=skip_batches * loader.batch_size)
        return 0
    if hasattr(sampler, "set_epoch"):
        sampler.set_epoch(epoch)
    return skip_batches
