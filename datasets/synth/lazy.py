"""The synthetic world as lazy (dask) datasets in canonical conventions: :func:`forecast_dataset` (the
members of every variable) and :func:`truth_dataset` (truth and oracle of every target), one task per
chunk of init dates."""

from __future__ import annotations

from typing import Any

import dask
import dask.array as da
import numpy as np
import pandas as pd
import xarray as xr

from postcast.datasets import contract, schema
from postcast.datasets.synth.config import SynthConfig
from postcast.datasets.synth.truth import world

FORMAT_VERSION = 1


def _member_block(cfg: SynthConfig, name: str, inits: tuple[pd.Timestamp, ...]) -> np.ndarray:
    """(init, member, step, level, lat, lon) float32 for one variable (level axis of 1 for surface)."""
    w = world(cfg.seed, cfg.resolution, cfg.members, cfg.regimes)
    var = schema.VARIABLES[name]
    levels = cfg.sorted_levels if var.on_levels else (0,)
    out = np.empty((len(inits), cfg.members, len(schema.STEPS_H), len(levels), *cfg.grid.shape), np.float32)
    for i, t in enumerate(inits):
        for j, step in enumerate(schema.STEPS_H):
            for k, lv in enumerate(levels):
                out[i, :, j, k] = w.members_field(name, lv, t, step)
    return out


def _time_chunks(cfg: SynthConfig) -> tuple[int, ...]:
    n = len(cfg.init_times)
    return tuple(min(cfg.chunk_dates, n - i) for i in range(0, n, cfg.chunk_dates))


def _inits_of(block_info: dict[Any, Any] | None, cfg: SynthConfig, axis: int) -> tuple[pd.Timestamp, ...]:
    start, stop = block_info[None]["array-location"][axis]  # type: ignore[index]
    return tuple(cfg.init_times[start:stop])


def _member_block_mapped(block_info: dict[Any, Any] | None = None, *, cfg: SynthConfig, variable: str) -> np.ndarray:
    return _member_block(cfg, variable, _inits_of(block_info, cfg, 0))


def _lazy_variable(cfg: SynthConfig, var: schema.Variable) -> da.Array:
    """(init_time, member, step[, level], lat, lon) float32 dask array; one task per date chunk.
    Built with ``map_blocks`` so even the 2100-date, 0.5 deg graph costs milliseconds to create."""
    nl = len(cfg.sorted_levels) if var.on_levels else 1
    ny, nx = cfg.grid.shape
    chunks = (_time_chunks(cfg), (cfg.members,), (len(schema.STEPS_H),), (nl,), (ny,), (nx,))
    arr = da.map_blocks(
        _member_block_mapped,
        chunks=chunks,
        dtype=np.float32,
        meta=np.empty((0,) * 6, np.float32),
        cfg=cfg,
        variable=var.name,
        name=f"synth-{var.name}-{dask.base.tokenize(cfg)}",
    )
    return arr[:, :, :, 0] if var.level_type is schema.LevelType.SURFACE else arr


def _coords(cfg: SynthConfig, with_members: bool = True, levels: bool = True) -> dict[str, Any]:
    times = cfg.init_times
    steps = pd.to_timedelta(list(schema.STEPS_H), unit="h")
    coords: dict[str, Any] = {
        schema.INIT_TIME: times,
        schema.STEP: steps,
        schema.LAT: ("latitude", cfg.grid.latitudes(), {"units": "degrees_north", "standard_name": "latitude"}),
        schema.LON: ("longitude", cfg.grid.longitudes(), {"units": "degrees_east", "standard_name": "longitude"}),
        schema.VALID_TIME: ((schema.INIT_TIME, schema.STEP), times.values[:, None] + steps.values[None, :]),
    }
    if with_members:
        coords[schema.MEMBER] = np.arange(1, cfg.members + 1)
    if levels:
        coords[schema.LEVEL] = ("level", np.array(cfg.sorted_levels), {"units": "hPa"})
    return coords


