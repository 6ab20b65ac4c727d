"""netCDF and zarr forecasts, opened with xarray (cfgrib-, CDS- and WeatherBench-2-style layouts) as a
:class:`ForecastSource`."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from postcast.datasets import schema
from postcast.datasets.core.errors import BadInputError
from postcast.datasets.sources import base, conventions, regrid
from postcast.datasets.sources.base import (
    Expectation,
    ForecastSource,
    Plan,
    is_pressure_level,
    pick_variables,
    regridded,
    target_grid,
)
from postcast.datasets.sources.kinds import kind_of


def _open_one(path: str, dask: bool = True) -> xr.Dataset:
    """One netCDF file or zarr store, lazily (dask chunks for netCDF unless ``dask`` is False: lazily
    indexed then, as zarr always is)."""
    try:
        if kind_of(path) == "zarr":
            from postcast.datasets.io import open_zarr

            return open_zarr(path, chunks=None)  # lazily indexed: a date reads only its chunks
        from postcast.datasets.io import open_netcdf_lazy

        return open_netcdf_lazy(path, chunks={} if dask else None)
    except (OSError, ValueError, KeyError, TypeError) as err:
        fix = "it is a GRIB file: rename it to *.grib" if is_grib_inside(path) else "is it a netCDF file or zarr store?"
        msg = f"{path}: cannot open ({err}); {fix}"
        raise BadInputError(msg) from err


def is_grib_inside(path: str) -> bool:
    """Whether ``path`` is a file whose first bytes are GRIB's, whatever its name says."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GRIB"
    except OSError:
        return False


def open_raw(path: str | Path) -> xr.Dataset:
    """One netCDF file or zarr store as it is (lazily indexed, no dask graph per variable: a file of 20 000
    variables opens in seconds; conventions not normalised): for ``inspect FILE``."""
    return _open_one(str(path), dask=False)


def combine(parts: list[xr.Dataset], label: str, names: list[str]) -> xr.Dataset:
    """Normalised pieces -> one dataset: pieces holding the same variables (e.g. the ENS-10 files of
    several month-days, each with many years) are joined along init_time and sorted; groups of other
    variables (pl and sfc files) are merged."""
    first = parts[0]
    for ds, name in zip(parts[1:], names[1:], strict=True):
        same = all(
            ds[c].shape == first[c].shape and np.allclose(ds[c].values, first[c].values)
            for c in (schema.LAT, schema.LON)
        )
        if not same:
            grids = [
                regrid.SourceGrid.regular(d[schema.LAT].values, d[schema.LON].values).name
                if conventions.POINTS not in d[schema.LAT].dims
                else "a point grid"
                for d in (first, ds)
            ]
            msg = (
                f"{label}: {Path(name).name} is on {grids[1]}, {Path(names[0]).name} on {grids[0]}; "
                "one source holds one grid: ingest them separately"
            )
            raise BadInputError(msg)
    groups: dict[tuple[str, ...], list[xr.Dataset]] = {}
    for ds in parts:
        groups.setdefault(tuple(sorted(str(v) for v in ds.data_vars)), []).append(ds)
    joined = []
    for group in groups.values():
        ds = (
            group[0]
            if len(group) == 1
            else xr.concat(
                group, dim=schema.INIT_TIME, data_vars="minimal", coords="minimal", compat="override", join="outer"
            )
        )
        if schema.INIT_TIME in ds.dims:
            ds = ds.sortby(schema.INIT_TIME)
            dup = ds.indexes[schema.INIT_TIME].duplicated()
            if dup.any():
                msg = (
                    f"{label}: init time {ds[schema.INIT_TIME].values[dup][0]} appears in more than one file; "
                    "remove the duplicate file"
                )
                raise BadInputError(msg)
        joined.append(ds)
    try:
        return xr.merge(joined, compat="override", join="outer", combine_attrs="drop_conflicts")
    except ValueError as err:
        msg = f"{label}: the files do not fit together ({err})"
        raise BadInputError(msg) from err


@functools.lru_cache(maxsize=8)
def _open_normalised(paths: tuple[str, ...]) -> xr.Dataset:
    label = paths[0] if len(paths) == 1 else f"{Path(paths[0]).parent} ({len(paths)} files)"
    parts = [conventions.normalise(_open_one(p), source=p) for p in paths]
    return parts[0] if len(parts) == 1 else combine(parts, label, list(paths))


class XarraySource(ForecastSource):
    """Forecasts in netCDF files or a zarr store, in any convention :mod:`conventions` knows."""

    def __init__(self, paths: list[Path]):
        self.paths = tuple(str(p) for p in sorted(paths))
        self.path = Path(self.paths[0]) if len(self.paths) == 1 else Path(self.paths[0]).parent

    @property
    def dataset(self) -> xr.Dataset:
        return _open_normalised(self.paths)

    def source_grid(self) -> regrid.SourceGrid:
        ds = self.dataset
        lat, lon = ds[schema.LAT].values, ds[schema.LON].values
        if conventions.POINTS in ds[schema.LAT].dims:
            return regrid.SourceGrid.points(lat, lon)
        return regrid.SourceGrid.regular(lat, lon)

    def plan(self, expect: Expectation) -> Plan:
        ds, src = self.dataset, str(self.path)
        variables = pick_variables(expect, {str(v) for v in ds.data_vars}, src)
        have_levels = [int(x) for x in ds[schema.LEVEL].values] if schema.LEVEL in ds.coords else []
        if not any(is_pressure_level(v) for v in variables):
            have_levels = []
        levels = expect.pick("levels", expect.levels, have_levels, "hPa", src)
        have_members = [int(m) for m in ds[schema.MEMBER].values] if schema.MEMBER in ds.coords else []
        members = expect.pick_members(have_members, src)
        have_steps = [int(pd.Timedelta(s).total_seconds() // 3600) for s in ds[schema.STEP].values]
        steps = expect.pick("steps", expect.steps_h, have_steps, "h", src)
        grid, source_grid = target_grid(self.source_grid(), expect, src)
        times = sorted(pd.Timestamp(t) for t in ds[schema.INIT_TIME].values)
        return Plan(times, variables, levels, members, steps, grid, list(self.paths), source_grid, expect.method)

    def load(self, init_time: pd.Timestamp, plan: Plan, variables: Sequence[str] | None = None) -> xr.Dataset:
        ds = self.dataset[list(plan.variables if variables is None else variables)]
        sel: dict[str, Any] = {
            schema.INIT_TIME: [init_time],
            schema.MEMBER: list(plan.members),
            schema.STEP: pd.to_timedelta(list(plan.steps_h), unit="h"),
        }
        if plan.levels and schema.LEVEL in ds.dims:  # a surface-only selection (T2m) has no level dim
            sel[schema.LEVEL] = list(plan.levels)
        out = ds.sel(sel).load(scheduler="synchronous")  # in this task (no sub-tasks through a cluster)
        out = out.drop_vars([c for c in out.coords if c not in out.dims])
        if plan.source_grid is not None:
            out = regridded(out, plan)
        out = out.astype(np.float32, copy=False)  # float32 sources as they are (a copy: ~1 s per 0.5 deg date)
        base.check_values(out, f"{self.path} {init_time:%Y-%m-%d}")
        return out

    def __getstate__(self) -> dict[str, Any]:
        return {"paths": self.paths, "path": self.path}
