"""Train post-processors straight from a neural-field artefact (the compressed dataloader).

:func:`compress_split` fits one network to every field a post-processor's samples read (the
ensemble mean and std of each input variable at the target lead, and the truth) over one split of a
training store. :class:`CompressedDataset` decodes those fields on the fly, one init date per item,
and turns them into samples with the very code the store loader uses (``Sampler.sample`` of the
same :class:`~postcast.datasets.sample.SampleSpec`), so batches have the same keys, shapes and order.
:class:`CompressedDataModule` trains from the
artefact and validates and tests on the original store, the protocol of the neural-compression
paper's dataloader experiment (train on decoded data, score on the original).
:class:`SZ3Split` is the classical twin of an artefact (every field SZ3-compressed at its own absolute
bound): the same dataset and datamodule read it, so the two loaders differ only in the codec.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import Any, Protocol

import numpy as np
import pandas as pd
import torch
import xarray as xr
from torch.utils.data import DataLoader, Dataset

from postcast.compression import sz3
from postcast.compression.artefact import Artefact, grid_arrays, grid_spec
from postcast.compression.field import FieldConfig, Fields, to_fields
from postcast.compression.report import store_fields
from postcast.datasets import contract, schema
from postcast.datasets.core.errors import BadInputError, ConfigError
from postcast.datasets.loaders.datamodule import DataConfig, StoreDataModule, StoreDataset, to_tensors
from postcast.datasets.sample import Sampler, SampleSpec


def _channels(spec: SampleSpec) -> list[tuple[str, str, int | None]]:
    """(artefact name, store variable, level) of every field a sample reads."""
    out = []
    for i in spec.inputs():
        out += [
            (contract.ens_mean(i.spec), contract.ens_mean(i.variable), i.level),
            (contract.ens_std(i.spec), contract.ens_std(i.variable), i.level),
        ]
    truth = contract.truth_name(spec.target)
    out.append((truth, truth, None))
    return out


def split_fields(cfg: DataConfig, split: str = "train") -> xr.Dataset:
    """The fields of ``split`` that samples read, as (init_time, lat, lon) variables."""
    if cfg.sample.members:
        msg = "compressed training reads ensemble statistics only: set data.cfg.sample.members: false"
        raise ConfigError(msg)
    tg = cfg.sample.resolved_target
    if tg.derived:
        msg = (
            f"compressed training reads ensemble statistics only, and {tg.name} is derived from the "
            f"members ({', '.join(tg.input_variables)}): train it from the store"
        )
        raise ConfigError(msg)
    src = StoreDataset(cfg, split)
    return store_fields(cfg.store, src.indices, cfg.sample.step_h, _channels(cfg.sample))


def compress_split(cfg: DataConfig, field_cfg: FieldConfig, split: str = "train", progress: bool = True) -> Artefact:
    """Fit one neural field to every field the samples of ``split`` read."""
    art = Artefact.build(to_fields(split_fields(cfg, split)), field_cfg, progress)
    art.header["source"] = {
        "store": cfg.store,
        "split": split,
        "target": cfg.sample.target,
        "variables": list(cfg.sample.input_variables),
        "step_h": cfg.sample.step_h,
        "channels": [list(c) for c in _channels(cfg.sample)],
    }
    return art


class DecodedFields(Protocol):
    """What the compressed loader reads: an :class:`Artefact` or an :class:`SZ3Split`."""

    header: dict[str, Any]
    path: str | None

    def lat_lon(self) -> tuple[np.ndarray, np.ndarray]: ...

    def decode_array(self, times: list[int] | None = None) -> np.ndarray: ...


@dataclass
class SZ3Split:
    """The fields of a split, each variable one SZ3 stream over (time, level, lat, lon) at its own
    absolute bound; ``nbytes`` counts the streams plus 16 bytes of shape per variable (as the
    baselines do), so ratios compare with an artefact's."""

    header: dict[str, Any]  # variables, times, grid, shape, bounds
    streams: list[np.ndarray]
    path: str | None = None
    _decoded: list[np.ndarray] = dc_field(default_factory=list, repr=False)

    @classmethod
    def build(cls, fields: Fields, bounds: dict[str, float]) -> SZ3Split:
        missing = sorted(set(fields.variables) - set(bounds))
        if missing:
            msg = f"SZ3Split: no bound for {missing}; give one per variable in its units"
            raise ConfigError(msg)
        streams = [sz3.encode(fields.data[v], bounds[name]) for v, name in enumerate(fields.variables)]
        header = {
            "variables": fields.variables,
            "times": [str(t) for t in fields.times.astype("datetime64[s]")],
            "grid": grid_spec(fields.lat, fields.lon),
            "shape": list(fields.data.shape),
            "bounds": [bounds[v] for v in fields.variables],
        }
        return cls(header, streams)

    @property
    def nbytes(self) -> int:
        return sum(int(s.nbytes) + 16 for s in self.streams)

    @property
    def ratio(self) -> float:
        return 4 * int(np.prod(self.header["shape"])) / self.nbytes

    def lat_lon(self) -> tuple[np.ndarray, np.ndarray]:
        return grid_arrays(self.header["grid"])

    def decode_array(self, times: list[int] | None = None) -> np.ndarray:
        """(V, T', L, H, W) float32; the streams are decoded once per object."""
        if not self._decoded:
            shape = tuple(self.header["shape"][1:])
            self._decoded.append(np.stack([sz3.decode(s, shape) for s in self.streams]))
        out = self._decoded[0]
        return out if times is None else out[:, list(times)]


