"""1. The access stream: a rank's future accesses, replayed from the sampler's arguments.

``torch.utils.data.DistributedSampler`` permutes with a generator seeded ``seed + epoch``, pads by
wrapping around (or truncates with ``drop_last``) and takes the stride ``[rank::world]``; Lightning
injects exactly that sampler (seed ``PL_GLOBAL_SEED``, else 0) in distributed runs.
:func:`access_stream` re-derives what it yields (padding included); :class:`ReplaySampler` is that
real sampler, which also tells the clairvoyant dataset which epoch starts and what it will yield.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import Dataset, DistributedSampler


def lightning_seed() -> int:
    """The seed Lightning gives the DistributedSampler it injects (``PL_GLOBAL_SEED``, else 0)."""
    return int(os.getenv("PL_GLOBAL_SEED", "0"))


@dataclass(frozen=True)
class StreamSpec:
    """Everything a rank's access stream depends on (DistributedSampler's arguments)."""

    n: int  # dataset length
    seed: int = 0
    rank: int = 0
    world: int = 1
    shuffle: bool = True
    drop_last: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world or self.n <= 0:
            msg = f"n={self.n}, rank {self.rank}, world {self.world}: need n > 0 and 0 <= rank < world"
            raise ValueError(msg)

    @property
    def per_epoch(self) -> int:
        """Accesses of this rank per epoch (DistributedSampler.num_samples)."""
        if self.drop_last and self.n % self.world:
            return math.ceil((self.n - self.world) / self.world)
        return math.ceil(self.n / self.world)

    def epoch(self, epoch: int) -> list[int]:
        return access_stream(self, epoch)


def access_stream(spec: StreamSpec, epoch: int) -> list[int]:
    """The indices ``DistributedSampler(spec.n, spec.world, spec.rank, spec.shuffle, spec.seed,
    spec.drop_last)`` yields after ``set_epoch(epoch)``, re-derived without the sampler."""
    if spec.shuffle:
        g = torch.Generator()
        g.manual_seed(spec.seed + epoch)
        order = torch.randperm(spec.n, generator=g).tolist()
    else:
        order = list(range(spec.n))
    total = spec.per_epoch * spec.world
    # drop_last: truncate; else pad by wrapping around, as often as needed
    order = order[:total] if spec.drop_last else (order * math.ceil(total / spec.n))[:total]
    return order[spec.rank : total : spec.world]


class ReplaySampler(DistributedSampler[int]):
    """The real ``DistributedSampler`` (so Lightning keeps it and calls ``set_epoch``), which also
    tells the clairvoyant dataset which epoch starts and what it will yield."""

    def __init__(self, dataset: Dataset[Any], spec: StreamSpec, begin_epoch: Callable[[int, list[int]], None]):
        super().__init__(
            dataset,
            num_replicas=spec.world,
            rank=spec.rank,
            shuffle=spec.shuffle,
            seed=spec.seed,
            drop_last=spec.drop_last,
        )
        self.begin_epoch = begin_epoch  # the clairvoyant dataset's: which epoch starts, what it will yield

    def __iter__(self) -> Iterator[int]:
        indices = list(super().__iter__())
        self.begin_epoch(self.epoch, indices)
        return iter(indices)
