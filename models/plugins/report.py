"""``CommReport``: bytes each plugin communicated per step, averaged over ranks, written as JSON."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
import torch.distributed as dist

from postcast.datasets import io
from postcast.models.plugins.comm import ByteCounter, world_of


def counters(trainer: L.Trainer) -> dict[str, ByteCounter]:
    """Every byte counter of the run: the strategy's hook, plugin callbacks, communicating optimizers."""
    found: dict[str, ByteCounter] = {}
    sources: list[Any] = [trainer.strategy, *getattr(trainer, "callbacks", []), *trainer.optimizers]
    for src in sources:
        c = getattr(src, "counter", None)
        if isinstance(c, ByteCounter):
            found[type(src).__name__] = c
    return found


class CommReport(L.Callback):
    """At the end of ``fit``: modelled bytes sent per rank and optimizer step, per plugin and in total.

    Args:
        path: JSON file written by rank 0 (atomically); None only logs ``comm_bytes_per_step``.
    """

    def __init__(self, path: str | None = None) -> None:
        self.path = path
        self.summary: dict[str, Any] = {}

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        found = counters(trainer)
        names = sorted(found)
        vals = torch.tensor(
            [[found[n].bytes_sent, float(found[n].calls)] for n in names] or [[0.0, 0.0]], dtype=torch.float64
        )  # (n_sources, 2)
        _, world = world_of(None)
        if world > 1:
            dist.all_reduce(vals)
            vals /= world
        steps = max(1, trainer.global_step)
        per = {
            n: {"bytes_per_step": float(vals[i, 0]) / steps, "calls": float(vals[i, 1])} for i, n in enumerate(names)
        }
        self.summary = {
            "steps": trainer.global_step,
            "world_size": world,
            "sources": per,
            "bytes_per_step": sum(v["bytes_per_step"] for v in per.values()),
            "n_parameters": sum(p.numel() for p in pl_module.parameters()),
        }
        if self.path and trainer.global_rank == 0:
            io.write_json(self.path, self.summary)
