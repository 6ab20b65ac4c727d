"""Clairvoyant prefetching (NoPFS, Dryden et al., SC21) for postcast's map-style datasets.

The training shuffle is a pure function of (seed, epoch, rank, world size, dataset length,
drop_last): ``torch.utils.data.DistributedSampler`` permutes with a generator seeded ``seed + epoch``,
pads by wrapping around (or truncates with ``drop_last``) and takes the stride ``[rank::world]``;
Lightning injects exactly that sampler (seed ``PL_GLOBAL_SEED``, else 0) in distributed runs.
So every future access of this rank is known before training starts, and the loader can:

1. replay the access stream (:func:`access_stream`, equal to the sampler's, padding included);
2. plan a static tiered cache under a byte budget (:func:`plan_cache`): count each sample's
   accesses over the planned epochs, drop zeros, sort by count (descending) then first access,
   fill the RAM tier, then the optional local-disk tier; the rest is never cached. No eviction;
3. prefetch in the background (:class:`ClairvoyantDataset`): threads fill tier slots in order of
   first access and stage uncached samples a bounded window ahead of the consumer, each read
   exactly once, so backing-store reads = accesses - predicted hits;
4. report per epoch (:class:`PrefetchStats`, a Lightning Callback): hit rate per tier, stall
   seconds (time the consumer waited for data), backing-store reads and bytes;
5. serve one fixed batch forever (:class:`FixedBatchLoader`) to tell whether training is
   loader-bound.

The dataset wrapper serves from the main process: use it with ``num_workers=0`` (its threads do the
parallel reading that worker processes would otherwise do). Samples served from the RAM tier are
views into the cache: read-only (``default_collate`` copies them into the batch).
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
import zarr
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from zarr.abc.store import ByteRequest, Store
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.core.sync import sync
from zarr.storage import WrapperStore

Sample = dict[str, torch.Tensor]
TIERS = ("ram", "disk")


# ---------------------------------------------------------------- 1. the access stream


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
    return order[spec.rank:total:spec.world]


# ---------------------------------------------------------------- 2. the cache plan


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
        return {"spec": asdict(self.spec), "start_epoch": self.start_epoch, "epochs": self.epochs,
                "sample_bytes": self.sample_bytes, "capacity": list(self.capacity),
                "slots": {str(i): list(s) for i, s in self.slots.items()}, "fill_order": list(self.fill_order),
                "predicted_hits": self.predicted_hits(), "accesses": self.accesses()}


def _count(spec: StreamSpec, start_epoch: int, epochs: int) -> tuple[dict[int, int], dict[int, int]]:
    counts: dict[int, int] = {}
    first: dict[int, int] = {}
    for e in range(epochs):
        for p, i in enumerate(access_stream(spec, start_epoch + e)):
            counts[i] = counts.get(i, 0) + 1
            first.setdefault(i, e * spec.per_epoch + p)
    return counts, first


def plan_cache(spec: StreamSpec, *, sample_bytes: int, ram_bytes: int, disk_bytes: int = 0,
               epochs: int = 1, start_epoch: int = 0) -> CachePlan:
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
        chosen = sorted(hot[start:start + cap], key=first.__getitem__)  # fill order within the tier
        slots.update({i: (tier, s) for s, i in enumerate(chosen)})
        start += len(chosen)
    used = (sum(t == 0 for t, _ in slots.values()), sum(t == 1 for t, _ in slots.values()))
    return CachePlan(spec=spec, start_epoch=start_epoch, epochs=epochs, sample_bytes=sample_bytes,
                     capacity=used, slots=slots, counts=counts, first=first,
                     fill_order=tuple(sorted(slots, key=first.__getitem__)))


# ---------------------------------------------------------------- tiers


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

    def get(self, slot: int) -> Sample:
        out: Sample = {}
        for k, arr in self._arrays.items():
            out[k] = arr[slot] if isinstance(arr, torch.Tensor) else torch.from_numpy(np.array(arr[slot]))
        return out


# ---------------------------------------------------------------- 3. the prefetching dataset


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
        out.update(accesses=self.accesses, backing_reads=self.backing_reads, stall_s=self.stall_s,
                   backing_MB=self.backing_reads * sample_bytes / 1e6, consumer_reads=self.consumer_reads,
                   off_plan=self.off_plan)
        return out


class _Entry:
    __slots__ = ("ready", "sample")

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.sample: Sample | None = None  # staging only; tier entries live in the tier


class ClairvoyantDataset(Dataset[Sample]):
    """``base`` (any map-style dataset of dict samples) behind a planned tiered cache, a staging
    window of ``lookahead`` samples and ``threads`` prefetch threads.

    ``begin_epoch(epoch, indices)`` (called by :class:`ReplaySampler`) tells it where the consumer
    is; ``__getitem__`` serves from RAM/disk/staging when it can and reads ``base`` otherwise. Every
    sample read from ``base`` is counted in ``backing_reads``.
    """

    def __init__(self, base: Dataset[Sample], plan: CachePlan, *, threads: int = 4, lookahead: int = 16,
                 disk_dir: str | os.PathLike[str] | None = None):
        if plan.capacity[1] and disk_dir is None:
            msg = "the plan has a disk tier: pass disk_dir (a local directory)"
            raise ValueError(msg)
        self.base, self.plan, self.lookahead = base, plan, max(lookahead, 0)
        self.tiers = (_Tier(plan.capacity[0]), _Tier(plan.capacity[1], Path(disk_dir) if disk_dir else None))
        self._cv = threading.Condition()
        self._filled: dict[int, _Entry] = {}  # cached index -> entry (claimed when present)
        self._staged: dict[int, _Entry] = {}  # global position -> entry
        self._fill_next = 0  # position in plan.fill_order
        self._stage_next = 0  # next global position to stage
        self._consumer = 0  # global position of the consumer's next access
        self._epoch: int | None = None
        self._on_plan = True
        self._stream: list[int] = []
        self._streams: dict[int, list[int]] = {}  # planned epoch offset -> stream (memoised)
        self._stop = False
        self.backing_reads = 0
        self.stats: list[EpochStats] = []
        self._threads = [threading.Thread(target=self._work, name=f"prefetch-{k}", daemon=True)
                         for k in range(max(threads, 0))]
        self._started = False

    # -- public

    def __len__(self) -> int:
        return len(self.base)  # type: ignore[arg-type]

    @property
    def horizon(self) -> int:
        """Global positions covered by the plan."""
        return self.plan.epochs * self.plan.spec.per_epoch

    def start(self) -> None:
        """Start the prefetch threads (idempotent; ``begin_epoch`` calls it)."""
        with self._cv:
            if self._started:
                return
            self._started = True
        for t in self._threads:
            t.start()

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        for t in self._threads:
            if t.is_alive():
                t.join(timeout=10)

    def begin_epoch(self, epoch: int, indices: Sequence[int]) -> None:
        """The consumer starts ``epoch`` and will access ``indices`` in order."""
        offset = epoch - self.plan.start_epoch
        planned = 0 <= offset < self.plan.epochs
        with self._cv:
            self._epoch = epoch
            self._stream = list(indices)
            self._on_plan = planned and self._stream == access_stream(self.plan.spec, epoch)
            self._consumer = offset * self.plan.spec.per_epoch if self._on_plan else self.horizon
            self._staged = {g: e for g, e in self._staged.items() if g >= self._consumer}  # drop stale
            self.stats.append(EpochStats(epoch))
            self._cv.notify_all()
        self.start()

    def end_epoch(self) -> EpochStats | None:
        return self.stats[-1] if self.stats else None

    def __getitem__(self, i: int) -> Sample:
        t0 = time.perf_counter()
        with self._cv:
            if not self.stats:  # used without begin_epoch: plain reads, still counted
                self.stats.append(EpochStats(-1))
                self._on_plan = False
            st = self.stats[-1]
            st.accesses += 1
            pos = self._consumer
            on_plan = self._on_plan and pos < self.horizon and self._expected(pos) == i
            if self._on_plan:
                self._consumer += 1
                self._cv.notify_all()
            st.off_plan += int(not on_plan)
            entry, source, own = self._claim_for_consumer(i, pos, on_plan)
        if own:  # nobody fetched it yet: read it here
            sample = self._read(i)
            self._store(i, pos, entry, sample, source)
            with self._cv:
                st.consumer_reads += 1
                if source == "staging":
                    self._staged.pop(pos, None)
                st.stall_s += time.perf_counter() - t0
            return sample
        assert entry is not None
        waited = not entry.ready.is_set()
        entry.ready.wait()
        sample = self._serve(i, pos, entry, source)
        with self._cv:
            st.hits[source] += 1
            if waited:
                st.stall_s += time.perf_counter() - t0
        return sample

    # -- internals (the lock is held where the name says so)

    def _expected(self, g: int) -> int:
        per = self.plan.spec.per_epoch
        e, p = divmod(g, per)
        if e not in self._streams:
            done = self._consumer // per
            self._streams = {k: v for k, v in self._streams.items() if k >= done}  # forget past epochs
            self._streams[e] = access_stream(self.plan.spec, self.plan.start_epoch + e)
        return self._streams[e][p]

    def _claim_for_consumer(self, i: int, pos: int, on_plan: bool) -> tuple[_Entry | None, str, bool]:
        """(entry, source, whether the consumer must read it itself); lock held."""
        if i in self.plan.slots:
            source = TIERS[self.plan.slots[i][0]]
            if i in self._filled:
                return self._filled[i], source, False
            entry = self._filled[i] = _Entry()
            return entry, source, True
        if on_plan:
            if pos in self._staged:
                return self._staged[pos], "staging", False
            entry = self._staged[pos] = _Entry()
            return entry, "staging", True
        return None, "off_plan", True

    def _read(self, i: int) -> Sample:
        sample = self.base[i]
        with self._cv:
            self.backing_reads += 1
            if self.stats:
                self.stats[-1].backing_reads += 1
        return sample

    def _store(self, i: int, pos: int, entry: _Entry | None, sample: Sample, source: str) -> None:
        if entry is None:
            return
        if source in TIERS:
            tier, slot = self.plan.slots[i]
            self.tiers[tier].put(slot, sample)
        else:
            entry.sample = sample
        entry.ready.set()

    def _serve(self, i: int, pos: int, entry: _Entry, source: str) -> Sample:
        if source in TIERS:
            tier, slot = self.plan.slots[i]
            return self.tiers[tier].get(slot)
        with self._cv:
            self._staged.pop(pos, None)
        assert entry.sample is not None
        return entry.sample

    def _next_job(self) -> tuple[int, int, _Entry, str] | None:
        """The next read in order of need: a tier fill or a staging read within the window; lock
        held; blocks until there is one; None when stopping."""
        while not self._stop:
            while self._fill_next < len(self.plan.fill_order) and self.plan.fill_order[self._fill_next] in self._filled:
                self._fill_next += 1
            fill = self.plan.fill_order[self._fill_next] if self._fill_next < len(self.plan.fill_order) else None
            self._stage_next = max(self._stage_next, self._consumer)
            g = self._stage_next
            stage_ok = self._on_plan and g < min(self.horizon, self._consumer + self.lookahead)
            while stage_ok and (self._expected(g) in self.plan.slots or g in self._staged):
                g += 1
                stage_ok = g < min(self.horizon, self._consumer + self.lookahead)
            self._stage_next = g
            if fill is not None and (not stage_ok or self.plan.first[fill] <= g):
                entry = self._filled[fill] = _Entry()
                return fill, -1, entry, TIERS[self.plan.slots[fill][0]]
            if stage_ok:
                entry = self._staged[g] = _Entry()
                self._stage_next = g + 1
                return self._expected(g), g, entry, "staging"
            self._cv.wait()
        return None

    def _work(self) -> None:
        while True:
            with self._cv:
                job = self._next_job()
            if job is None:
                return
            i, pos, entry, source = job
            self._store(i, pos, entry, self._read(i), source)


class ReplaySampler(DistributedSampler[int]):
    """The real ``DistributedSampler`` (so Lightning keeps it and calls ``set_epoch``), which also
    tells the clairvoyant dataset which epoch starts and what it will yield."""

    def __init__(self, dataset: ClairvoyantDataset, spec: StreamSpec):
        super().__init__(dataset, num_replicas=spec.world, rank=spec.rank, shuffle=spec.shuffle,
                         seed=spec.seed, drop_last=spec.drop_last)
        self.clairvoyant = dataset

    def __iter__(self) -> Iterator[int]:
        indices = list(super().__iter__())
        self.clairvoyant.begin_epoch(self.epoch, indices)
        return iter(indices)


def sample_nbytes(sample: Sample) -> int:
    return sum(t.numel() * t.element_size() for t in sample.values())


def clairvoyant_loader(base: Dataset[Sample], spec: StreamSpec, *, batch_size: int, sample_bytes: int,
                       ram_bytes: int, disk_bytes: int = 0, disk_dir: str | os.PathLike[str] | None = None,
                       epochs: int = 1, start_epoch: int = 0, threads: int = 4,
                       lookahead: int = 16) -> DataLoader[Sample]:
    """A DataLoader over ``base`` that yields what ``DataLoader(base, batch_size,
    sampler=DistributedSampler(base, ...spec))`` yields, from a planned cache."""
    plan = plan_cache(spec, sample_bytes=sample_bytes, ram_bytes=ram_bytes, disk_bytes=disk_bytes,
                      epochs=epochs, start_epoch=start_epoch)
    data = ClairvoyantDataset(base, plan, threads=threads, lookahead=lookahead, disk_dir=disk_dir)
    return DataLoader(data, batch_size=batch_size, sampler=ReplaySampler(data, spec), num_workers=0)


# ---------------------------------------------------------------- 4. the Callback


class PrefetchStats(L.Callback):
    """Logs, after each training epoch, the clairvoyant loader's hit rate per tier, stall seconds,
    backing-store reads and bytes (``loader/<name>``); ``history`` keeps one dict per epoch."""

    def __init__(self) -> None:
        self.history: list[dict[str, float]] = []

    @staticmethod
    def find(trainer: L.Trainer) -> ClairvoyantDataset | None:
        loader = trainer.train_dataloader
        data = getattr(loader, "dataset", None)
        return data if isinstance(data, ClairvoyantDataset) else None

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        data = self.find(trainer)
        st = data.end_epoch() if data is not None else None
        if data is None or st is None:
            return
        summary = st.summary(data.plan.sample_bytes)
        self.history.append({"epoch": float(st.epoch), **summary})
        pl_module.log_dict({f"loader/{k}": float(v) for k, v in summary.items()}, on_epoch=True)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        data = self.find(trainer)
        if data is not None:
            data.close()


# ---------------------------------------------------------------- 5. fixed batch


class FixedBatchLoader:
    """Yields the first batch of ``loader`` ``len(loader)`` times per epoch: training speed with a
    free loader. If it is much faster than the real loader, training is loader-bound."""

    def __init__(self, loader: DataLoader[Sample]):
        self.loader = loader
        self._batch: Any = None

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        if self._batch is None:
            self._batch = next(iter(self.loader))
        for _ in range(len(self)):
            yield self._batch


# ---------------------------------------------------------------- zarr reads


def read_rows(arrays: Mapping[str, zarr.Array[Any]], row: int) -> dict[str, np.ndarray]:
    """Index ``row`` along the first axis of every array, all fetched and decoded concurrently in
    one zarr call (one round trip to zarr's event loop instead of one per array: on a filesystem
    with per-read latency, the latencies overlap)."""
    names = list(arrays)

    async def fetch() -> list[Any]:
        return await asyncio.gather(*(arrays[n].async_array.getitem(row) for n in names))

    return {n: np.asarray(v) for n, v in zip(names, sync(fetch()), strict=True)}


# ---------------------------------------------------------------- zarr store wrappers (measurement)


class CountingStore(WrapperStore[Store]):
    """A zarr store that counts ``get`` calls and bytes per key (to measure backing-store reads)."""

    def __init__(self, store: Store):
        super().__init__(store)
        self.gets: dict[str, int] = {}
        self.bytes_read = 0
        self._lock = threading.Lock()

    def _with_store(self, store: Store) -> CountingStore:
        return type(self)(store)

    async def get(self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None) -> Buffer | None:
        buf = await self._store.get(key, prototype, byte_range)
        with self._lock:
            self.gets[key] = self.gets.get(key, 0) + 1
            self.bytes_read += len(buf) if buf is not None else 0
        return buf

