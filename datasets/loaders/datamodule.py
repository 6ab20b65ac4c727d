"""Training samples from a postcast store: a torch Dataset per init date and a LightningDataModule.

Samples are built by :class:`postcast.datasets.sample.Sampler` from the :class:`SampleSpec` in
``DataConfig.sample`` (fields, shapes and units are documented there) and handed to torch as
tensors; they are in physical units: the model normalises its inputs itself.

The split comes from the store's ``split`` coordinate; dates without truth at the spec's lead are
skipped. Works with numpy- or dask-backed stores and with several DataLoader workers (each worker
opens the store itself).

Bad data stop training with one error, whichever loader reads them: a variable the spec reads that the
store lacks is a MissingInputError when the dataset is built; a chunk missing or of another size than
ingest recorded is refused then too (:func:`postcast.datasets.reads.check_chunks`); a chunk that does
not decode is a BadInputError naming the variable and chunk when it is read, in this process, a
prefetch thread (handed to the consumer) or a worker process (:class:`WorkerBadInput`).
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import lightning as L
import numpy as np
import torch
import xarray as xr
import zarr
from torch.utils.data import DataLoader, Dataset, get_worker_info

from postcast.datasets import contract, io, reads, schema
from postcast.datasets.core.errors import BadInputError, ConfigError, MissingInputError, PostcastError
from postcast.datasets.loaders import prefetch
from postcast.datasets.sample import Sample, Sampler, SampleSpec

LOADERS = ("auto", "plain", "clairvoyant", "fixed")
PLAN_EPOCHS_MAX = 100  # the clairvoyant plan looks at most this many epochs ahead
STAGING_SAMPLES = 16  # the clairvoyant read-ahead window (samples), within cache_bytes


@dataclass(frozen=True)
class DataConfig:
    """Where samples come from and how they are loaded. Only ``sample`` (what the model reads) is
    saved in checkpoints; the store path and the loader settings are not."""

    store: str
    sample: SampleSpec = field(default_factory=SampleSpec)
    batch_size: int = 1  # init dates per batch
    num_workers: int = 0
    # keep decoded samples in memory, within cache_bytes (the first ones read stay: a split read in order
    # every epoch hits on those, however large the store; see ByteBudget)
    cache: bool = False
    # training loader: "clairvoyant" replays the seeded shuffle, caches samples in RAM (then disk) under
    # the byte budgets and prefetches with threads (datasets/loaders/prefetch); "plain" is a DataLoader over
    # the store; "fixed" serves the first batch every step (is training loader-bound?); "auto" is
    # clairvoyant when num_workers == 0 (its threads replace worker processes, and the cache lives in
    # this process), else plain. Validation and test always use the plain loader (read in order).
    loader: str = "auto"
    cache_bytes: int = 2 * 2**30  # every sample cache of a process: clairvoyant read-ahead + RAM tier + cache (bytes)
    disk_cache_dir: str | None = None  # local-disk tier of the clairvoyant loader (e.g. node-local SSD)
    disk_cache_bytes: int = 0  # its budget (bytes; needs disk_cache_dir)
    prefetch_threads: int = 2  # clairvoyant loader's reader threads (decoding holds the GIL: ~free cores)

    def __post_init__(self) -> None:
        if isinstance(self.sample, dict):  # from a checkpoint or plain YAML
            object.__setattr__(self, "sample", SampleSpec.from_dict(self.sample))
        if self.loader not in LOADERS:
            msg = f"loader {self.loader!r}: use one of {list(LOADERS)}"
            raise ConfigError(msg)
        if self.batch_size < 1 or self.num_workers < 0:
            msg = (
                f"batch_size ({self.batch_size}) must be >= 1 and num_workers ({self.num_workers}) >= 0: "
                "set --data.cfg.batch_size / --data.cfg.num_workers"
            )
            raise ConfigError(msg)
        if min(self.cache_bytes, self.disk_cache_bytes, self.prefetch_threads) < 0:
            msg = (
                f"cache_bytes ({self.cache_bytes}), disk_cache_bytes ({self.disk_cache_bytes}) and "
                f"prefetch_threads ({self.prefetch_threads}) must be >= 0"
            )
            raise ConfigError(msg)
        if self.disk_cache_dir is None and self.disk_cache_bytes:
            msg = f"disk_cache_bytes={self.disk_cache_bytes} needs disk_cache_dir (a local directory)"
            raise ConfigError(msg)


class ByteBudget:
    """The bytes the sample caches of one process may hold together (``DataConfig.cache_bytes``): the
    clairvoyant loader's RAM tier takes its share when it is planned and gives it back when it closes;
    a cached split takes one sample's bytes as it keeps it, and keeps nothing more once the budget is
    spent. A DataLoader worker process gets its own copy (each worker holds at most the budget)."""

    def __init__(self, total: int) -> None:
        self.total, self.used = total, 0
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, int]:
        return {"total": self.total, "used": self.used}

    def __setstate__(self, state: dict[str, int]) -> None:
        self.__init__(state["total"])  # type: ignore[misc]
        self.used = state["used"]

    def take(self, nbytes: int, unit: int | None = None) -> int:
        """Take ``nbytes`` (all or nothing), or with ``unit`` as many whole units of it as are left; the bytes taken."""
        with self._lock:
            left = self.total - self.used
            got = min(nbytes, left // unit * unit) if unit else (nbytes if nbytes <= left else 0)
            self.used += got
            return got

    def give(self, nbytes: int) -> None:
        with self._lock:
            self.used -= nbytes


def _worker_line(text: str) -> str:
    """The error's own line: torch re-raises a worker's exception as ``type("Caught X in DataLoader worker
    process N. Original Traceback ... X: <line>")``; the traceback stays in the worker's text, not the error."""
    if not text.startswith("Caught "):
        return text
    last = text.rstrip().rsplit("\n", 1)[-1]
    return last.partition(": ")[2] or last


class WorkerBadInput(BadInputError):
    """A BadInputError raised in a DataLoader worker process, re-raised in the training process as one line."""

    def __init__(self, text: str) -> None:
        super().__init__(_worker_line(text))


class WorkerMissingInput(MissingInputError):
    """A MissingInputError raised in a DataLoader worker process, re-raised in the training process as one line."""

    def __init__(self, text: str) -> None:
        super().__init__(_worker_line(text))


def _across_workers(err: BadInputError | MissingInputError) -> PostcastError:
    """``err`` as it must leave a worker process to reach the training loop as one line (unchanged outside one)."""
    if get_worker_info() is None:
        return err
    return WorkerMissingInput(str(err)) if isinstance(err, MissingInputError) else WorkerBadInput(str(err))


def to_tensors(sample: Sample) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(v) for k, v in sample.items()}


