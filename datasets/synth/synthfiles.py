"""Write synthetic ENS-10 in the on-disk forms real users have (driver of ``postcast synth``).

``format="zarr"`` (default)::

    OUT/forecast.zarr   forecasts, ENS-10/cfgrib conventions (number, time, step, isobaricInhPa,
                        latitude north -> south)
    OUT/era5.zarr       truth for every step, paired with the forecasts (time x step)
    OUT/oracle.zarr     oracle_mean_<target>, oracle_std_<target> (the true predictive law)
    OUT/synth.json      configuration and file list

``format="grib"`` / ``"netcdf"``: the ENS-10 file set instead of forecast.zarr,
``output.pl.2018MMDD`` and ``output.sfc.2018MMDD`` (GRIB1 written with eccodes; ``.nc`` suffix for
netCDF), and ERA5-like netCDF at the 48 h valid dates only (``era5/ERA5_z500.nc``,
``ERA5_t850.nc``, ``ERA5_sfc_t2m.nc``, as the ENS-10 baselines use), plus oracle.zarr.

Every file is written atomically and skipped when it already exists, so an interrupted run resumes.
"""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path
from typing import Any

import dask
import numpy as np
import pandas as pd
import xarray as xr

from postcast.datasets import contract, io, schema
from postcast.datasets.sources import conventions
from postcast.datasets.sources import messages as grib
from postcast.datasets.synth import synthetic
from postcast.datasets.synth.synthetic import SynthConfig

log = logging.getLogger(__name__)


def _zarr_chunks(ds: xr.Dataset) -> dict[str, tuple[int, ...]]:
    whole = ("number", schema.MEMBER, schema.LAT, schema.LON)
    grow = ("isobaricInhPa", schema.LEVEL, schema.STEP)
    return {
        str(n): io.chunk_shape(tuple(map(str, v.dims)), v.shape, whole=whole, grow=grow)
        for n, v in ds.data_vars.items()
    }


def progress_bar(enabled: bool) -> Any:
    """A tqdm progress bar over dask tasks (a no-op context when disabled)."""
    if not enabled:
        return contextlib.nullcontext()
    from tqdm.dask import TqdmCallback

    return TqdmCallback(desc="tasks", mininterval=1.0)


def _write_zarr_once(ds: xr.Dataset, path: Path, progress: bool) -> bool:
    if path.exists():
        log.info("%s exists: skipped", path)
        return False
    log.info("writing %s", path)
    with io.atomic_path(path) as tmp, progress_bar(progress):
        io.write_zarr(ds, tmp, chunks=_zarr_chunks(ds))
    return True


def _era5_valid_time(truth: xr.Dataset, target: schema.Target) -> xr.Dataset:
    """48 h truth of one target indexed by valid time, ERA5-style (latitude north -> south)."""
    da = truth[contract.truth_name(target.name)].sel({schema.STEP: pd.Timedelta(hours=schema.TARGET_STEP_H)})
    da = da.drop_vars([schema.STEP, schema.VALID_TIME], errors="ignore")
    valid = da[schema.INIT_TIME].values + np.timedelta64(schema.TARGET_STEP_H, "h")
    da = da.assign_coords({schema.INIT_TIME: valid}).rename({schema.INIT_TIME: "time"})
    tg = target
    attrs = {"units": tg.units, "long_name": tg.name} if tg.derived else schema.cf_attrs(schema.VARIABLES[tg.variable])
    da.attrs = {**attrs, "long_name": f"ERA5-like {attrs['long_name']}"}
    if tg.level is not None:  # cdo-style pressure coordinate in Pa, as in ENS-10's ERA5_z500.nc
        da = da.expand_dims(plev=[tg.level * 100.0], axis=1)
        da["plev"].attrs = {"units": "Pa", "standard_name": "air_pressure"}
    ds = da.to_dataset(name=tg.variable).isel(latitude=slice(None, None, -1))
    ds.attrs = {"Conventions": "CF-1.7", "title": f"postcast synthetic ERA5-like {tg.name} at 48 h valid dates"}
    return ds


def _write_file_set(cfg: SynthConfig, fc: xr.Dataset, out: Path, progress: bool) -> list[str]:
    """ENS-10 files, one pair per month-day, generated and written in parallel by dask tasks."""
    tasks, names = [], []
    for month, day in cfg.month_days:
        times = [t for t in cfg.init_times if (t.month, t.day) == (month, day)]
        sub = fc.sel({schema.INIT_TIME: times})
        for kind in _kinds(fc):
            name = grib.file_name(kind, month, day) + (".nc" if cfg.format == "netcdf" else "")
            names.append(name)
            if (out / name).exists():
                continue
            tasks.append(dask.delayed(_write_one)(sub, out / name, kind, cfg.format))
    if tasks:
        log.info("writing %d %s files", len(tasks), cfg.format)
        with progress_bar(progress):
            dask.compute(*tasks, scheduler="processes", num_workers=None)
    return names


def _kinds(fc: xr.Dataset) -> list[str]:
    """The file kinds (``pl``, ``sfc``) that have variables in ``fc``."""
    types = {schema.VARIABLES[str(n)].level_type for n in fc.data_vars}
    return [k for k, t in (("pl", schema.LevelType.PRESSURE), ("sfc", schema.LevelType.SURFACE)) if t in types]


def _write_one(sub: xr.Dataset, path: Path, kind: str, fmt: str) -> None:
    with dask.config.set(scheduler="synchronous"):
        if fmt == "grib":
            grib.write_file(sub, path, kind)
        else:
            want = schema.LevelType.PRESSURE if kind == "pl" else schema.LevelType.SURFACE
            names = [n for n in sub.data_vars if schema.VARIABLES[str(n)].level_type is want]
            io.write_netcdf(conventions.to_ens10(sub[names]).load(), path)


def write_synthetic(cfg: SynthConfig, out: str | Path, *, progress: bool = True) -> dict[str, Any]:
    """Generate and write the synthetic dataset; returns the manifest (also in OUT/synth.json)."""
    start = time.perf_counter()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / "synth.json"
    fc = synthetic.forecast_dataset(cfg)
    truth = synthetic.truth_dataset(cfg)
    files: list[str] = []
    if cfg.format == "zarr":
        _write_zarr_once(conventions.to_ens10(fc), out / "forecast.zarr", progress)
        files.append("forecast.zarr")
        era5 = truth[[contract.truth_name(t) for t in cfg.targets]].rename({schema.INIT_TIME: "time"})
        _write_zarr_once(era5.isel(latitude=slice(None, None, -1)), out / "era5.zarr", progress)
        files.append("era5.zarr")
    else:
        files += _write_file_set(cfg, fc, out, progress)
        for tg in map(schema.target, cfg.targets):
            level = "sfc_" if tg.level is None else ""
            path = out / "era5" / f"ERA5_{level}{tg.name}.nc"
            files.append(str(path.relative_to(out)))
            if not path.exists():
                io.write_netcdf(_era5_valid_time(truth, tg).load(), path)
    oracle = truth[[n for n in truth.data_vars if str(n).startswith("oracle_")]]
    _write_zarr_once(oracle, out / "oracle.zarr", progress)
    files.append("oracle.zarr")
    manifest = {
        "postcast_synthetic_version": synthetic.FORMAT_VERSION,
        "config": cfg.to_dict(),
        "files": files,
        "n_init_times": len(cfg.init_times),
        "grid": list(cfg.grid.shape),
        "seconds": round(time.perf_counter() - start, 2),
    }
    io.write_json(manifest_path, manifest)
    return manifest
