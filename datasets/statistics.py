"""Normalisation statistics of a training store, from the training years only.

:func:`compute_statistics` is a pure ``xr.Dataset -> xr.Dataset`` function (one pass over the
data on the active dask scheduler; numpy- or dask-backed input). For every field
``F`` (member fields ``z``..``skt``, per-sample ``ens_mean_F`` / ``ens_std_F``, and ``truth_*``):

* ``F_mean``, ``F_std``, ``F_min``, ``F_max``: per variable and level (and step), over training
  init times, members and all grid points (unweighted, as ENS-10 and anemoi do);
* ``F_point_mean`` .. ``F_point_max`` (float32, accumulated in float64): per grid point (and level,
  step), over training init times and members (ENS-10 normalises per grid point).

Per-variable statistics are float64 (sums accumulated in float64). NaNs (SST over land) are
skipped; a grid point that is never valid stays NaN.
The statistics period is recorded in the attributes, so a model can prove it never saw test years.
"""

from __future__ import annotations

from typing import Any

import dask
import dask.array
import numpy as np
import xarray as xr

from postcast.datasets import schema

STAT_KINDS = ("mean", "std", "min", "max")


def statistic_fields(ds: xr.Dataset) -> list[str]:
    """Fields of a store that get statistics (every float data variable except the oracle)."""
    return [str(n) for n, v in ds.data_vars.items()
            if np.issubdtype(v.dtype, np.floating) and not str(n).startswith("oracle_")]


# One pass over the data: each block (a few init dates) yields mergeable partial sums in float64,
# combined in a binary tree of dask tasks (bounded memory), then turned into mean/std/min/max.
Partial = dict[str, np.ndarray]


def _partial(block: np.ndarray, global_axes: tuple[int, ...], point_axes: tuple[int, ...]) -> Partial:
    x = block.astype(np.float64)
    ok = np.isfinite(x)
    if ok.all():  # the common case: no masks, no extra copies
        x0, lo, hi = x, x, x
    else:
        x0, lo, hi = np.where(ok, x, 0.0), np.where(ok, x, np.inf), np.where(ok, x, -np.inf)
    sq = np.square(x0)
    return {"n": ok.sum(global_axes), "s": x0.sum(global_axes), "q": sq.sum(global_axes),
            "min": lo.min(global_axes), "max": hi.max(global_axes),
            "pn": ok.sum(point_axes), "ps": x0.sum(point_axes), "pq": sq.sum(point_axes),
            "pmin": lo.min(point_axes), "pmax": hi.max(point_axes)}


def _combine(a: Partial, b: Partial) -> Partial:
    out = {k: a[k] + b[k] for k in a if not k.endswith(("min", "max"))}
    return out | {k: np.minimum(a[k], b[k]) for k in ("min", "pmin")} | {
        k: np.maximum(a[k], b[k]) for k in ("max", "pmax")}


def _tree(parts: list[Any]) -> Any:
    while len(parts) > 1:
        parts = [dask.delayed(_combine)(parts[i], parts[i + 1]) if i + 1 < len(parts) else parts[i]
                 for i in range(0, len(parts), 2)]
    return parts[0]


def _moments(n: np.ndarray, s: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = s / n
        std = np.sqrt(np.maximum(q / n - mean * mean, 0.0))
    return mean, std


def _field_partials(da: xr.DataArray) -> Any:
    """A delayed Partial for one field, reading each block once."""
    sample = [i for i, d in enumerate(da.dims) if d in (schema.INIT_TIME, schema.MEMBER)]
    spatial = [i for i, d in enumerate(da.dims) if d in (schema.LAT, schema.LON)]
    point = tuple(sample)
    data = da.data if isinstance(da.data, dask.array.Array) else dask.array.from_array(da.values, chunks=-1)
    data = data.rechunk({i: -1 for i in range(data.ndim) if i != 0})
    blocks = [dask.delayed(_partial)(b, tuple(sample + spatial), point) for b in data.to_delayed().ravel()]
    return _tree(blocks)


def _to_arrays(name: str, da: xr.DataArray, p: Partial) -> dict[str, xr.DataArray]:
    gdims = [d for d in da.dims if d not in (schema.INIT_TIME, schema.MEMBER, schema.LAT, schema.LON)]
    coords = {d: da[d].values for d in gdims}
    mean, std = _moments(p["n"], p["s"], p["q"])
    out = {f"{name}_{k}": xr.DataArray(v, dims=gdims, coords=coords)
           for k, v in (("mean", mean), ("std", std), ("min", p["min"]), ("max", p["max"]))}
    pdims = [d for d in da.dims if d not in (schema.INIT_TIME, schema.MEMBER)]
    pcoords = {d: da[d].values for d in pdims}
    pmean, pstd = _moments(p["pn"], p["ps"], p["pq"])
    with np.errstate(invalid="ignore"):
        pmin = np.where(p["pn"] > 0, p["pmin"], np.nan)  # never-valid points (land for SST) stay NaN
        pmax = np.where(p["pn"] > 0, p["pmax"], np.nan)
    for k, v in (("mean", pmean), ("std", pstd), ("min", pmin), ("max", pmax)):
        out[f"{name}_point_{k}"] = xr.DataArray(v.astype(np.float32), dims=pdims, coords=pcoords)
    return out


def compute_statistics(ds: xr.Dataset, splits: schema.Splits) -> xr.Dataset:
    """Per-variable/level and per-grid-point statistics over the training split, computed in one
    pass on the active dask scheduler (the distributed client during ingestion)."""
    mask = splits.mask(ds[schema.INIT_TIME].values, "train")
    if not mask.any():
        years = sorted(set(ds[schema.INIT_TIME].dt.year.values.tolist()))
        msg = f"no init time falls in the training years {splits.train}; the store holds years {years}"
        raise ValueError(msg)
    train = ds.isel({schema.INIT_TIME: np.flatnonzero(mask)})
    names = statistic_fields(ds)
    partials = dask.compute(*[_field_partials(train[n]) for n in names])  # on the active scheduler
    out: dict[str, xr.DataArray] = {}
    for name, p in zip(names, partials, strict=True):
        out.update(_to_arrays(name, train[name], p))
    stats = xr.Dataset(out)
    stats = stats.drop_vars([c for c in stats.coords if c not in stats.dims])
    times = train[schema.INIT_TIME].values
    stats.attrs.update({
        "statistics_split": "train",
        "statistics_years": list(splits.train),
        "statistics_start": str(np.datetime_as_string(times.min(), unit="D")),
        "statistics_end": str(np.datetime_as_string(times.max(), unit="D")),
        "statistics_n_init_times": int(mask.sum()),
    })
    return stats


def normalise_field(
    da: xr.DataArray, stats: xr.Dataset, *, per_point: bool = False, eps: float = 1e-12
) -> xr.DataArray:
    """(x - mean) / std with the stored statistics of field ``da.name`` (global or per grid point)."""
    key = f"{da.name}_point" if per_point else str(da.name)
    mean, std = stats[f"{key}_mean"], stats[f"{key}_std"]
    return (da - mean) / (std + eps)
