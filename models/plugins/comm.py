"""Shared pieces of the distributed plugins: byte accounting, flattening, process-group helpers.

Bytes are *modelled* per rank and step from the algorithm each plugin runs, independent of how gloo
or NCCL schedule the transfer, so the plugins compare on one scale:

* ring all-reduce of ``B`` bytes over ``P`` ranks: each rank sends ``2 (P - 1) / P * B``;
* all-gather of ``b`` bytes from every rank: each rank sends ``(P - 1) * b``;
* all-to-all: each rank sends what it addresses to the other ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from postcast.datasets.core.errors import ConfigError

DEFAULT_TIMEOUT_S = 300.0  # every collective of the plugins runs on a group with this timeout


@dataclass
class ByteCounter:
    """Modelled bytes this rank sent, and how often the plugin communicated."""

    bytes_sent: float = 0.0
    calls: int = 0

    def allreduce(self, nbytes: float, world: int) -> None:
        self.bytes_sent += 2.0 * (world - 1) / world * nbytes if world > 1 else 0.0

    def allgather(self, nbytes_per_rank: float, world: int) -> None:
        self.bytes_sent += (world - 1) * nbytes_per_rank

    def send(self, nbytes: float) -> None:
        self.bytes_sent += nbytes


def world_of(group: dist.ProcessGroup | None) -> tuple[int, int]:
    """(rank, world size) in ``group``; (0, 1) when torch.distributed is not initialised."""
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def timeout(seconds: float) -> timedelta:
    if seconds <= 0:
        msg = f"timeout_s={seconds}: collectives need a positive timeout (e.g. {DEFAULT_TIMEOUT_S})"
        raise ConfigError(msg)
    return timedelta(seconds=seconds)


def flat_grads(params: Sequence[torch.Tensor]) -> torch.Tensor:
    """All gradients as one float32 vector (N,); missing gradients count as zeros."""
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).float() for p in params])


def write_flat_grads(params: Sequence[torch.Tensor], flat: torch.Tensor) -> None:
    """Inverse of :func:`flat_grads`: copy the (N,) vector back into each ``p.grad``."""
    off = 0
    for p in params:
        n = p.numel()
        chunk = flat[off : off + n].view_as(p).to(p.dtype)
        if p.grad is None:
            p.grad = chunk.clone()
        else:
            p.grad.copy_(chunk)
        off += n