def forecast_dataset(cfg: SynthConfig, variables: list[str] | None = None) -> xr.Dataset:
    """Lazy synthetic ENS-10 forecasts in canonical conventions (nothing computed until asked): ``variables``,
    else the config's, else all of them."""
    names = variables or list(cfg.variables) or list(schema.VARIABLES)
    data_vars = {}
    for name in names:
        var = schema.VARIABLES[name]
        data_vars[name] = xr.Variable(var.dims, _lazy_variable(cfg, var), schema.cf_attrs(var))
    ds = xr.Dataset(data_vars, coords=_coords(cfg))
    ds.attrs.update(synthetic_attrs(cfg))
    return ds


def _truth_arrays(cfg: SynthConfig) -> list[tuple[str, str, str, str]]:
    """(target, oracle key, store name, label) of every truth and oracle array of the config's targets:
    the truth, then the oracle's parameters (a Gaussian's mean and std, another family's by name)."""
    out = []
    for target in cfg.targets:
        out.append((target, "truth", contract.truth_name(target), "ERA5-like"))
        for param, name in contract.oracle_parameters(schema.target(target)).items():
            out.append((target, param, name, f"oracle {name.split('_')[1]}"))
    return out


def _truth_block(cfg: SynthConfig, inits: tuple[pd.Timestamp, ...]) -> np.ndarray:
    """(array, init, step, lat, lon) float32 for a block of init times, arrays as :func:`_truth_arrays`."""
    w = world(cfg.seed, cfg.resolution, cfg.members, cfg.regimes)
    arrays = _truth_arrays(cfg)
    out = np.empty((len(arrays), len(inits), len(schema.STEPS_H), *cfg.grid.shape), dtype=np.float32)
    for i, t in enumerate(inits):
        for j, step in enumerate(schema.STEPS_H):
            oracles = {target: w.oracle(target, t, step) for target in cfg.targets}
            for k, (target, key, _, _) in enumerate(arrays):
                out[k, i, j] = oracles[target][key]
    return out


def _truth_block_mapped(block_info: dict[Any, Any] | None = None, *, cfg: SynthConfig) -> np.ndarray:
    return _truth_block(cfg, _inits_of(block_info, cfg, 1))


def truth_dataset(cfg: SynthConfig) -> xr.Dataset:
    """Lazy ERA5-like truth ``truth_<target>`` and the oracle (``oracle_mean_<target>`` /
    ``oracle_std_<target>``, or :func:`postcast.datasets.contract.oracle_parameters`) for every target of
    the config and every step, dims (init_time, step, latitude, longitude)."""
    arrays = _truth_arrays(cfg)
    chunks = ((len(arrays),), _time_chunks(cfg), (len(schema.STEPS_H),), *((n,) for n in cfg.grid.shape))
    arr = da.map_blocks(
        _truth_block_mapped,
        chunks=chunks,
        dtype=np.float32,
        meta=np.empty((0,) * 5, np.float32),
        cfg=cfg,
        name=f"synth-truth-{dask.base.tokenize(cfg)}",
    )
    dims = (schema.INIT_TIME, schema.STEP, schema.LAT, schema.LON)
    data_vars = {
        name: xr.Variable(
            dims,
            arr[k],
            {
                "units": "1" if key == "shape" else schema.target(target).units,
                "target": target,
                "long_name": f"{label} {target}",
            },
        )
        for k, (target, key, name, label) in enumerate(arrays)
    }
    ds = xr.Dataset(data_vars, coords=_coords(cfg, with_members=False, levels=False))
    ds.attrs.update(synthetic_attrs(cfg))
    return ds


def synthetic_attrs(cfg: SynthConfig) -> dict[str, Any]:
    import json

    return {"postcast_synthetic": json.dumps(cfg.to_dict()), "postcast_synthetic_version": FORMAT_VERSION}
