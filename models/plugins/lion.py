"""Lion Cub (Ishikawa et al., arXiv 2411.16462): Lion whose quantised updates are what ranks exchange.

Lion's update is ``u = sign(beta1 m + (1 - beta1) g)`` (then ``m = beta2 m + (1 - beta2) g``), so it
quantises for free. Each step every rank computes u from its *local* gradient (DDP runs
``comm: noop``), the ranks combine the updates by majority vote ``sign(sum_r u_r)`` and all apply
the same voted update, so parameters stay identical across ranks while the momenta stay local:

* ``bits=8`` (p-bit): int8 all-reduce of the {-1, 0, +1} vectors (exact while P <= 127), 1 byte
  per entry instead of 4;
* ``bits=1``: the signs packed 8 per byte (uint8), all-gathered, unpacked and voted; N / 8 bytes
  per rank (zeros count as +1);
* selective momentum synchronisation: every ``momentum_sync_every`` steps the momenta are averaged
  (float32 all-reduce); 0 never synchronises them.

With one process (or ``torch.distributed`` not initialised) it is plain Lion.
Select it with the Lightning CLI's ``optimizer:`` key (see ``configs/plugins/lion_cub.yaml``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist

from postcast.datasets.core.errors import ConfigError
from postcast.models.plugins.comm import ByteCounter, world_of

_BITS = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8)


def pack_signs(u: torch.Tensor) -> torch.Tensor:
    """(N,) signs -> (ceil(N / 8),) uint8, bit j of byte i = u[8 i + j] >= 0."""
    bits = (u >= 0).to(torch.uint8)
    pad = -bits.numel() % 8
    bits = torch.cat([bits, torch.zeros(pad, dtype=torch.uint8)]).view(-1, 8)  # (N / 8, 8)
    return (bits * _BITS).sum(dim=1, dtype=torch.uint8)


def unpack_signs(packed: torch.Tensor, n: int) -> torch.Tensor:
    """Inverse of :func:`pack_signs`: (ceil(N / 8),) uint8 -> (N,) int8 in {-1, +1}."""
    bits = (packed.view(-1, 1) & _BITS).ne(0).view(-1)[:n]  # (N,)
    return bits.to(torch.int8) * 2 - 1


def vote(
    u: torch.Tensor, *, bits: int, group: dist.ProcessGroup | None = None, counter: ByteCounter | None = None
) -> torch.Tensor:
    """Majority vote sign(sum over ranks of u) of the local updates u (N,) in {-1, 0, 1}; float32 (N,)."""
    counter = counter if counter is not None else ByteCounter()
    if bits not in (1, 8):
        msg = f"bits={bits}: Lion Cub exchanges 8-bit (p-bit) or 1-bit packed votes; use 8 or 1"
        raise ConfigError(msg)
    _, world = world_of(group)
    if world == 1:
        return u.float()
    if bits == 8:
        if world > 127:
            msg = f"bits=8 sums int8 votes, exact only for <= 127 ranks (have {world}); use bits=1"
            raise ConfigError(msg)
        s = u.to(torch.int8)
        dist.all_reduce(s, group=group)  # int8 reduces on gloo and NCCL (int16 does not on gloo)
        counter.allreduce(s.numel(), world)
        return torch.sign(s.float())
    packed = pack_signs(u)  # bits == 1
    every = [torch.empty_like(packed) for _ in range(world)]
    dist.all_gather(every, packed, group=group)
    counter.allgather(packed.numel(), world)
    total = torch.stack([unpack_signs(p, u.numel()).to(torch.int32) for p in every]).sum(0)  # (N,)
    return torch.sign(total.float())


class LionCub(torch.optim.Optimizer):
    """Lion with communicated, quantised updates and selective momentum synchronisation.

    Args:
        params: parameters or groups.
        lr: learning rate (Lion wants ~3-10x smaller than AdamW).
        betas: (beta1 for the update interpolation, beta2 for the momentum).
        weight_decay: decoupled weight decay.
        bits: 8 (int8 sum of votes) or 1 (packed sign bits, all-gather).
        momentum_sync_every: average the momenta over ranks every this many steps (0: never).
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
        bits: int = 8,
        momentum_sync_every: int = 0,
    ) -> None:
        if lr <= 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            msg = f"lr={lr}, betas={betas}: need lr > 0 and betas in [0, 1)"
            raise ConfigError(msg)
        if bits not in (1, 8):
            msg = f"bits={bits}: use 8 (int8 vote sums) or 1 (packed signs)"
            raise ConfigError(msg)
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "weight_decay": weight_decay})
        self.bits, self.momentum_sync_every = bits, momentum_sync_every
        self.counter = ByteCounter()
        self.steps = 0

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        params = [p for g in self.param_groups for p in g["params"] if p.grad is not None]
        if not params:
            return loss
        updates = []
        for g in self.param_groups:
            b1, _ = g["betas"]
            for p in g["params"]:
                if p.grad is None:
                    continue
                m = self.state[p].setdefault("exp_avg", torch.zeros_like(p))
                updates.append(torch.sign(b1 * m + (1 - b1) * p.grad).reshape(-1))
        voted = vote(torch.cat(updates), bits=self.bits, counter=self.counter)  # (N,)
        self.counter.calls += 1
        off = 0
        for g in self.param_groups:
            _, b2 = g["betas"]
            for p in g["params"]:
                if p.grad is None:
                    continue
                n = p.numel()
                p.mul_(1 - g["lr"] * g["weight_decay"])
                p.add_(voted[off : off + n].view_as(p).to(p.dtype), alpha=-g["lr"])
                self.state[p]["exp_avg"].lerp_(p.grad, 1 - b2)  # m = b2 m + (1 - b2) g
                off += n
        self.steps += 1
        self._sync_momentum(params)
        return loss

    def _sync_momentum(self, params: list[torch.Tensor]) -> None:
        _, world = world_of(None)
        if world == 1 or not self.momentum_sync_every or self.steps % self.momentum_sync_every:
            return
        moms = [self.state[p]["exp_avg"] for p in params]
        flat = torch.cat([m.reshape(-1) for m in moms])
        dist.all_reduce(flat)
        self.counter.allreduce(flat.numel() * 4, world)
        flat /= world
        off = 0
        for m in moms:
            m.copy_(flat[off : off + m.numel()].view_as(m))
            off += m.numel()
