"""The one place postcast opens raw data: ENS-10 GRIB, netCDF and zarr forecasts, ERA5-like truth.

:func:`discover` looks at a path and returns a :class:`ForecastSource` plus optional truth and
oracle sources. Every source answers two questions:

* :meth:`ForecastSource.plan`: what does it hold, and is it complete? (metadata only; raises
  :class:`MissingInputError` listing *every* missing member x step x level x variable per date);
* :meth:`ForecastSource.load`: one init time as a canonical, numpy-backed dataset
  (dims ``init_time=1, member, step, [level], latitude, longitude``), values checked.

Sources are small and picklable, so dask workers can load dates in parallel.
"""

from __future__ import annotations

import functools
import itertools
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from postcast.datasets import conventions, grib, schema
from postcast.datasets.errors import BadInputError, MissingInputError

MAX_REPORTED = 20  # missing items printed in an error message (the JSON report has them all)


@dataclass(frozen=True)
class Expectation:
    """What a complete forecast source must hold for every init date."""

    variables: tuple[str, ...] = tuple(schema.VARIABLES)
    levels: tuple[int, ...] | None = None  # None: the levels the source holds (same for all dates)
    members: int = schema.N_MEMBERS
    steps_h: tuple[int, ...] = schema.STEPS_H

    def __post_init__(self) -> None:
        unknown = [v for v in self.variables if v not in schema.VARIABLES]
        if unknown:
            msg = f"unknown variables {unknown}; known: {list(schema.VARIABLES)}"
            raise ValueError(msg)
        if self.levels is not None:
            bad = [lv for lv in self.levels if lv not in schema.LEVELS]
            if bad:
                msg = f"levels {bad} are not ENS-10 levels {list(schema.LEVELS)}"
                raise ValueError(msg)


@dataclass
class Plan:
    """What a source holds once checked; the shape of the store ingestion will write."""

    init_times: list[pd.Timestamp]
    variables: tuple[str, ...]
    levels: tuple[int, ...]
    members: tuple[int, ...]
    steps_h: tuple[int, ...]
    grid: schema.Grid
    files: list[str] = field(default_factory=list)

    @property
    def pl_variables(self) -> list[str]:
        return [v for v in self.variables if schema.VARIABLES[v].level_type is schema.LevelType.PRESSURE]

    def to_dict(self) -> dict[str, Any]:
        return {"init_times": [str(t) for t in self.init_times], "variables": list(self.variables),
                "levels": list(self.levels), "members": list(self.members), "steps_h": list(self.steps_h),
                "resolution": self.grid.resolution, "files": self.files}


def _raise_missing(missing: list[str], source: str, what: str = "forecast fields") -> None:
    if not missing:
        return
    shown = "; ".join(missing[:MAX_REPORTED])
    more = f" ... and {len(missing) - MAX_REPORTED} more" if len(missing) > MAX_REPORTED else ""
    err = MissingInputError(f"{source}: {len(missing)} {what} missing: {shown}{more}")
    err.missing = missing
    raise err


def check_values(ds: xr.Dataset, source: str) -> None:
    """NaNs only where they belong (SST over land), values within physical ranges."""
    for name, da in ds.data_vars.items():
        var = schema.VARIABLES[str(name)]
        values = np.asarray(da.values)
        nan = np.isnan(values)
        if nan.any() and not var.missing_over_land:
            where = {d: str(da[d].values[i]) for d, i in zip(da.dims, np.argwhere(nan)[0], strict=True)
                     if d in da.coords and d not in (schema.LAT, schema.LON)}
            msg = f"{source}: {int(nan.sum())} NaN values in {name!r} (first at {where}); only sst may be missing"
            raise BadInputError(msg)
        if nan.all():
            msg = f"{source}: {name!r} is entirely missing"
            raise BadInputError(msg)
        lo, hi = float(np.nanmin(values)), float(np.nanmax(values))
        if lo < var.valid_min or hi > var.valid_max:
            msg = (f"{source}: {name!r} spans {lo:.4g}..{hi:.4g} {var.units}, outside the plausible "
                   f"{var.valid_min:g}..{var.valid_max:g}: wrong units or corrupt data?")
            raise BadInputError(msg)


class ForecastSource(ABC):
    """A raw forecast source; see the module docstring."""

    path: Path

    @abstractmethod
    def plan(self, expect: Expectation) -> Plan: ...

    @abstractmethod
    def load(self, init_time: pd.Timestamp, plan: Plan) -> xr.Dataset: ...

    @property
    def kind(self) -> str:
        return type(self).__name__.removesuffix("Source").lower()


