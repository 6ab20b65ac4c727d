"""3. The prefetching dataset (:class:`ClairvoyantDataset`), the loader built on it
(:func:`clairvoyant_loader`) and 5. the fixed-batch loader (:class:`FixedBatchLoader`).

Threads fill tier slots in order of first access and stage uncached samples a bounded window
ahead of the consumer, each read exactly once, so backing-store reads = accesses - predicted hits.
A read that fails in a thread (a damaged chunk) stops the threads and is raised by the consumer's
next ``__getitem__``, or the one waiting for that sample: the error reaches the training loop at once.

The dataset wrapper serves from the main process: use it with ``num_workers=0`` (its threads do the
parallel reading that worker processes would otherwise do). Samples served from the RAM tier are
views into the cache: read-only (``default_collate`` copies them into the batch).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader, Dataset

from postcast.datasets.loaders.prefetch.plan import CachePlan, plan_cache
from postcast.datasets.loaders.prefetch.stream import ReplaySampler, StreamSpec, access_stream
from postcast.datasets.loaders.prefetch.tiers import TIERS, EpochStats, Sample, _Tier

# Samples a prefetch thread claims and reads at once when the base dataset has ``read_many(indices)`` (an
# iterator of the samples in order, e.g. StoreDataset's: their chunks fetched in one round trip, their
# latencies overlapping): on a 2 ms-per-read store, 8 per thread keep ~270 chunk reads in flight.
READ_BATCH = 8


class _Entry:
    __slots__ = ("error", "ready", "sample")

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.sample: Sample | None = None  # staging only; tier entries live in the tier
        self.error: BaseException | None = None  # the prefetch thread's read failed: the consumer raises it


class ClairvoyantDataset(Dataset[Sample]):
    """``base`` (any map-style dataset of dict samples) behind a planned tiered cache, a staging
    window of ``lookahead`` samples and ``threads`` prefetch threads, each claiming the next ``read_batch``
    reads in order of need and reading them with ``base.read_many`` when the base has one (else one by one).

    ``begin_epoch(epoch, indices)`` (called by :class:`ReplaySampler`) tells it where the consumer
    is; ``__getitem__`` serves from RAM/disk/staging when it can and reads ``base`` otherwise. Every
    sample read from ``base`` is counted in ``backing_reads``.
    """

    def __init__(
        self,
        base: Dataset[Sample],
        plan: CachePlan,
        *,
        threads: int = 4,
        lookahead: int = 16,
        disk_dir: str | os.PathLike[str] | None = None,
        read_batch: int = READ_BATCH,
    ):
        if plan.capacity[1] and disk_dir is None:
            msg = "the plan has a disk tier: pass disk_dir (a local directory)"
            raise ValueError(msg)
        self.base, self.plan, self.lookahead = base, plan, max(lookahead, 0)
        self.read_batch = max(read_batch, 1)
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
        self._error: BaseException | None = None  # the first failed read of a prefetch thread
        self.backing_reads = 0
        self.stats: list[EpochStats] = []
        self._threads = [
            threading.Thread(target=self._work, name=f"prefetch-{k}", daemon=True) for k in range(max(threads, 0))
        ]
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
        for tier in self.tiers:
            tier.release()

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
            if self._error is not None:
                raise self._error
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
            try:
                sample = self._read(i)
            except BaseException as err:  # the claimed entry gets the error: a later access raises, never waits
                if entry is not None:
                    self._fail(entry, err)
                raise
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
        if entry.error is not None:
            raise entry.error
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
        self._count_read()
        return sample

    def _count_read(self) -> None:
        with self._cv:
            self.backing_reads += 1
            if self.stats:
                self.stats[-1].backing_reads += 1

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

    def _pick(self) -> tuple[int, int, _Entry, str] | None:
        """The next read in order of need, claimed: a tier fill or a staging read within the window; lock
        held; None when there is none now."""
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
        return None

    def _next_jobs(self) -> list[tuple[int, int, _Entry, str]]:
        """Up to ``read_batch`` next reads, claimed (blocks until there is one; empty when stopping); lock held."""
        while not self._stop:
            job = self._pick()
            if job is None:
                self._cv.wait()
                continue
            jobs = [job]
            while len(jobs) < self.read_batch and (job := self._pick()) is not None:
                jobs.append(job)
            return jobs
        return []

    def _work(self) -> None:
        read_many = getattr(self.base, "read_many", None)
        while True:
            with self._cv:
                jobs = self._next_jobs()
            if not jobs:
                return
            done = 0
            try:
                if read_many is None or len(jobs) == 1:
                    samples: Iterator[Sample] = (self.base[i] for i, *_ in jobs)
                else:  # the chunks of every job fetched at once; each sample handed on as soon as it is built
                    samples = read_many([i for i, *_ in jobs])
                for (i, pos, entry, source), sample in zip(jobs, samples, strict=True):
                    self._count_read()
                    self._store(i, pos, entry, sample, source)
                    done += 1
            except BaseException as err:  # handed to the consumer: a thread dying silently left it waiting
                for _, _, entry, _ in jobs[done:]:
                    self._fail(entry, err)
                return

    def _fail(self, entry: _Entry, err: BaseException) -> None:
        """Stop prefetching; the consumer raises ``err`` (waiting for ``entry`` or at its next access)."""
        with self._cv:
            self._error = self._error or err
            self._stop = True
            self._cv.notify_all()
        entry.error = err
        entry.ready.set()


def sample_nbytes(sample: Sample) -> int:
    return sum(t.numel() * t.element_size() for t in sample.values())


def clairvoyant_loader(
    base: Dataset[Sample],
    spec: StreamSpec,
    *,
    batch_size: int,
    sample_bytes: int,
    ram_bytes: int,
    disk_bytes: int = 0,
    disk_dir: str | os.PathLike[str] | None = None,
    epochs: int = 1,
    start_epoch: int = 0,
    threads: int = 4,
    lookahead: int = 16,
    read_batch: int = READ_BATCH,
) -> DataLoader[Sample]:
    """A DataLoader over ``base`` that yields what ``DataLoader(base, batch_size,
    sampler=DistributedSampler(base, ...spec))`` yields, from a planned cache."""
    plan = plan_cache(
        spec,
        sample_bytes=sample_bytes,
        ram_bytes=ram_bytes,
        disk_bytes=disk_bytes,
        epochs=epochs,
        start_epoch=start_epoch,
    )
    data = ClairvoyantDataset(
        base, plan, threads=threads, lookahead=lookahead, disk_dir=disk_dir, read_batch=read_batch
    )
    return DataLoader(data, batch_size=batch_size, sampler=ReplaySampler(data, spec, data.begin_epoch), num_workers=0)


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
