"""Normalisation statistics of a training store, from the training years only.

:func:`compute_statistics` is a pure, lazy ``xr.Dataset -> xr.Dataset`` function. For every field
``F`` (member fields ``z``..``skt``, per-sample ``ens_mean_F`` / ``ens_std_F``, and ``truth_*``):

* ``F_mean``, ``F_std``, ``F_min``, ``F_max``: per variable and level (and step), over training
  init times, members and all grid points (unweighted, as ENS-10 and anemoi do);
* ``F_point_mean``, ``F_point_std`` (float32): per grid point (and level, step), over training init times,
  for the member-free fields ``ens_mean_F``, ``ens_std_F`` and ``truth_*`` (ENS-10 normalises its
  ensemble mean and std files per grid point; members are scaled per variable and level).

Per-variable statistics are float64. NaNs (SST over land) are skipped; a grid point that is never valid stays NaN.
The statistics period is recorded in the attributes, so a model can prove it never saw test years.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from postcast.datasets import schema

STAT_KINDS = ("mean", "std", "min", "max")


def statistic_fields(ds: xr.Dataset) -> list[str]:
    """Fields of a store that get statistics (every float data variable except the oracle)."""
    return [str(n) for n, v in ds.data_vars.items()
            if np.issubdtype(v.dtype, np.floating) and not str(n).startswith("oracle_")]


def _reduce(da: xr.DataArray, dims: list[str], prefix: str, skipna: bool) -> dict[str, xr.DataArray]:
    x = da.astype(np.float64)
    return {
        f"{prefix}_mean": x.mean(dims, skipna=skipna),
        f"{prefix}_std": x.std(dims, skipna=skipna),
        f"{prefix}_min": x.min(dims, skipna=skipna),
        f"{prefix}_max": x.max(dims, skipna=skipna),
    }


def _reduce_point(da: xr.DataArray, dims: list[str], prefix: str, skipna: bool) -> dict[str, xr.DataArray]:
    """Per-grid-point mean and std, accumulated in float64, stored as float32 (about 6 MB per field,
    step and level pair at 0.5 deg instead of 50 MB for four float64 statistics)."""
    x = da.astype(np.float64)
    return {
        f"{prefix}_mean": x.mean(dims, skipna=skipna).astype(np.float32),
        f"{prefix}_std": x.std(dims, skipna=skipna).astype(np.float32),
    }


def _may_have_nans(name: str) -> bool:
    """Only fields derived from variables with missing values (SST over land) need NaN-aware (slow)
    reductions; the checks at read time guarantee the others are NaN-free."""
    base = name.removeprefix("ens_mean_").removeprefix("ens_std_")
    var = schema.VARIABLES.get(base)
    return (var is not None and var.missing_over_land) or name.startswith("truth_")


def compute_statistics(ds: xr.Dataset, splits: schema.Splits) -> xr.Dataset:
    """Per-variable/level and per-grid-point statistics over the training split (lazy)."""
    mask = splits.mask(ds[schema.INIT_TIME].values, "train")
    if not mask.any():
        years = sorted(set(ds[schema.INIT_TIME].dt.year.values.tolist()))
        msg = f"no init time falls in the training years {splits.train}; the store holds years {years}"
        raise ValueError(msg)
    train = ds.isel({schema.INIT_TIME: np.flatnonzero(mask)})
    out: dict[str, xr.DataArray] = {}
    for name in statistic_fields(ds):
        da = train[name]
        sample_dims = [d for d in (schema.INIT_TIME, schema.MEMBER) if d in da.dims]
        skipna = _may_have_nans(name)
        out.update(_reduce(da, [*sample_dims, schema.LAT, schema.LON], name, skipna))
        if schema.MEMBER not in da.dims:  # per grid point: the fields grid models normalise
            out.update(_reduce_point(da, sample_dims, f"{name}_point", skipna))
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