# --- GRIB ----------------------------------------------------------------------------------------
class GribSource(ForecastSource):
    """ENS-10 GRIB1 files (``output.pl.2018MMDD``, ``output.sfc.2018MMDD`` or any GRIB files)."""

    def __init__(self, files: list[Path], index: pd.DataFrame | None = None):
        self.files = sorted(files)
        self.path = self.files[0].parent
        self._index = index

    @property
    def index(self) -> pd.DataFrame:
        if self._index is None:
            self.set_index([grib.index_file(p) for p in self.files])
        assert self._index is not None
        return self._index

    def set_index(self, parts: list[pd.DataFrame]) -> None:
        """Install per-file indices (computed elsewhere, e.g. in parallel on dask workers)."""
        frames = [p.assign(file=str(f)) for p, f in zip(parts, self.files, strict=True)]
        self._index = pd.concat(frames, ignore_index=True)

    def plan(self, expect: Expectation) -> Plan:
        idx = self.index
        grids = {f: grib.grid_of(g, f) for f, g in idx.groupby("file")}
        if len(set(grids.values())) > 1:
            detail = ", ".join(f"{Path(f).name}: {g.resolution} deg" for f, g in grids.items())
            msg = f"{self.path}: files on different grids ({detail})"
            raise BadInputError(msg)
        dup = idx.duplicated(["var", "level", "member", "init_time", "step_h"])
        if dup.any():
            r = idx[dup].iloc[0]
            msg = (f"{r.file}: {int(dup.sum())} duplicate messages, e.g. {r['var']} level {r.level} member "
                   f"{r.member} {r.init_time:%Y-%m-%d} step {r.step_h} h")
            raise BadInputError(msg)
        seen_pl = sorted(set(idx.loc[idx.level > 0, "level"]))
        levels = tuple(sorted(expect.levels)) if expect.levels is not None else tuple(int(x) for x in seen_pl)
        plan = Plan(sorted(pd.Timestamp(t) for t in idx.init_time.unique()), expect.variables, levels,
                    tuple(range(1, expect.members + 1)), expect.steps_h, next(iter(grids.values())),
                    [str(f) for f in self.files])
        present = set(zip(idx["init_time"], idx["var"], idx["level"], idx["member"], idx["step_h"], strict=True))
        missing = [
            f"{t:%Y-%m-%d} {v}{'' if lv == 0 else f' {lv} hPa'} member {m} step {s} h "
            f"({grib.file_name('pl' if lv else 'sfc', t.month, t.day)})"
            for t in plan.init_times
            for v, lv in self._fields(plan)
            for m, s in itertools.product(plan.members, plan.steps_h)
            if (t, v, lv, m, s) not in present
        ]
        _raise_missing(missing, str(self.path))
        return plan

    @staticmethod
    def _fields(plan: Plan) -> list[tuple[str, int]]:
        out = []
        for v in plan.variables:
            pl = schema.VARIABLES[v].level_type is schema.LevelType.PRESSURE
            out += [(v, lv) for lv in plan.levels] if pl else [(v, 0)]
        return out

    def load(self, init_time: pd.Timestamp, plan: Plan) -> xr.Dataset:
        idx = self.index
        rows = idx[idx.init_time == init_time].set_index(["var", "level", "member", "step_h"]).sort_index()
        data = {}
        for v in plan.variables:
            pl = schema.VARIABLES[v].level_type is schema.LevelType.PRESSURE
            levels = plan.levels if pl else (0,)
            keys = list(itertools.product([v], levels, plan.members, plan.steps_h))
            sel = rows.loc[keys]
            arrays: list[np.ndarray] = []
            for f, part in sel.groupby("file", sort=False):
                arrays.append(grib.decode(str(f), zip(part.offset, part.length, strict=True), plan.grid.shape))
            order = np.concatenate([np.flatnonzero((sel.file == f).values) for f in sel.file.unique()])
            flat = np.empty((len(keys), *plan.grid.shape), dtype=np.float32)
            flat[order] = np.concatenate(arrays)
            # keys are (level, member, step): reorder to (member, step, level)
            arr = flat.reshape(len(levels), len(plan.members), len(plan.steps_h), *plan.grid.shape)
            arr = np.moveaxis(arr, 0, 2)[None]  # (1, member, step, level, lat, lon)
            data[v] = arr if pl else arr[:, :, :, 0]
        ds = _assemble(data, init_time, plan)
        check_values(ds, f"{self.path} {init_time:%Y-%m-%d}")
        return ds


