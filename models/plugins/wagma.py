"""WAGMA-SGD (Li et al., TPDS 2021): group model averaging over rotating butterfly groups.

Each rank takes a local optimizer step (gradients are not all-reduced: the strategy runs
``comm: noop``), then averages its model with a group of S ranks; the groups are the butterfly
dimensions of the rank bits, rotated per step: with k = log2 S and L = log2(P) / k phases, in phase
s = t mod L rank r's group is the ranks that differ from r only in bits [s k, (s + 1) k). After L
consecutive phases every rank's information has reached every rank. Every ``global_every`` steps
a synchronous all-reduce of all P models restores exact consistency (bounds staleness).

This is the synchronous variant (group mean sum / S, exact consensus); the reference's
wait-avoiding activation and (sum + own) / (S + 1) weighting are not implemented.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from torch import nn

from postcast.datasets.core.errors import ConfigError
from postcast.models.plugins.comm import DEFAULT_TIMEOUT_S, ByteCounter, timeout, world_of


def _log2(x: int, what: str) -> int:
    if x < 1 or x & (x - 1):
        msg = f"{what}={x}: WAGMA needs a power of two (use 2, 4, 8, ...)"
        raise ConfigError(msg)
    return x.bit_length() - 1


def butterfly_groups(world: int, group_size: int) -> list[list[list[int]]]:
    """Phases of rank groups: ``phases[s]`` is a partition of range(world) into groups of ``group_size``."""
    k, logp = _log2(group_size, "group_size"), _log2(world, "world size")
    if group_size > world or (k and logp % k):
        msg = (
            f"group_size={group_size} with {world} ranks: log2(group_size) must divide log2(world) "
            f"(e.g. group_size 2 or {world})"
        )
        raise ConfigError(msg)
    n_phases = logp // k if k else 1
    phases = []
    for s in range(n_phases):
        bits = ((1 << k) - 1) << (s * k)  # the rank bits this phase varies
        groups: dict[int, list[int]] = {}
        for r in range(world):
            groups.setdefault(r & ~bits, []).append(r)
        phases.append(sorted(groups.values()))
    return phases


class GroupAverager:
    """Averages a list of tensors (parameters) in the rotating butterfly groups; creates all groups
    at construction (every rank must construct it, in the same order)."""

    def __init__(self, group_size: int = 2, global_every: int = 10, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.rank, self.world = world_of(None)
        self.group_size = min(group_size, self.world)
        self.global_every = global_every
        if global_every < 1:
            msg = f"global_every={global_every}: use >= 1 (1 = a global average every step)"
            raise ConfigError(msg)
        self.phases = butterfly_groups(self.world, self.group_size)
        self.groups: list[dist.ProcessGroup | None] = []
        if self.world > 1:
            for phase in self.phases:
                mine, _ = dist.new_subgroups_by_enumeration(phase, timeout=timeout(timeout_s))
                self.groups.append(mine)
        self.step_count = 0
        self.counter = ByteCounter()

    def step(self, tensors: list[torch.Tensor]) -> str:
        """One averaging round on ``tensors`` (in place); returns "global" or "group"."""
        t = self.step_count
        self.step_count += 1
        if self.world == 1:
            return "global"
        flat = torch.cat([x.detach().reshape(-1).float() for x in tensors])  # (N,)
        is_global = (t + 1) % self.global_every == 0
        if is_global:
            dist.all_reduce(flat)
            flat /= self.world
            self.counter.allreduce(flat.numel() * 4, self.world)
        else:
            dist.all_reduce(flat, group=self.groups[t % len(self.groups)])
            flat /= self.group_size
            self.counter.allreduce(flat.numel() * 4, self.group_size)
        self.counter.calls += 1
        off = 0
        with torch.no_grad():
            for x in tensors:
                x.copy_(flat[off : off + x.numel()].view_as(x).to(x.dtype))
                off += x.numel()
        return "global" if is_global else "group"


class WAGMA(L.Callback):
    """Group model averaging after every optimizer step (needs ``CommDDPStrategy(comm="noop")``).

    Args:
        group_size: ranks per averaging group S (power of two; log2 S divides log2 P).
        global_every: steps between synchronous global averages (tau + 1 in the paper).
        average_buffers: also average the BatchNorm running statistics (other buffers, such as the
            normalisation statistics, are constants and are left alone).
        timeout_s: timeout of the group collectives (seconds).
    """

    def __init__(
        self,
        group_size: int = 2,
        global_every: int = 10,
        average_buffers: bool = True,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.group_size, self.global_every = group_size, global_every
        self.average_buffers, self.timeout_s = average_buffers, timeout_s
        self.averager: GroupAverager | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        require_noop(trainer, "WAGMA")
        self.averager = GroupAverager(self.group_size, self.global_every, self.timeout_s)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.averager is None:
            return
        tensors = [p.data for p in pl_module.parameters()]
        if self.average_buffers:
            tensors += [
                b
                for m in pl_module.modules()
                if isinstance(m, nn.modules.batchnorm._BatchNorm)
                for b in m.buffers()
                if b.is_floating_point()
            ]
        self.averager.step(tensors)

    @property
    def counter(self) -> ByteCounter | None:
        return self.averager.counter if self.averager is not None else None


def require_noop(trainer: L.Trainer, plugin: str) -> None:
    """Plugins that communicate themselves need DDP's gradient all-reduce switched off."""
    if trainer.world_size == 1:
        return
    if getattr(trainer.strategy, "comm", None) != "noop":
        msg = (
            f"{plugin} communicates itself, but the strategy is {type(trainer.strategy).__name__}"
            f"(comm={getattr(trainer.strategy, 'comm', 'allreduce')!r}); use trainer.strategy: "
            "{class_path: postcast.models.plugins.CommDDPStrategy, init_args: {comm: noop}} "
            "(configs/plugins/*.yaml do)"
        )
        raise ConfigError(msg)
