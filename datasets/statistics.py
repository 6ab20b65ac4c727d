"""Normalisation statistics of a training store, from the training years only.

:func:`compute_statistics` is a pure ``xr.Dataset -> xr.Dataset`` function (one pass over the
data on the active dask scheduler; numpy- or dask-backed input); :func:`from_partials` builds the
same group from partial moments merged elsewhere (ingest). For every field
``F`` (member fields ``z``..``skt``, per-sample ``ens_mean_F`` / ``ens_std_F``, and ``truth_*``):

* ``F_mean``, ``F_std``, ``F_min``, ``F_max``: per variable and level (and step), over training
  init times, members and all grid points (unweighted, as ENS-10 and anemoi do);
* ``F_point_mean`` .. ``F_point_max`` (float32, accumulated in float64): per grid point (and level,
  step), over training init times and members (ENS-10 normalises per grid point).

Per-variable statistics are float64 (mergeable partial moments in float64: :mod:`postcast.datasets.core.moments`).
NaNs (SST over land) are skipped; a grid point that is never valid stays NaN. Ingest accumulates the
partials in the tasks that write each date (:func:`dataset_partials`), so it never reads the store
back; :func:`compute_statistics` is the same computation over a dataset in hand.
The statistics period is recorded in the attributes, so a model can prove it never saw test years.
"""

from __future__ import annotations

from typing import Any

import dask
import dask.array
import numpy as np
import xarray as xr

from postcast.datasets import contract, schema
from postcast.datasets.core import moments
from postcast.datasets.core.errors import ConfigError
from postcast.datasets.core.moments import FieldPartials, Partial

STAT_KINDS = ("mean", "std", "min", "max")


def statistic_fields(ds: xr.Dataset) -> list[str]:
    """Fields of a store that get statistics (every float data variable except the oracle)."""
    return [
        str(n)
        for n, v in ds.data_vars.items()
        if np.issubdtype(v.dtype, np.floating) and not str(n).startswith("oracle_")
    ]