def _assemble(data: dict[str, np.ndarray], init_time: pd.Timestamp, plan: Plan) -> xr.Dataset:

    coords = {
        schema.INIT_TIME: [init_time], schema.MEMBER: list(plan.members),
        schema.STEP: pd.to_timedelta(list(plan.steps_h), unit="h"), schema.LEVEL: list(plan.levels),
        schema.LAT: plan.grid.latitudes(), schema.LON: plan.grid.longitudes(),
    }
    out = {}
    for v, arr in data.items():
        var = schema.VARIABLES[v]
        dims = schema.PL_DIMS if var.level_type is schema.LevelType.PRESSURE else schema.SFC_DIMS
        out[v] = xr.Variable(dims, arr, schema.cf_attrs(var))
    return xr.Dataset(out, coords=coords)


# --- netCDF / zarr via xarray --------------------------------------------------------------------
@functools.lru_cache(maxsize=8)
def _open_normalised(paths: tuple[str, ...]) -> xr.Dataset:
    label = paths[0] if len(paths) == 1 else f"{Path(paths[0]).parent} ({len(paths)} files)"
    try:
        if paths[0].endswith(".zarr") or Path(paths[0], "zarr.json").exists():
            from postcast.datasets.io import open_zarr

            raw = open_zarr(paths[0], chunks=None)  # lazily indexed: a date reads only its chunks
        elif len(paths) == 1:
            raw = xr.open_dataset(paths[0], engine="netcdf4")
        else:
            raw = xr.open_mfdataset(list(paths), engine="netcdf4", combine="by_coords", chunks={})
    except (OSError, ValueError) as err:
        msg = f"{label}: cannot open ({err})"
        raise BadInputError(msg) from err
    return conventions.normalise(raw, source=label)


