"""Training samples from a postcast store: a torch Dataset per init date and a LightningDataModule.

One sample = one init date at the target lead (48 h), on the whole grid:

* ``x`` (C, H, W) float32: for each input variable (at the target's level, or the surface), the
  ensemble mean and ensemble std, each normalised with the store's per-grid-point training
  statistics; then optional location features sin(lat), cos(lat) sin(lon), cos(lat) cos(lon)
  and season features sin/cos(2 pi doy / 365.25);
* ``y`` (H, W): the truth of the target (NaN where missing);
* ``m``, ``s`` (H, W): the raw ensemble mean and population std of the target (for the head);
* ``oracle_mean``/``oracle_std`` (H, W) when the store has them (synthetic data);
* ``members`` (M, V, H, W) float32 when ``members=True``: every member of every input variable,
  normalised like the ensemble-mean channel (per-grid-point training mean and std).

Input variables are names (``t``: at the target's level) or ``name@level`` (``u@850``).

The split comes from the store's ``split`` coordinate; dates without truth at the target lead are
skipped. Works with numpy- or dask-backed stores and with several DataLoader workers (each worker
opens the store itself).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

import lightning as L
import numpy as np
import pandas as pd
import torch
import xarray as xr
import zarr
from torch.utils.data import DataLoader, Dataset

from postcast.datasets import io, schema
from postcast.datasets.loaders import prefetch

SPLIT_CODE = {"train": 0, "val": 1, "test": 2}
LOADERS = ("auto", "plain", "clairvoyant", "fixed")
PLAN_EPOCHS_MAX = 100  # the clairvoyant plan looks at most this many epochs ahead


@dataclass(frozen=True)
class DataConfig:
    """What a post-processor reads (part of every training config and checkpoint)."""

    store: str
    target: str = "t850"  # z500 | t850 | t2m
    variables: tuple[str, ...] | None = None  # None: all pressure (z500/t850) or surface (t2m) variables;
    # entries "name" (pressure variables at the target level) or "name@level" ("u@850")
    step_h: int = schema.TARGET_STEP_H
    location_features: bool = True
    season_features: bool = True
    batch_size: int = 1  # init dates per batch
    num_workers: int = 0
    members: bool = False  # also yield the normalised raw members (Transformer, global EMOS)
    cache: bool = False  # keep decoded samples in memory (small stores: every epoch after the first is free)
    # training loader: "clairvoyant" replays the seeded shuffle, caches samples in RAM (then disk) under
    # the byte budgets and prefetches with threads (datasets/loaders/prefetch); "plain" is a DataLoader over
    # the store; "fixed" serves the first batch every step (is training loader-bound?); "auto" is
    # clairvoyant when num_workers == 0 (its threads replace worker processes, and the cache lives in
    # this process), else plain. Validation and test always use the plain loader (read in order).
    loader: str = "auto"
    cache_bytes: int = 2 * 2**30  # RAM tier budget of the clairvoyant loader (bytes)
    disk_cache_dir: str | None = None  # local-disk tier of the clairvoyant loader (e.g. node-local SSD)
    disk_cache_bytes: int = 0  # its budget (bytes; needs disk_cache_dir)
    prefetch_threads: int = 2  # clairvoyant loader's reader threads (decoding holds the GIL: ~free cores)

    def __post_init__(self) -> None:
        if self.target not in schema.TARGETS:
            msg = f"target {self.target!r}: use one of {list(schema.TARGETS)}"
            raise ValueError(msg)
        if self.loader not in LOADERS:
            msg = f"loader {self.loader!r}: use one of {list(LOADERS)}"
            raise ValueError(msg)
        if min(self.cache_bytes, self.disk_cache_bytes, self.prefetch_threads) < 0:
            msg = (f"cache_bytes ({self.cache_bytes}), disk_cache_bytes ({self.disk_cache_bytes}) and "
                   f"prefetch_threads ({self.prefetch_threads}) must be >= 0")
            raise ValueError(msg)
        if self.disk_cache_bytes and not self.disk_cache_dir:
            msg = f"disk_cache_bytes={self.disk_cache_bytes} needs disk_cache_dir (a local directory)"
            raise ValueError(msg)
        if self.variables is not None:
            bad = [v for v in self.variables if parse_variable(v)[0] not in schema.VARIABLES]
            if bad:
                msg = f"unknown input variables {bad}; known: {list(schema.VARIABLES)} (optionally name@level)"
                raise ValueError(msg)
            for v in self.variables:
                parse_variable(v)

    @property
    def input_variables(self) -> tuple[str, ...]:
        if self.variables is not None:
            return self.variables
        pl = schema.TARGETS[self.target].level is not None
        src = schema.PL_VARIABLES if pl else schema.SFC_VARIABLES
        return tuple(v.name for v in src)

    @property
    def n_channels(self) -> int:
        return 2 * len(self.input_variables) + 3 * self.location_features + 2 * self.season_features


def parse_variable(spec: str) -> tuple[str, int | None]:
    """``"u@850"`` -> ("u", 850); ``"t"`` -> ("t", None)."""
    name, _, level = spec.partition("@")
    if not level:
        return name, None
    if not level.isdigit() or int(level) not in schema.LEVELS:
        msg = f"input variable {spec!r}: level {level!r} is not one of {list(schema.LEVELS)} hPa"
        raise ValueError(msg)
    return name, int(level)


@functools.lru_cache(maxsize=4)
def _open(store: str) -> tuple[xr.Dataset, xr.Dataset | None]:
    """The store and its statistics group (None when it has none, e.g. no training years)."""
    ds = io.open_zarr(store)
    try:
        stats = io.open_zarr(store, group="statistics")
    except (FileNotFoundError, KeyError, ValueError):
        stats = None
    return ds, stats


class SampleMaker:
    """Turns one init date of canonical data (``day``: member fields, ``ens_mean_*``/``ens_std_*``,
    optionally truth and oracle; a store row or freshly read raw forecasts) into a sample."""

    cfg: DataConfig
    lat: np.ndarray
    lon: np.ndarray
    level: int | None
    has_oracle: bool
    _norm: dict[str, tuple[np.ndarray, np.ndarray]]
    _static: np.ndarray

    def setup_maker(self, cfg: DataConfig, lat: np.ndarray, lon: np.ndarray) -> None:
        self.cfg, self.lat, self.lon = cfg, lat, lon
        self.level = schema.TARGETS[cfg.target].level
        self.has_oracle = False
        self._static = self._location() if cfg.location_features else np.zeros((0, lat.size, lon.size), np.float32)

    @classmethod
    def from_normalisation(cls, cfg: DataConfig, lat: np.ndarray, lon: np.ndarray,
                           normalisation: tuple[np.ndarray, np.ndarray]) -> SampleMaker:
        """A sample maker for new data, normalised with given statistics (e.g. a checkpoint's)."""
        maker = cls()
        maker.setup_maker(cfg, lat, lon)
        maker._norm = maker._given(*normalisation)
        return maker

    def _sel(self, da: xr.DataArray, level: int | None = None) -> xr.Variable:
        """The target lead and level (``level``, else the target's, else the first) of ``da`` (a
        Variable: positional indexing without DataArray.sel's coordinate handling, ~30x cheaper)."""
        sel: dict[str, Any] = {schema.STEP: pd.Timedelta(hours=self.cfg.step_h)}
        if schema.LEVEL in da.dims:
            lv = level if level is not None else self.level
            levels = da[schema.LEVEL].values
            if lv is not None and lv not in levels:
                msg = f"{da.name}: level {lv} hPa is not in the store (it has {levels.tolist()})"
                raise ValueError(msg)
            sel[schema.LEVEL] = lv if lv is not None else levels[0]
        return da.variable.isel({d: int(da.get_index(d).get_loc(v)) for d, v in sel.items()})

    def _channel_keys(self) -> list[str]:
        return [f"{k}_{v}" for v in self.cfg.input_variables for k in ("ens_mean", "ens_std")]

    def _given(self, mean: np.ndarray, std: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        keys = self._channel_keys()
        want = (len(keys), self.lat.size, self.lon.size)
        if mean.shape != want or std.shape != want:
            msg = f"normalisation statistics have shape {mean.shape}, the data needs {want} (channels, lat, lon)"
            raise ValueError(msg)
        return {k: (mean[i].astype(np.float32), std[i].astype(np.float32)) for i, k in enumerate(keys)}

    def normalisation(self) -> tuple[np.ndarray, np.ndarray]:
        """(mean, std), each (2 * n_variables, H, W): what the ens mean/std channels are scaled with,
        in channel order (for checkpoints)."""
        keys = self._channel_keys()
        return np.stack([self._norm[k][0] for k in keys]), np.stack([self._norm[k][1] for k in keys])

    def _location(self) -> np.ndarray:
        lat = np.deg2rad(self.lat)[:, None] * np.ones((1, self.lon.size))
        lon = np.deg2rad(self.lon)[None, :] * np.ones((self.lat.size, 1))
        return np.stack([np.sin(lat), np.cos(lat) * np.sin(lon), np.cos(lat) * np.cos(lon)]).astype(np.float32)

    def sample(self, day: xr.Dataset) -> dict[str, torch.Tensor]:
        """The sample of one init date (see the module docstring); ``y`` is NaN without truth."""
        chans, members = [], []
        for spec in self.cfg.input_variables:
            v, level = parse_variable(spec)
            for kind in ("ens_mean", "ens_std"):
                mean, std = self._norm[f"{kind}_{spec}"]
                x = self._sel(day[f"{kind}_{v}"], level).values.astype(np.float32)
                chans.append(np.nan_to_num((x - mean) / std))  # (H, W); SST over land -> 0
            if self.cfg.members:
                mean, std = self._norm[f"ens_mean_{spec}"]
                x = self._sel(day[v], level).values.astype(np.float32)  # (M, H, W)
                members.append(np.nan_to_num((x - mean) / std))
        parts = [np.stack(chans), self._static]
        if self.cfg.season_features:
            doy = pd.Timestamp(day[schema.INIT_TIME].values).day_of_year
            ang = 2 * np.pi * doy / 365.25
            parts.append(np.stack([np.full(self.lat.shape + self.lon.shape, np.sin(ang), np.float32),
                                   np.full(self.lat.shape + self.lon.shape, np.cos(ang), np.float32)]))
        tg = schema.TARGETS[self.cfg.target]
        target_da = self._sel(day[f"ens_mean_{tg.variable}"]), self._sel(day[f"ens_std_{tg.variable}"])
        truth = schema.truth_name(self.cfg.target)
        y = self._sel(day[truth]).values if truth in day else np.full(target_da[0].shape, np.nan)
        out = {
            "x": torch.from_numpy(np.concatenate(parts).astype(np.float32)),  # (C, H, W)
            "y": torch.from_numpy(y.astype(np.float32)),
            "m": torch.from_numpy(target_da[0].values.astype(np.float32)),  # (H, W) raw units
            "s": torch.from_numpy(target_da[1].values.astype(np.float32)),
        }
        if members:
            out["members"] = torch.from_numpy(np.stack(members, axis=1))  # (M, V, H, W)
        if self.has_oracle:
            for k in ("mean", "std"):
                out[f"oracle_{k}"] = torch.from_numpy(
                    self._sel(day[f"oracle_{k}_{self.cfg.target}"]).values.astype(np.float32))
        return out


class StoreDataset(SampleMaker, Dataset[dict[str, torch.Tensor]]):
    """Samples of one split of a store; see the module docstring for the fields and shapes."""

    def __init__(self, cfg: DataConfig, split: str,
                 normalisation: tuple[np.ndarray, np.ndarray] | None = None, *, source: Any = None):
        """``normalisation``: (mean, std), each (2 * n_variables, H, W), e.g. from a checkpoint;
        default: the store's own training statistics. ``source``: a zarr store (object) holding the
        same data as ``cfg.store`` to read samples through, e.g. a wrapper that counts reads or adds
        latency; default: ``cfg.store`` itself."""
        self.cfg, self.split = cfg, split
        self._source = io.open_zarr(source) if source is not None else None
        self._source_store = source
        self._arrays: dict[str, zarr.Array[Any]] | None = None  # opened on the first read
        self._coords: dict[str, np.ndarray] = {}
        ds, stats = _open(cfg.store)
        truth = ds[schema.truth_name(cfg.target)].sel({schema.STEP: pd.Timedelta(hours=cfg.step_h)})
        has_truth = np.isfinite(truth.isel({schema.LAT: 0, schema.LON: 0}).values)
        in_split = ds["split"].values == SPLIT_CODE[split]
        self.indices = np.flatnonzero(in_split & has_truth)
        if self.indices.size == 0:
            msg = f"{cfg.store}: no init date with truth in split {split!r} for {cfg.target}"
            raise ValueError(msg)
        self.setup_maker(cfg, ds[schema.LAT].values, ds[schema.LON].values)
        self.has_oracle = f"oracle_mean_{cfg.target}" in ds
        if normalisation is not None:
            self._norm = self._given(*normalisation)
        elif stats is not None:
            self._norm = self._normalisers(stats)
        else:
            msg = f"{cfg.store} has no statistics group: pass the normalisation (e.g. from a checkpoint)"
            raise ValueError(msg)
        self._cache: dict[int, dict[str, torch.Tensor]] = {}

    def _normalisers(self, stats: xr.Dataset) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        out = {}
        for spec in self.cfg.input_variables:
            v, level = parse_variable(spec)
            for kind in ("ens_mean", "ens_std"):
                mean = self._sel(stats[f"{kind}_{v}_point_mean"], level).values.astype(np.float32)
                std = self._sel(stats[f"{kind}_{v}_point_std"], level).values.astype(np.float32)
                floor = max(float(np.nanmean(std)) * 1e-3, 1e-12)  # constant points: no division by 0
                out[f"{kind}_{spec}"] = (np.nan_to_num(mean), np.maximum(np.nan_to_num(std), floor))
        return out

    def __len__(self) -> int:
        return int(self.indices.size)

    def sample_nbytes(self) -> int:
        """Bytes of one sample (all fields are float32 of fixed shape)."""
        h, w = self.lat.size, self.lon.size
        planes = self.cfg.n_channels + 3 + 2 * self.has_oracle  # x (C, H, W); y, m, s; oracle mean/std
        if self.cfg.members:
            planes += _open(self.cfg.store)[0].sizes[schema.MEMBER] * len(self.cfg.input_variables)
        return 4 * planes * h * w

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if self.cfg.cache:
            if i not in self._cache:
                self._cache[i] = self._read(i)
            return self._cache[i]
        return self._read(i)

    def _read(self, i: int) -> dict[str, torch.Tensor]:
        """Sample ``i``: the variables it needs are read in one concurrent zarr call (the same values
        as ``self.sample(ds.isel(init_time=row))``, several times faster than xarray's lazy reads)."""
        ds = self._source if self._source is not None else _open(self.cfg.store)[0]
        row = int(self.indices[i])
        if self._arrays is None:
            group = zarr.open_group(self._source_store if self._source_store is not None else self.cfg.store, mode="r")
            self._arrays = {n: group[n] for n in self._needed(ds)}  # type: ignore[misc]
            self._coords = {str(c): ds[c].values for c in ds.coords if ds[c].dims == (c,) and c != schema.INIT_TIME}
        values = prefetch.read_rows(self._arrays, row)
        day = xr.Dataset({n: (ds[n].dims[1:], v) for n, v in values.items()},
                         coords={**self._coords, schema.INIT_TIME: ds[schema.INIT_TIME].values[row]})
        return self.sample(day)

    def _needed(self, ds: xr.Dataset) -> list[str]:
        """The store variables ``sample`` reads."""
        names = [f"{k}_{parse_variable(s)[0]}" for s in self.cfg.input_variables for k in ("ens_mean", "ens_std")]
        if self.cfg.members:
            names += [parse_variable(s)[0] for s in self.cfg.input_variables]
        tg = schema.TARGETS[self.cfg.target]
        names += [f"ens_mean_{tg.variable}", f"ens_std_{tg.variable}", schema.truth_name(self.cfg.target)]
        if self.has_oracle:
            names += [f"oracle_mean_{self.cfg.target}", f"oracle_std_{self.cfg.target}"]
        return [n for n in dict.fromkeys(names) if n in ds]


class StoreDataModule(L.LightningDataModule):
    """LightningDataModule over a postcast store (train/val/test splits from the store)."""

    def __init__(self, cfg: DataConfig):
        super().__init__()
        self.cfg = cfg
        self.clairvoyant: prefetch.ClairvoyantDataset | None = None  # the training loader's, when used

    @property
    def grid(self) -> tuple[int, int]:
        ds, _ = _open(self.cfg.store)
        return (ds.sizes[schema.LAT], ds.sizes[schema.LON])

    @property
    def target_channels(self) -> tuple[int, int]:
        """Channels of the target variable's normalised ensemble mean and std (for local EMOS)."""
        i = self.target_variable_index
        return (2 * i, 2 * i + 1)

    @property
    def target_variable_index(self) -> int:
        """Position of the target variable (at the target level) among the input variables."""
        tg = schema.TARGETS[self.cfg.target]
        names = [parse_variable(v) for v in self.cfg.input_variables]
        for i, (name, level) in enumerate(names):
            if name == tg.variable and level in (None, tg.level):
                return i
        msg = f"the target variable {tg.variable!r} is not among the inputs {list(self.cfg.input_variables)}"
        raise ValueError(msg)

    @property
    def n_members(self) -> int:
        ds, _ = _open(self.cfg.store)
        return int(ds.sizes[schema.MEMBER])

    def normalisation(self) -> tuple[np.ndarray, np.ndarray]:
        return StoreDataset(self.cfg, "train").normalisation()

    def _loader(self, split: str, shuffle: bool) -> DataLoader[dict[str, torch.Tensor]]:
        return DataLoader(StoreDataset(self.cfg, split), batch_size=self.cfg.batch_size, shuffle=shuffle,
                          num_workers=self.cfg.num_workers, persistent_workers=self.cfg.num_workers > 0)

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
        if self.clairvoyant is not None:
            self.clairvoyant.close()
        loader = prefetch.clairvoyant_loader(
            base, spec, batch_size=self.cfg.batch_size, sample_bytes=base.sample_nbytes(),
            ram_bytes=self.cfg.cache_bytes, disk_bytes=self.cfg.disk_cache_bytes, disk_dir=disk_dir,
            epochs=min(max(stop - start, 1), PLAN_EPOCHS_MAX), start_epoch=start, threads=self.cfg.prefetch_threads)
        self.clairvoyant = loader.dataset
        return loader

    def teardown(self, stage: str) -> None:
        if self.clairvoyant is not None:
            self.clairvoyant.close()

    def val_dataloader(self) -> DataLoader[dict[str, torch.Tensor]]:
        return self._loader("val", False)

    def test_dataloader(self) -> DataLoader[dict[str, torch.Tensor]]:
        return self._loader("test", False)

    def predict_dataloader(self) -> DataLoader[dict[str, torch.Tensor]]:
        return self._loader("test", False)