@functools.lru_cache(maxsize=4)
def _open(store_path: str) -> tuple[xr.Dataset, xr.Dataset | None]:
    """The store (checked by the store contract) and its statistics group (None when it has none)."""
    return contract.open_store(store_path), contract.open_statistics(store_path)


def check_variables(store: xr.Dataset, spec: SampleSpec, store_path: str) -> None:
    """MissingInputError naming the variables ``spec`` reads that the store lacks, and the fix."""
    missing = [n for n in spec.store_variables() if n not in store]
    if missing:
        names = ", ".join(missing)
        msg = (
            f"{store_path} has no {names}, which target {spec.target} with inputs {list(spec.input_variables)} "
            "reads: ingest a store that holds them, or set data.cfg.sample.variables to inputs the store has"
        )
        raise MissingInputError(msg, missing=missing)


@dataclass(frozen=True)
class _Reading:
    """What :class:`StoreDataset` reads samples with, opened once per process."""

    reader: prefetch.RowReader  # the sample's arrays
    dims: dict[str, tuple[str, ...]]  # per array, the dimensions of one date
    coords: xr.Coordinates  # the dimension coordinates but init_time (indexes built once)
    init_time: np.ndarray  # the store's init dates


class StoreDataset(Dataset[dict[str, torch.Tensor]]):
    """Samples of one split of a store (see :mod:`postcast.datasets.sample` for fields and shapes)."""

    def __init__(
        self,
        cfg: DataConfig,
        split: str,
        *,
        source: Any = None,
        store: xr.Dataset | None = None,
        budget: ByteBudget | None = None,
    ):
        """``source``: a zarr store (object) holding the same data as ``cfg.store`` to read samples
        through, e.g. a wrapper that counts reads or adds latency; default: ``cfg.store`` itself.
        ``store``: ``cfg.store`` already opened (:func:`postcast.datasets.contract.open_store`) by the caller,
        who reads it too (evaluate); default: opened here (once per process). ``budget``: the bytes the
        sample cache (``cfg.cache``) may take, shared with the process's other caches; default: its own
        ``cfg.cache_bytes``."""
        self.cfg, self.split, self.spec = cfg, split, cfg.sample
        self._source = io.open_zarr(source) if source is not None else None
        self._source_store = source
        self._store = store
        self._reading: _Reading | None = None  # the arrays and coordinates samples are read with, published whole
        self._open_lock = threading.Lock()
        ds = self._opened()
        self.indices = contract.split_rows(ds, split, target=self.spec.resolved_target, step_h=self.spec.step_h)
        if self.indices.size == 0:
            msg = f"{cfg.store}: no init date with truth in split {split!r} for {self.spec.target}"
            raise MissingInputError(msg)
        oracle = all(n in ds for n in contract.oracle_parameters(self.spec.resolved_target).values())  # synthetic
        check_variables(ds, self.spec, cfg.store)
        reads.check_chunks(cfg.store, self.spec.store_variables(oracle=oracle), self.indices.tolist())
        self.sampler = Sampler(self.spec, ds[schema.LAT].values, ds[schema.LON].values, oracle=oracle)
        self._cache: dict[int, dict[str, torch.Tensor]] = {}  # the first samples read, within the budget
        self.budget = budget if budget is not None else ByteBudget(cfg.cache_bytes)
        self._open_reading()  # here, once: not in the first read of each loader thread

    def __getstate__(self) -> dict[str, Any]:
        """What a DataLoader worker started by pickling gets: no lock, no opened arrays (it opens them)."""
        return {**self.__dict__, "_reading": None, "_open_lock": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._open_lock = threading.Lock()

    def _opened(self) -> xr.Dataset:
        """The store: the caller's, else opened once per process (:func:`_open`)."""
        return self._store if self._store is not None else _open(self.cfg.store)[0]

    def __len__(self) -> int:
        return int(self.indices.size)

    def sample_nbytes(self) -> int:
        """Bytes of one sample (all fields are float32 of fixed shape)."""
        return self.sampler.nbytes(self._opened().sizes[schema.MEMBER])

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        try:
            if not self.cfg.cache:
                return self._read(i)
            if i in self._cache:
                return self._cache[i]
            sample = self._read(i)
            if self.budget.take(prefetch.sample_nbytes(sample)):
                self._cache[i] = sample
            return sample
        except (BadInputError, MissingInputError) as err:
            raise _across_workers(err) from None

    def _open_reading(self) -> _Reading:
        """The arrays a sample reads (only those: not the whole group's metadata) and the coordinates of its
        dates, opened once per process under a lock and published whole: a thread reading while another
        opens them waits, and never sees arrays without their coordinates."""
        reading = self._reading
        if reading is not None:
            return reading
        with self._open_lock:
            if self._reading is None:
                ds = self._source if self._source is not None else self._opened()
                source = self._source_store if self._source_store is not None else self.cfg.store
                group = zarr.open_group(source, mode="r", use_consolidated=False)
                names = [n for n in self.spec.store_variables(oracle=self.sampler.oracle) if n in ds]
                arrays = {n: group[n] for n in names}
                assert all(isinstance(a, zarr.Array) for a in arrays.values())  # variables are arrays, not groups
                coords = {str(c): ds[c].values for c in ds.coords if ds[c].dims == (c,) and c != schema.INIT_TIME}
                self._reading = _Reading(
                    reader=prefetch.RowReader(arrays),  # type: ignore[arg-type]
                    dims={n: tuple(str(d) for d in ds[n].dims[1:]) for n in names},
                    coords=xr.Coordinates(coords),
                    init_time=ds[schema.INIT_TIME].values,
                )
            return self._reading

    def _read(self, i: int) -> dict[str, torch.Tensor]:
        """Sample ``i``: the variables it needs are read in one concurrent zarr call (the same values
        as ``Sampler.sample(ds.isel(init_time=row))``, several times faster than xarray's lazy reads)."""
        return next(self._read_rows([i]))

    def read_many(self, indices: Sequence[int]) -> Iterator[dict[str, torch.Tensor]]:
        """Samples ``indices`` in order (each equal to ``self[i]``): the chunks of all of them are fetched in
        one round trip (their reads overlap), each sample decoded and built when it is asked for. The
        clairvoyant loader's threads read the samples they know are next this way."""
        if self.cfg.cache:
            yield from (self[i] for i in indices)
            return
        try:
            yield from self._read_rows(indices)
        except (BadInputError, MissingInputError) as err:
            raise _across_workers(err) from None

    def _read_rows(self, indices: Sequence[int]) -> Iterator[dict[str, torch.Tensor]]:
        reading = self._open_reading()
        rows = [int(self.indices[i]) for i in indices]
        for row, values in zip(rows, reading.reader.read(rows), strict=True):
            day = xr.Dataset({n: (reading.dims[n], v) for n, v in values.items()}, coords=reading.coords).assign_coords(
                {schema.INIT_TIME: reading.init_time[row]}
            )
            yield to_tensors(self.sampler.sample(day))


class StoreDataModule(L.LightningDataModule):
    """LightningDataModule over a postcast store (train/val/test splits from the store)."""

    def __init__(self, cfg: DataConfig):
        super().__init__()
        self.cfg = cfg
        self.clairvoyant: prefetch.ClairvoyantDataset | None = None  # the training loader's, when used
        self.budget = ByteBudget(cfg.cache_bytes)  # every sample cache of this process, together
        self._tier_bytes = 0  # what the clairvoyant RAM tier took of it
        self._staging_bytes = 0  # what its read-ahead window took

    @property
    def grid(self) -> tuple[int, int]:
        ds, _ = _open(self.cfg.store)
        return (ds.sizes[schema.LAT], ds.sizes[schema.LON])

    @property
    def grid_area(self) -> tuple[float, float, float, float] | None:
        """(south, north, west, east) of a regional store; None for a global one (recorded in checkpoints)."""
        ds, _ = _open(self.cfg.store)
        return schema.Grid.from_coords(ds[schema.LAT].values, ds[schema.LON].values, regional=True).area

    @property
    def n_members(self) -> int:
        ds, _ = _open(self.cfg.store)
        return int(ds.sizes[schema.MEMBER])

    def normalisation(self, per: str = "point") -> tuple[np.ndarray, np.ndarray]:
        """(mean, std), each (n_fields, H, W): the store's training statistics of the sample's fields, per grid
        point or per channel (:meth:`postcast.datasets.sample.SampleSpec.normalisation`; the model copies them at
        fit start and carries them in its checkpoint)."""
        stats = _open(self.cfg.store)[1]
        if stats is None:
            msg = (
                f"{self.cfg.store} has no statistics group (no init date in the training years): "
                "train on a store with one"
            )
            raise MissingInputError(msg)
        check_variables(_open(self.cfg.store)[0], self.cfg.sample, self.cfg.store)
        return self.cfg.sample.normalisation(stats, per)

    def climate_thresholds(self) -> tuple[float, ...]:
        """Default exceedance thresholds for the model's forecasts: the target's own (schema.TARGETS: tp24 1
        and 10 mm), else quantiles of the training truth (:func:`postcast.datasets.contract.truth_quantiles`)."""
        spec = self.cfg.sample
        own = spec.resolved_target.thresholds
        return own or contract.truth_quantiles(_open(self.cfg.store)[0], spec.resolved_target, spec.step_h)

    def _loader(self, split: str, shuffle: bool) -> DataLoader[dict[str, torch.Tensor]]:
        return DataLoader(
            StoreDataset(self.cfg, split, budget=self.budget),
            batch_size=self.cfg.batch_size,
            shuffle=shuffle,
            num_workers=self.cfg.num_workers,
            persistent_workers=self.cfg.num_workers > 0,
        )

    @property
    def train_loader_kind(self) -> str:
        """The training loader "auto" resolves to (see DataConfig.loader)."""
        if self.cfg.loader != "auto":
            return self.cfg.loader
        return "clairvoyant" if self.cfg.num_workers == 0 else "plain"

    def train_dataloader(self) -> Any:
        kind = self.train_loader_kind
        if kind == "fixed":
            return prefetch.FixedBatchLoader(self._loader("train", True))
        if kind == "plain":
            return self._loader("train", True)
        return self._clairvoyant_loader()

    def _clairvoyant_loader(self) -> DataLoader[dict[str, torch.Tensor]]:
        """The training split through the clairvoyant loader, planned for this rank and the epochs
        the trainer will run; the stream is what Lightning's DistributedSampler would yield."""
        trainer = self.trainer
        rank, world, start, stop = 0, 1, 0, 1
        if trainer is not None:
            rank, world, start = trainer.global_rank, trainer.world_size, trainer.current_epoch
            stop = trainer.max_epochs if trainer.max_epochs and trainer.max_epochs > 0 else start + PLAN_EPOCHS_MAX
            callbacks: list[Any] = getattr(trainer, "callbacks", [])
            if not any(isinstance(c, prefetch.PrefetchStats) for c in callbacks):
                callbacks.append(prefetch.PrefetchStats())  # logs hit rates, stall time, bytes read
        base = StoreDataset(dataclasses.replace(self.cfg, cache=False), "train")
        spec = prefetch.StreamSpec(len(base), seed=prefetch.lightning_seed(), rank=rank, world=world)
        disk_dir = f"{self.cfg.disk_cache_dir}/rank{rank}" if self.cfg.disk_cache_dir else None
        self._close_clairvoyant()
        sample_bytes = base.sample_nbytes()
        # the read-ahead window first (it keeps the prefetch threads ahead of the consumer), then the RAM tier:
        # both from the process's budget, so training holds cache_bytes of samples plus the batch in use
        self._staging_bytes = self.budget.take(STAGING_SAMPLES * sample_bytes, unit=sample_bytes)
        self._tier_bytes = self.budget.take(len(base) * sample_bytes, unit=sample_bytes)
        loader = prefetch.clairvoyant_loader(
            base,
            spec,
            batch_size=self.cfg.batch_size,
            sample_bytes=sample_bytes,
            ram_bytes=self._tier_bytes,
            disk_bytes=self.cfg.disk_cache_bytes,
            disk_dir=disk_dir,
            epochs=min(max(stop - start, 1), PLAN_EPOCHS_MAX),
            start_epoch=start,
            threads=self.cfg.prefetch_threads,
            lookahead=self._staging_bytes // sample_bytes,
        )
        assert isinstance(loader.dataset, prefetch.ClairvoyantDataset)  # what clairvoyant_loader builds
        self.clairvoyant = loader.dataset
        return loader

    def _close_clairvoyant(self) -> None:
        """Stop the clairvoyant loader's threads and give its RAM tier back to the budget."""
        if self.clairvoyant is not None:
            self.clairvoyant.close()
            self.clairvoyant = None
        self.budget.give(self._tier_bytes + self._staging_bytes)
        self._tier_bytes = self._staging_bytes = 0

    def teardown(self, stage: str) -> None:
        self._close_clairvoyant()

    def val_dataloader(self) -> DataLoader[dict[str, torch.Tensor]]:
        return self._loader("val", False)

    def test_dataloader(self) -> DataLoader[dict[str, torch.Tensor]]:
        return self._loader("test", False)

    def predict_dataloader(self) -> DataLoader[dict[str, torch.Tensor]]:
        return self._loader("test", False)