class XarraySource(ForecastSource):
    """Forecasts in netCDF files or a zarr store, in any convention :mod:`conventions` knows."""

    def __init__(self, paths: list[Path]):
        self.paths = tuple(str(p) for p in sorted(paths))
        self.path = Path(self.paths[0]) if len(self.paths) == 1 else Path(self.paths[0]).parent

    @property
    def dataset(self) -> xr.Dataset:
        return _open_normalised(self.paths)

    def plan(self, expect: Expectation) -> Plan:
        ds = self.dataset
        grid = schema.Grid.from_coords(ds[schema.LAT].values, ds[schema.LON].values)
        have_levels = [int(x) for x in ds[schema.LEVEL].values] if schema.LEVEL in ds.coords else []
        levels = tuple(sorted(expect.levels)) if expect.levels is not None else tuple(have_levels)
        members = tuple(range(1, expect.members + 1))
        have_members = set(int(m) for m in ds[schema.MEMBER].values) if schema.MEMBER in ds.coords else set()
        have_steps = {int(pd.Timedelta(s).total_seconds() // 3600) for s in ds[schema.STEP].values}
        missing = [f"variable {v}" for v in expect.variables if v not in ds.data_vars]
        missing += [f"level {lv} hPa" for lv in levels if lv not in have_levels]
        missing += [f"member {m}" for m in members if m not in have_members]
        missing += [f"step {s} h" for s in expect.steps_h if s not in have_steps]
        _raise_missing(missing, str(self.path))
        times = sorted(pd.Timestamp(t) for t in ds[schema.INIT_TIME].values)
        return Plan(times, expect.variables, levels, members, expect.steps_h, grid, list(self.paths))

    def load(self, init_time: pd.Timestamp, plan: Plan) -> xr.Dataset:
        ds = self.dataset[list(plan.variables)]
        sel: dict[str, Any] = {schema.INIT_TIME: [init_time], schema.MEMBER: list(plan.members),
                               schema.STEP: pd.to_timedelta(list(plan.steps_h), unit="h")}
        if plan.levels:
            sel[schema.LEVEL] = list(plan.levels)
        out = ds.sel(sel).load()
        out = out.drop_vars([c for c in out.coords if c not in out.dims])
        out = out.astype(np.float32)
        check_values(out, f"{self.path} {init_time:%Y-%m-%d}")
        return out

    def __getstate__(self) -> dict[str, Any]:
        return {"paths": self.paths, "path": self.path}


# --- truth / oracle ------------------------------------------------------------------------------
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
        out = out.load().astype(np.float32)
        out = out.drop_vars([c for c in out.coords if c not in out.dims])
        grid = schema.Grid.from_coords(out[schema.LAT].values, out[schema.LON].values)
        if grid != plan.grid:
            msg = f"{self.paths[0]}: truth on a {grid.resolution} deg grid, forecasts on {plan.grid.resolution} deg"
            raise BadInputError(msg)
        dims = (schema.INIT_TIME, schema.STEP, schema.LAT, schema.LON)
        return out.transpose(*dims)

    def coverage(self, plan: Plan) -> dict[str, list[str]]:
        """For each variable, the init times (ISO dates) lacking truth at the target step (48 h)."""
        ds = self.dataset
        target = pd.Timedelta(hours=schema.TARGET_STEP_H)
        if self.paired:
            have = {pd.Timestamp(t) for t in ds[schema.INIT_TIME].values}
            lacking = [t for t in plan.init_times if t not in have]
        else:
            have = {pd.Timestamp(t) for t in ds[schema.VALID_TIME].values}
            lacking = [t for t in plan.init_times if t + target not in have]
        return {v: [f"{t:%Y-%m-%d}" for t in lacking] for v in self.variables()}


def _select_existing(ds: xr.Dataset, wanted: dict[str, Any]) -> xr.Dataset:
    """``ds.reindex(wanted)`` that touches only the existing labels of a lazily indexed dataset."""
    pos = {d: pd.Index(ds[d].values).get_indexer(pd.Index(v)) for d, v in wanted.items()}
    have = {d: p[p >= 0] for d, p in pos.items()}
    part = ds.isel(have).load()
    return part.reindex({d: list(v) for d, v in wanted.items()})


@functools.lru_cache(maxsize=8)
def _open_truth(paths: tuple[str, ...], oracle: bool) -> xr.Dataset:
    from postcast.datasets.io import open_zarr

    try:
        if paths[0].endswith(".zarr"):
            raw = open_zarr(paths[0], chunks=None)
        else:
            raw = xr.merge([xr.open_dataset(p, engine="netcdf4", chunks={}) for p in paths],
                           compat="override", join="outer")
    except (OSError, ValueError) as err:
        msg = f"{paths[0]}: cannot open truth ({err})"
        raise BadInputError(msg) from err
    if oracle:
        names = [v for v in raw.data_vars if str(v).startswith("oracle_")]
        if not names:
            msg = f"{paths[0]}: no oracle_mean_* / oracle_std_* variables"
            raise BadInputError(msg)
        return conventions.normalise_oracle(raw[names], source=paths[0])
    return conventions.normalise_truth(raw, source=paths[0])


# --- discovery -----------------------------------------------------------------------------------
@dataclass
class Discovered:
    forecast: ForecastSource
    truth: TruthSource | None
    oracle: TruthSource | None


def _is_grib(p: Path) -> bool:
    if p.suffix in (".grib", ".grb", ".grib1", ".grb1"):
        return True
    return bool(p.name.startswith("output.") and p.suffix not in (".nc", ".idx", ".zarr", ".json"))


def discover(path: str | Path, *, truth: str | Path | None = None) -> Discovered:
    """Find the forecast, truth and oracle sources under ``path`` (a directory written by
    ``postcast synth``, a directory of ENS-10 GRIB/netCDF files, a zarr store or a single file)."""
    p = Path(path)
    if not p.exists():
        msg = f"{p}: no such file or directory"
        raise MissingInputError(msg)
    forecast: ForecastSource
    truth_paths: list[Path] = []
    oracle = None
    if p.is_dir() and not (p / "zarr.json").exists():
        gribs = sorted(q for q in p.iterdir() if q.is_file() and _is_grib(q))
        ncs = sorted(q for q in p.iterdir() if q.suffix == ".nc" and q.name.startswith("output."))
        if (p / "forecast.zarr").exists():
            forecast = XarraySource([p / "forecast.zarr"])
        elif gribs:
            forecast = GribSource(gribs)
        elif ncs:
            forecast = XarraySource(ncs)
        else:
            msg = (f"{p}: no forecasts found; expected ENS-10 GRIB files (output.pl.2018MMDD, "
                   "output.sfc.2018MMDD), output.*.nc files or forecast.zarr")
            raise MissingInputError(msg)
        if (p / "era5.zarr").exists():
            truth_paths = [p / "era5.zarr"]
        elif (p / "era5").is_dir():
            truth_paths = sorted((p / "era5").glob("*.nc"))
        if (p / "oracle.zarr").exists():
            oracle = TruthSource([p / "oracle.zarr"], oracle=True)
    elif (p / "zarr.json").exists() or p.suffix == ".nc":
        forecast = XarraySource([p])
    else:
        forecast = GribSource([p])
    if truth is not None:
        tp = Path(truth)
        if not tp.exists():
            msg = f"truth {tp}: no such file or directory"
            raise MissingInputError(msg)
        truth_paths = sorted(tp.glob("*.nc")) if tp.is_dir() and tp.suffix != ".zarr" else [tp]
    return Discovered(forecast, TruthSource(truth_paths) if truth_paths else None, oracle)
