"""The cache tiers (RAM: preallocated tensors; local disk: memory-mapped files) and the per-epoch
statistics of what the consumer saw (:class:`EpochStats`)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

Sample = dict[str, torch.Tensor]
TIERS = ("ram", "disk")


class _Tier:
    """``capacity`` fixed-shape sample slots: preallocated tensors (RAM) or memory-mapped files
    (local disk, one ``<key>.bin`` per field under ``directory``). Allocated on the first put."""

    def __init__(self, capacity: int, directory: Path | None = None):
        self.capacity, self.directory = capacity, directory
        self._arrays: dict[str, torch.Tensor | np.memmap[Any, Any]] = {}
        self._lock = threading.Lock()

    def _allocate(self, sample: Sample) -> None:
        with self._lock:
            if self._arrays:
                return
            arrays: dict[str, torch.Tensor | np.memmap[Any, Any]] = {}
            for k, t in sample.items():
                shape = (self.capacity, *t.shape)  # (slots, *sample shape)
                if self.directory is None:
                    arrays[k] = torch.empty(shape, dtype=t.dtype)
                else:
                    self.directory.mkdir(parents=True, exist_ok=True)
                    dtype = t.numpy().dtype
                    arrays[k] = np.memmap(self.directory / f"{k}.bin", dtype=dtype, mode="w+", shape=shape)
            self._arrays = arrays  # published whole: other threads never see a partial dict

    def put(self, slot: int, sample: Sample) -> None:
        if not self._arrays:
            self._allocate(sample)
        for k, t in sample.items():
            arr = self._arrays[k]
            if isinstance(arr, torch.Tensor):
                arr[slot].copy_(t)
            else:
                arr[slot] = t.numpy()

    def release(self) -> None:
        """Drop the slots (the memory goes back when no served sample still views them)."""
        with self._lock:
            self._arrays = {}

    def get(self, slot: int) -> Sample:
        out: Sample = {}
        for k, arr in self._arrays.items():
            out[k] = arr[slot] if isinstance(arr, torch.Tensor) else torch.from_numpy(np.array(arr[slot]))
        return out


@dataclass
class EpochStats:
    """What one epoch of the consumer saw (``hits`` by source: ram, disk, staging)."""

    epoch: int
    accesses: int = 0
    hits: dict[str, int] = field(default_factory=lambda: {"ram": 0, "disk": 0, "staging": 0})
    consumer_reads: int = 0  # backing reads done by the consumer itself (prefetch was late or off plan)
    off_plan: int = 0  # accesses that did not match the replayed stream
    backing_reads: int = 0  # all backing-store reads during the epoch (prefetch threads + consumer)
    stall_s: float = 0.0  # time __getitem__ waited for data

    def summary(self, sample_bytes: int) -> dict[str, float]:
        n = max(self.accesses, 1)
        out = {f"hit_rate_{k}": v / n for k, v in self.hits.items()}
        out.update(
            accesses=self.accesses,
            backing_reads=self.backing_reads,
            stall_s=self.stall_s,
            backing_MB=self.backing_reads * sample_bytes / 1e6,
            consumer_reads=self.consumer_reads,
            off_plan=self.off_plan,
        )
        return out