def field_axes(dims: tuple[str, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(global axes, point axes) of a field with dimensions ``dims``."""
    sample = tuple(i for i, d in enumerate(dims) if d in (schema.INIT_TIME, schema.MEMBER))
    spatial = tuple(i for i, d in enumerate(dims) if d in (schema.LAT, schema.LON))
    return tuple(sorted(sample + spatial)), sample


def dataset_partials(ds: xr.Dataset) -> FieldPartials:
    """The partials of every statistics field of an in-memory dataset (one or a few init dates), with
    each field cast to the store's float32 first, so they equal the partials of what the store holds."""
    out: FieldPartials = {}
    for name in statistic_fields(ds):
        da = ds[name]
        out[name] = moments.partial(np.asarray(da.values, dtype=np.float32), *field_axes(tuple(map(str, da.dims))))
    return out


def date_partials(ds: xr.Dataset) -> FieldPartials:
    """The partials of every statistics field of one init date (``init_time`` of length 1, the store's
    layout: member second, latitude and longitude last), by the kernels ingest uses
    (``moments.ensemble_moments``, ``moments.value_partial``) on the float32 values; equal to
    :func:`dataset_partials` to float64 round-off."""
    out: FieldPartials = {}
    for name in statistic_fields(ds):
        da = ds[name]
        values = np.asarray(da.values, dtype=np.float32)
        if da.sizes.get(schema.INIT_TIME) != 1 or da.dims[-2:] != (schema.LAT, schema.LON):
            msg = f"{name}: date_partials takes one init date laid out as the store's, got {dict(da.sizes)}"
            raise ValueError(msg)
        if schema.MEMBER in da.dims:
            out[name] = moments.ensemble_moments(values)[2] or {}
        else:
            out[name] = moments.value_partial(values)
    return out


def _tree(parts: list[Any]) -> Any:
    while len(parts) > 1:
        parts = [
            dask.delayed(moments.combine)(parts[i], parts[i + 1]) if i + 1 < len(parts) else parts[i]
            for i in range(0, len(parts), 2)
        ]
    return parts[0]


def _finish(n: np.ndarray, mean: np.ndarray, m2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mean, std) from partial moments; NaN where nothing was counted."""
    const = moments.constant(n)
    if const is not None and const > 0:  # one count everywhere (no NaN): no masks
        return mean, np.sqrt(m2 / const)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, mean, np.nan), np.sqrt(m2 / n)


def _valid(n: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``x`` where something was counted, NaN elsewhere (min/max of a never-valid point: land for SST)."""
    const = moments.constant(n)
    return x if const is not None and const > 0 else np.where(n > 0, x, np.nan)


def field_partials(da: xr.DataArray) -> Any:
    """A delayed Partial for one field, reading each block once: a pairwise tree of merges over the blocks in
    order (a fixed tree: the same bits on any scheduler), run where the blocks are."""
    data = da.data if isinstance(da.data, dask.array.Array) else dask.array.from_array(da.values, chunks=-1)
    data = data.rechunk({i: -1 for i in range(data.ndim) if i != 0})
    axes = field_axes(tuple(map(str, da.dims)))
    blocks = [dask.delayed(moments.partial)(b, *axes) for b in data.to_delayed().ravel()]
    return _tree(blocks)


def field_variables(name: str, dims: tuple[str, ...], p: Partial) -> dict[str, xr.Variable]:
    """The statistics variables of field ``name`` (dimensions ``dims``) from its merged partial ``p``."""
    gdims = [d for d in dims if d not in (schema.INIT_TIME, schema.MEMBER, schema.LAT, schema.LON)]
    mean, std = _finish(p["n"], p["mean"], p["m2"])
    lo, hi = (np.where(p["n"] > 0, p[k], np.nan).astype(np.float64) for k in ("min", "max"))  # per slice: small
    out = {f"{name}_{k}": xr.Variable(gdims, v) for k, v in (("mean", mean), ("std", std), ("min", lo), ("max", hi))}
    pdims = [d for d in dims if d not in (schema.INIT_TIME, schema.MEMBER)]
    pmean, pstd = _finish(p["pn"], p["pmean"], p["pm2"])
    pmin, pmax = _valid(p["pn"], p["pmin"]), _valid(p["pn"], p["pmax"])  # never-valid points stay NaN
    for k, v in (("mean", pmean), ("std", pstd), ("min", pmin), ("max", pmax)):
        out[f"{name}_point_{k}"] = xr.Variable(pdims, v.astype(np.float32, copy=False))
    return out


def template(ds: xr.Dataset) -> tuple[xr.Dataset, dict[str, tuple[int, ...]]]:
    """The statistics group :func:`from_partials` makes from ``ds``, as lazy NaN arrays (metadata only:
    written with ``compute=False`` before the data exist, so the arrays are created while the dates are
    still being ingested), and its chunk shapes: one 2-D field per chunk per grid point, whole arrays per
    variable/level."""
    out: dict[str, xr.Variable] = {}
    chunks: dict[str, tuple[int, ...]] = {}
    lazy: dict[tuple[Any, ...], dask.array.Array] = {}
    dims: set[str] = set()
    for name in statistic_fields(ds):
        da = ds[name]
        dims |= {str(d) for d in da.dims}
        for kinds, drop, dtype in (
            (STAT_KINDS, (schema.INIT_TIME, schema.MEMBER, schema.LAT, schema.LON), np.float64),
            (tuple(f"point_{k}" for k in STAT_KINDS), (schema.INIT_TIME, schema.MEMBER), np.float32),
        ):
            vdims = [str(d) for d in da.dims if d not in drop]
            shape = tuple(ds.sizes[d] for d in vdims)
            chunk = tuple(
                n if d in (schema.LAT, schema.LON) or dtype is np.float64 else 1
                for d, n in zip(vdims, shape, strict=True)
            )
            key = (shape, np.dtype(dtype).str, chunk)
            if key not in lazy:  # one lazy array per layout, shared (a dask array per variable: ~3 ms each)
                lazy[key] = dask.array.full(shape, np.nan, dtype=dtype, chunks=chunk or -1)
            for k in kinds:
                out[f"{name}_{k}"] = xr.Variable(vdims, lazy[key])
                chunks[f"{name}_{k}"] = chunk
    coords = {d: ds[d].variable for d in sorted(dims - {schema.INIT_TIME, schema.MEMBER}) if d in ds.coords}
    return xr.Dataset(out, coords=coords), chunks


def from_partials(ds: xr.Dataset, parts: FieldPartials, train_times: np.ndarray, splits: schema.Splits) -> xr.Dataset:
    """The statistics group from merged partials. ``ds`` supplies each field's dimensions and
    coordinates only (a lazily opened store: no data chunk is read); ``train_times`` are the training
    init times the partials cover (recorded in the attributes)."""
    out: dict[str, xr.Variable] = {}
    dims: set[str] = set()
    for name in statistic_fields(ds):
        if name not in parts:
            msg = f"no partial statistics for field {name!r}: the partials cover {sorted(parts)}"
            raise ValueError(msg)
        out.update(field_variables(name, tuple(map(str, ds[name].dims)), parts[name]))
        dims |= {str(d) for d in ds[name].dims}
    coords = {d: ds[d].variable for d in sorted(dims - {schema.INIT_TIME, schema.MEMBER}) if d in ds.coords}
    stats = xr.Dataset(out, coords=coords)  # variables and index coordinates only: no alignment per field
    stats.attrs.update(attributes(train_times, splits))
    return stats


def attributes(train_times: np.ndarray, splits: schema.Splits) -> dict[str, Any]:
    """The statistics group's attributes: the period its figures cover (a model proves it never saw test years)."""
    times = np.asarray(train_times, dtype="datetime64[ns]")
    return {
        "statistics_split": "train",
        "statistics_years": list(splits.train),
        "statistics_start": str(np.datetime_as_string(times.min(), unit="D")),
        "statistics_end": str(np.datetime_as_string(times.max(), unit="D")),
        "statistics_n_init_times": len(times),
    }


def training_dates(ds: xr.Dataset, splits: schema.Splits) -> xr.Dataset:
    """The init dates of ``ds`` in the training years (a ConfigError naming the years when there is none)."""
    mask = splits.mask(ds[schema.INIT_TIME].values, "train")
    if not mask.any():
        years = sorted(set(ds[schema.INIT_TIME].dt.year.values.tolist()))
        msg = f"no init time falls in the training years {splits.train}; the store holds years {years}"
        raise ConfigError(msg)
    return ds.isel({schema.INIT_TIME: np.flatnonzero(mask)})


def compute_statistics(ds: xr.Dataset, splits: schema.Splits) -> xr.Dataset:
    """Per-variable/level and per-grid-point statistics over the training split, in one pass over the
    data on the active dask scheduler (ingest does without it: each task hands in the partials of the
    dates it writes; this is the reference and the tool for stores and datasets in hand)."""
    train = training_dates(ds, splits)
    names = statistic_fields(ds)
    merged = dask.compute(*[field_partials(train[n]) for n in names])  # on the active scheduler
    return from_partials(train, dict(zip(names, merged, strict=True)), train[schema.INIT_TIME].values, splits)


def ensemble_statistics(ds: xr.Dataset) -> xr.Dataset:
    """Per-sample ensemble mean and population std (ddof 0) of every member field, as float32, lazily on
    dask: the one implementation, ``moments.ensemble_moments`` (float64 sums, numpy's operation order), which
    the ingest task runs too, so a model sees at forecast time what it trained on."""
    out = {}
    for name, x in ds.data_vars.items():
        mean, std = xr.apply_ufunc(
            _member_moments,
            x,
            input_core_dims=[[schema.MEMBER]],
            output_core_dims=[[], []],
            dask="parallelized",
            output_dtypes=[np.float32, np.float32],
        )
        out[contract.ens_mean(str(name))], out[contract.ens_std(str(name))] = mean, std
    return xr.Dataset(out)


def _member_moments(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(init_time, ..., lat, lon, member) -> mean, std (init_time, ..., lat, lon), one init date at a time."""
    x = np.moveaxis(np.asarray(a, dtype=np.float32), -1, 1)  # (T, M, ..., lat, lon)
    pairs = [moments.ensemble_moments(x[t : t + 1], with_partial=False)[:2] for t in range(x.shape[0])]
    mean = np.concatenate([m for m, _ in pairs]).reshape(a.shape[:-1])
    std = np.concatenate([s for _, s in pairs]).reshape(a.shape[:-1])
    return mean, std