class CompressedDataset(Dataset[dict[str, torch.Tensor]]):
    """Samples decoded from an artefact: one init date per item, same fields as ``StoreDataset``
    (physical units; the model normalises them)."""

    def __init__(self, cfg: DataConfig, artefact: DecodedFields | str):
        self.cfg, self.spec = cfg, cfg.sample
        self.art: DecodedFields = Artefact.load(artefact) if isinstance(artefact, str) else artefact
        names = self.art.header["variables"]
        missing = [n for n, _, _ in _channels(self.spec) if n not in names]
        if missing:
            msg = (
                f"artefact {self.art.path or ''} lacks fields {missing} needed by target {self.spec.target!r} "
                f"with inputs {list(self.spec.input_variables)}: compress with the same data config"
            )
            raise BadInputError(msg)
        lat, lon = self.art.lat_lon()
        self.sampler = Sampler(self.spec, lat, lon)
        self.lat, self.lon = self.sampler.lat, self.sampler.lon
        self.times = np.array(self.art.header["times"], dtype="datetime64[ns]")
        self._cache: dict[int, dict[str, torch.Tensor]] = {}

    def __len__(self) -> int:
        return int(self.times.size)

    def day(self, i: int) -> xr.Dataset:
        """Init date ``i`` decoded into the store's layout (step and level dims of length one)."""
        arr = self.art.decode_array(times=[i])[:, 0, 0]  # (V, H, W)
        index = {n: k for k, n in enumerate(self.art.header["variables"])}
        coords: dict[str, Any] = {
            schema.INIT_TIME: self.times[i],
            schema.STEP: [pd.Timedelta(hours=self.spec.step_h)],
            schema.LAT: self.lat,
            schema.LON: self.lon,
        }
        ds = xr.Dataset(coords=coords)
        per_level: dict[str, dict[int, np.ndarray]] = {}
        for art_name, var, lv in _channels(self.spec):
            field = arr[index[art_name]][None]  # (1, H, W): one step
            if lv is None:
                ds[var] = ((schema.STEP, schema.LAT, schema.LON), field)
            else:
                per_level.setdefault(var, {})[lv] = field
        levels = sorted({lv for fields in per_level.values() for lv in fields})  # one shared level axis
        ds = ds.assign_coords({schema.LEVEL: levels})
        for var, fields in per_level.items():
            nan = np.full_like(next(iter(fields.values())), np.nan)  # (var, level) pairs no sample reads
            block = np.stack([fields.get(lv, nan) for lv in levels], axis=1)  # (1, L, H, W)
            ds[var] = ((schema.STEP, schema.LEVEL, schema.LAT, schema.LON), block)
        return ds

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if i in self._cache:
            return self._cache[i]
        sample = to_tensors(self.sampler.sample(self.day(i)))
        if self.cfg.cache:
            self._cache[i] = sample
        return sample


class CompressedDataModule(StoreDataModule):
    """Trains from the artefact, validates and tests on ``cfg.store`` (the model normalises with the
    store's statistics, copied at fit start)."""

    def __init__(self, cfg: DataConfig, artefact: DecodedFields | str):
        super().__init__(cfg)
        self.artefact = artefact

    def train_dataloader(self) -> Any:
        ds = CompressedDataset(self.cfg, self.artefact)
        return DataLoader(ds, batch_size=self.cfg.batch_size, shuffle=True, num_workers=self.cfg.num_workers)
