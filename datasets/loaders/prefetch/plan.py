"""2. The cache plan: a static placement of a rank's samples into tiers under byte budgets.

:func:`plan_cache` counts each sample's accesses over the planned epochs, drops zeros, sorts by
count (descending) then first access, fills the RAM tier, then the optional local-disk tier; the
rest is never cached. No eviction. The plan is plain data (:meth:`CachePlan.to_dict`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from postcast.datasets.loaders.prefetch.stream import StreamSpec, access_stream


@dataclass(frozen=True)
class CachePlan:
    """A static placement of samples into tiers (plain data: ``to_dict`` is JSON-serialisable).

    ``slots[i] = (tier, slot)`` for every cached index; ``counts[i]`` its accesses and ``first[i]``
    its first access (global position ``epoch_offset * per_epoch + position``) over ``epochs``
    epochs from ``start_epoch``; ``fill_order`` the cached indices by first access.
    """

    spec: StreamSpec
    start_epoch: int
    epochs: int
    sample_bytes: int
    capacity: tuple[int, int]  # slots in (ram, disk)
    slots: dict[int, tuple[int, int]]
    counts: dict[int, int]
    first: dict[int, int]
    fill_order: tuple[int, ...]

    def predicted_hits(self, epochs: int | None = None) -> int:
        """Accesses of the first ``epochs`` planned epochs that need no backing-store read: every
        access of a cached sample except the one that fills its slot."""
        counts = self.counts if epochs is None else _count(self.spec, self.start_epoch, epochs)[0]
        return sum(counts.get(i, 0) - 1 for i in self.slots if counts.get(i, 0) > 0)

    def accesses(self, epochs: int | None = None) -> int:
        return self.spec.per_epoch * (self.epochs if epochs is None else epochs)

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": asdict(self.spec),
            "start_epoch": self.start_epoch,
            "epochs": self.epochs,
            "sample_bytes": self.sample_bytes,
            "capacity": list(self.capacity),
            "slots": {str(i): list(s) for i, s in self.slots.items()},
            "fill_order": list(self.fill_order),
            "predicted_hits": self.predicted_hits(),
            "accesses": self.accesses(),
        }


def _count(spec: StreamSpec, start_epoch: int, epochs: int) -> tuple[dict[int, int], dict[int, int]]:
    counts: dict[int, int] = {}
    first: dict[int, int] = {}
    for e in range(epochs):
        for p, i in enumerate(access_stream(spec, start_epoch + e)):
            counts[i] = counts.get(i, 0) + 1
            first.setdefault(i, e * spec.per_epoch + p)
    return counts, first


def plan_cache(
    spec: StreamSpec, *, sample_bytes: int, ram_bytes: int, disk_bytes: int = 0, epochs: int = 1, start_epoch: int = 0
) -> CachePlan:
    """Place this rank's samples into RAM, then disk, under the byte budgets: hottest first (most
    accesses over ``epochs`` epochs), ties by first access; each tier is filled by first access."""
    if sample_bytes <= 0 or epochs <= 0:
        msg = f"plan_cache: sample_bytes ({sample_bytes}) and epochs ({epochs}) must be positive"
        raise ValueError(msg)
    counts, first = _count(spec, start_epoch, epochs)
    hot = sorted(counts, key=lambda i: (-counts[i], first[i]))  # counts are > 0 by construction
    capacity = (max(ram_bytes, 0) // sample_bytes, max(disk_bytes, 0) // sample_bytes)
    slots: dict[int, tuple[int, int]] = {}
    start = 0
    for tier, cap in enumerate(capacity):
        chosen = sorted(hot[start : start + cap], key=first.__getitem__)  # fill order within the tier
        slots.update({i: (tier, s) for s, i in enumerate(chosen)})
        start += len(chosen)
    used = (sum(t == 0 for t, _ in slots.values()), sum(t == 1 for t, _ in slots.values()))
    return CachePlan(
        spec=spec,
        start_epoch=start_epoch,
        epochs=epochs,
        sample_bytes=sample_bytes,
        capacity=used,
        slots=slots,
        counts=counts,
        first=first,
        fill_order=tuple(sorted(slots, key=first.__getitem__)),
    )
