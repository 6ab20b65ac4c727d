"""ERA5-like truth and the synthetic oracle, from zarr or netCDF."""

from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from postcast.datasets import plausibility, schema
from postcast.datasets.core.errors import BadInputError
from postcast.datasets.sources import conventions, derived, regrid
from postcast.datasets.sources.base import Plan, regridded
from postcast.datasets.sources.kinds import kind_of


class TruthSource:
    """ERA5-like truth (valid-time indexed, e.g. 48 h valid dates only) or paired truth/oracle
    (dims init_time x step). ``load`` returns (init_time=1, step, lat, lon) with NaN where absent."""

    def __init__(self, paths: list[Path], *, oracle: bool = False):
        self.paths = tuple(str(p) for p in sorted(paths))
        self.oracle = oracle

    @property
    def dataset(self) -> xr.Dataset:
        return _open_truth(self.paths, self.oracle)

    @property
    def paired(self) -> bool:
        return schema.STEP in self.dataset.dims

    def variables(self) -> list[str]:
        return sorted(str(v) for v in self.dataset.data_vars)  # zarr lists arrays in no fixed order

    def load(self, init_time: pd.Timestamp, plan: Plan) -> xr.Dataset:
        ds = self.dataset
        steps = pd.to_timedelta(list(plan.steps_h), unit="h")
        # select what exists lazily (reads only the needed chunks), then pad the small result with NaN
        if self.paired:
            out = _select_existing(ds, {schema.INIT_TIME: [init_time], schema.STEP: steps})
        else:
            valid = [init_time + s for s in steps]
            out = _select_existing(ds, {schema.VALID_TIME: valid}).rename({schema.VALID_TIME: schema.STEP})
            out = out.assign_coords({schema.STEP: steps}).expand_dims({schema.INIT_TIME: [init_time]})
        out = out.load(scheduler="synchronous").astype(np.float32, copy=False)
        out = out.drop_vars([c for c in out.coords if c not in out.dims])
        out = self._on_grid(out, plan)
        if not self.oracle:
            check_plausible(out, f"{self.paths[0]} (truth for {init_time:%Y-%m-%d})")
        dims = (schema.INIT_TIME, schema.STEP, schema.LAT, schema.LON)
        return out.transpose(*dims)

    def _on_grid(self, out: xr.Dataset, plan: Plan) -> xr.Dataset:
        """Truth on the store's grid: as is when it is already, else regridded (the forecasts' method)."""
        lat, lon = out[schema.LAT].values, out[schema.LON].values
        if conventions.POINTS in out.dims:
            src = regrid.SourceGrid.points(lat, lon)
        else:
            src = regrid.SourceGrid.regular(lat, lon)
        if src.is_grid(plan.grid):
            return out
        if not src.covers(plan.grid):
            msg = (
                f"{self.paths[0]}: truth covers {regrid.coverage(src)} only; the store is on "
                f"{plan.grid.describe()}: give truth that covers it"
            )
            raise BadInputError(msg)
        return regridded(out, replace(plan, source_grid=src))

    def coverage(self, plan: Plan) -> dict[str, list[str]]:
        """For each variable, the init times (ISO dates) lacking truth at the target step (48 h, or the
        store's longest step when it has no 48 h: :func:`schema.target_step_h`)."""
        ds = self.dataset
        target = pd.Timedelta(hours=schema.target_step_h(plan.steps_h))
        if self.paired:
            have = {pd.Timestamp(t) for t in ds[schema.INIT_TIME].values}
            lacking = [t for t in plan.init_times if t not in have]
        else:
            have = {pd.Timestamp(t) for t in ds[schema.VALID_TIME].values}
            lacking = [t for t in plan.init_times if t + target not in have]
        return {v: [f"{t:%Y-%m-%d}" for t in lacking] for v in self.variables()}


def check_plausible(ds: xr.Dataset, source: str) -> None:
    """The truth passes the checks a forecast's fields pass (:mod:`postcast.datasets.plausibility`): each
    target's median within its band and its values within their possible range, whatever the units
    attribute said (t2m in degC labelled K, a wind of 3e4 m/s, 2400 mm of rain in a day)."""
    for name in [n for n in map(str, ds.data_vars) if n.startswith("truth_") and n[6:] in schema.TARGETS]:
        bad = plausibility.target_problem(schema.target(name[6:]), np.asarray(ds[name].values))
        if bad:
            msg = f"{source}: truth {bad}"
            raise BadInputError(msg)


def _select_existing(ds: xr.Dataset, wanted: dict[str, Any]) -> xr.Dataset:
    """``ds.reindex(wanted)`` that touches only the existing labels of a lazily indexed dataset."""
    pos = {d: pd.Index(ds[d].values).get_indexer(pd.Index(v)) for d, v in wanted.items()}
    have = {d: p[p >= 0] for d, p in pos.items()}
    part = ds.isel(have).load(scheduler="synchronous")  # read here, inside a worker's task too
    return part.reindex({d: list(v) for d, v in wanted.items()})


# Truth read in chunks of 24 times (a file stored contiguous would be one chunk): a date's few valid times, and
# the derived truths computed from the hours before them (tp24), read those chunks only, not the whole file.
_TRUTH_CHUNKS = {"time": 24, "valid_time": 24}


@functools.lru_cache(maxsize=8)
def _open_truth(paths: tuple[str, ...], oracle: bool) -> xr.Dataset:
    from postcast.datasets.io import open_netcdf_lazy, open_zarr

    try:
        if kind_of(paths[0]) == "zarr":
            raw = open_zarr(paths[0], chunks=None)
        else:
            raw = xr.merge(
                [open_netcdf_lazy(p, chunks=_TRUTH_CHUNKS) for p in paths],
                compat="override",
                join="outer",
            )
    except (OSError, ValueError) as err:
        msg = f"{paths[0]}: cannot open truth ({err})"
        raise BadInputError(msg) from err
    if oracle:
        names = [v for v in raw.data_vars if str(v).startswith("oracle_")]
        if not names:
            msg = f"{paths[0]}: no oracle_mean_* / oracle_std_* variables"
            raise BadInputError(msg)
        return conventions.normalise_oracle(raw[names], source=paths[0])
    return derived.normalise_truth(raw, source=paths[0])
