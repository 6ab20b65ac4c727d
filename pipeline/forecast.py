"""Batch forecast: raw ensemble forecasts + a checkpoint -> calibrated, CF-compliant forecast files.

``postcast forecast --checkpoint C --input RAW --init-time T [--end T2] --out DIR`` reads the raw
ensemble for each init time with the ingestion code (GRIB, netCDF or zarr; conventions normalised,
values checked), builds the samples the checkpoint's sample spec declares (in physical units: the model normalises
them itself) and writes, per model, target and init time, one file

    DIR/<product>/<model>/<target>/<target>_<YYYYmmddTHH>.nc      (and/or .zarr)

``model`` is the forecast's name (``--name``; default: the checkpoint's model family), so the
products of two models never share a path.

holding the Gaussian mean and std, quantiles and probabilities of exceeding thresholds, with CF
metadata (forecast_reference_time, time, forecast_period, units, standard_name) and provenance
(checkpoint hash, code version, inputs). ``product`` is ``postprocessed``, or ``fallback_raw`` when
the model cannot run (the raw-ensemble Gaussian, flagged in the attributes). Writes are atomic; a
file that exists is kept (idempotent reruns) unless ``overwrite``.

Pure core: :func:`products` (mu, sigma -> CF dataset); drivers: :func:`forecast` and the CLI.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import xarray as xr
from scipy.special import ndtr, ndtri

import postcast
from postcast.datasets import io, schema, sources
from postcast.datasets import store as contract
from postcast.datasets.errors import ConfigError, MissingInputError
from postcast.datasets.ingest import ensemble_statistics
from postcast.datasets.loaders.datamodule import to_tensors
from postcast.datasets.sample import Sampler, SampleSpec
from postcast.models.module import PostProcessor, load_checkpoint

log = logging.getLogger(__name__)

POSTPROCESSED, FALLBACK = "postprocessed", "fallback_raw"
DEFAULT_QUANTILES = (0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95)
STANDARD_NAMES = {"z500": "geopotential", "t850": "air_temperature", "t2m": "air_temperature"}


@dataclass(frozen=True)
class ForecastConfig:
    checkpoint: str
    input: str
    out: str
    init_time: str  # first init time (ISO), inclusive
    end: str | None = None  # last init time, inclusive (None: just init_time)
    quantiles: tuple[float, ...] = DEFAULT_QUANTILES
    thresholds: tuple[float, ...] = ()  # in the target's units; none: none written
    formats: tuple[str, ...] = ("netcdf",)  # netcdf and/or zarr
    overwrite: bool = False
    name: str | None = None  # the model's name in the output paths (None: the checkpoint's model family)

    def __post_init__(self) -> None:
        if self.name is not None and (not self.name or "/" in self.name or self.name.startswith(".")):
            msg = f"name {self.name!r}: give a plain file-name part, e.g. unet_t850"
            raise ConfigError(msg)
        bad = [q for q in self.quantiles if not 0.0 < q < 1.0]
        if bad:
            msg = f"quantiles {bad}: each must be strictly between 0 and 1"
            raise ConfigError(msg)
        unknown = set(self.formats) - {"netcdf", "zarr"}
        if unknown or not self.formats:
            msg = f"formats {list(self.formats)}: use netcdf and/or zarr"
            raise ConfigError(msg)

    @property
    def window(self) -> tuple[pd.Timestamp, pd.Timestamp]:
        try:
            start = pd.Timestamp(self.init_time)
            end = pd.Timestamp(self.end) if self.end else start
        except ValueError as err:
            msg = f"init time {self.init_time!r} / end {self.end!r}: not a date (use e.g. 2017-01-02T00)"
            raise ConfigError(msg) from err
        if end < start:
            msg = f"--end {end} is before --init-time {start}"
            raise ConfigError(msg)
        return start, end


@dataclass
class ForecastResult:
    written: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    fallback: list[str] = field(default_factory=list)


def output_path(out: str | Path, product: str, model: str, target: str, init: pd.Timestamp, ext: str) -> Path:
    """``OUT/<product>/<model>/<target>/<target>_<YYYYmmddTHH>.<ext>``: one file per product, model,
    target and init time."""
    return Path(out) / product / model / target / f"{target}_{init:%Y%m%dT%H}.{ext}"


# --- pure core ---------------------------------------------------------------------------------
def products(mu: np.ndarray, sigma: np.ndarray, *, target: str, init: pd.Timestamp, step_h: int,
             lat: np.ndarray, lon: np.ndarray, quantiles: tuple[float, ...], thresholds: tuple[float, ...],
             attrs: dict[str, Any]) -> xr.Dataset:
    """The CF dataset of one Gaussian forecast (mu, sigma: (lat, lon), target units)."""
    tg = schema.TARGETS[target]
    q = np.asarray(quantiles, dtype=np.float64)
    thr = np.asarray(thresholds, dtype=np.float64)
    quant = mu[None] + sigma[None] * ndtri(q)[:, None, None]  # (Q, lat, lon), target units
    exceed = 1.0 - ndtr((thr[:, None, None] - mu[None]) / sigma[None])  # (T, lat, lon)
    dims = ("forecast_reference_time", schema.LAT, schema.LON)
    std_name = STANDARD_NAMES[target]
    ds = xr.Dataset(
        {
            f"{target}_mean": (dims, mu[None].astype(np.float32),
                               {"standard_name": std_name, "long_name": f"{target} predictive mean",
                                "units": tg.units}),
            f"{target}_std": (dims, sigma[None].astype(np.float32),
                              {"long_name": f"{target} predictive standard deviation", "units": tg.units}),
            f"{target}_quantile": (("quantile", "forecast_reference_time", schema.LAT, schema.LON),
                                   quant[:, None].astype(np.float32),
                                   {"standard_name": std_name, "long_name": f"{target} predictive quantiles",
                                    "units": tg.units}),
            f"{target}_exceedance_probability": (
                ("threshold", "forecast_reference_time", schema.LAT, schema.LON), exceed[:, None].astype(np.float32),
                {"long_name": f"probability that {target} exceeds the threshold", "units": "1",
                 "valid_min": np.float32(0.0), "valid_max": np.float32(1.0)}),
        },
        coords={
            "forecast_reference_time": ("forecast_reference_time", [init.to_datetime64()],
                                        {"standard_name": "forecast_reference_time"}),
            "time": ("forecast_reference_time", [(init + pd.Timedelta(hours=step_h)).to_datetime64()],
                     {"standard_name": "time", "long_name": "valid time"}),
            "forecast_period": ((), np.float64(step_h), {"standard_name": "forecast_period", "units": "hours"}),
            "quantile": ("quantile", q, {"long_name": "probability level of the quantile", "units": "1"}),
            "threshold": ("threshold", thr, {"long_name": f"{target} threshold", "units": tg.units}),
            schema.LAT: (schema.LAT, lat, {"standard_name": "latitude", "units": "degrees_north", "axis": "Y"}),
            schema.LON: (schema.LON, lon, {"standard_name": "longitude", "units": "degrees_east", "axis": "X"}),
        },
        attrs={"Conventions": "CF-1.8", "title": f"postcast calibrated forecast of {target}",
               "institution": "postcast", "source": f"postcast {postcast.__version__}",
               "history": f"{pd.Timestamp.now(tz='UTC'):%Y-%m-%dT%H:%M:%SZ} postcast forecast", **attrs},
    )
    if tg.level is not None:
        ds = ds.assign_coords(pressure=((), np.float64(tg.level), {"standard_name": "air_pressure", "units": "hPa",
                                                                    "positive": "down"}))
        for name in ds.data_vars:
            ds[name].attrs["coordinates"] = "time forecast_period pressure"
    else:
        for name in ds.data_vars:
            ds[name].attrs["coordinates"] = "time forecast_period"
    for name in ds.coords:
        ds[name].encoding["_FillValue"] = None  # CF 2.5.1: no fill values on coordinates
    for name in ("forecast_reference_time", "time"):
        ds[name].encoding.update(units="hours since 1970-01-01 00:00:00", calendar="proleptic_gregorian",
                                 dtype="float64")
    return ds


# --- drivers -----------------------------------------------------------------------------------
def _raw_day(source: sources.ForecastSource, plan: sources.Plan, init: pd.Timestamp) -> xr.Dataset:
    ds = source.load(init, plan)
    sources.check_values(ds, str(init))
    day = xr.merge([ds, ensemble_statistics(ds)])
    return day.isel({schema.INIT_TIME: 0}) if schema.INIT_TIME in day.dims else day


def _target_only_plan(plan: sources.Plan, spec: SampleSpec) -> sources.Plan:
    tg = schema.TARGETS[spec.target]
    return sources.Plan(plan.init_times, (tg.variable,), plan.levels, plan.members, plan.steps_h, plan.grid, plan.files)


@dataclass(frozen=True)
class _Run:
    """What every init time of one ``forecast`` call shares."""

    cfg: ForecastConfig
    model: PostProcessor
    sampler: Sampler
    source: sources.ForecastSource
    plan: sources.Plan
    name: str
    ckpt_hash: str
    reason: str  # why the model cannot run ("" when it can)


def forecast(cfg: ForecastConfig) -> ForecastResult:
    """Write the calibrated forecast for every init time of the window (see the module docstring)."""
    start, end = cfg.window
    model, meta = load_checkpoint(cfg.checkpoint)
    spec = SampleSpec.from_dict(meta["sample"])
    found = sources.discover(cfg.input)
    variables, levels = spec.raw_needs()
    tg = schema.TARGETS[spec.target]
    reason = ""
    try:
        plan = found.forecast.plan(sources.Expectation(variables=variables, levels=levels or None))
    except MissingInputError as err:  # the model cannot run: fall back to the raw ensemble of the target
        log.warning("inputs for the model are missing (%s); writing the raw-ensemble fallback", err)
        plan = found.forecast.plan(sources.Expectation(variables=(tg.variable,),
                                                       levels=(tg.level,) if tg.level else None))
        reason = str(err)
    inits = [t for t in plan.init_times if start <= t <= end]
    if not inits:
        msg = f"{cfg.input}: no init time between {start} and {end} (it has {len(plan.init_times)} dates)"
        raise MissingInputError(msg)
    run = _Run(cfg, model, Sampler(spec, plan.grid.latitudes(), plan.grid.longitudes()), found.forecast, plan,
               cfg.name or str(model.hparams["family"]), io.sha256_file(cfg.checkpoint), reason)
    result = ForecastResult()
    for init in inits:
        _one(run, init, result)
    return result


def _one(run: _Run, init: pd.Timestamp, result: ForecastResult) -> None:
    cfg, spec = run.cfg, run.sampler.spec
    exts = [{"netcdf": "nc", "zarr": "zarr"}[f] for f in cfg.formats]
    paths = {p: [output_path(cfg.out, p, run.name, spec.target, init, e) for e in exts]
             for p in (POSTPROCESSED, FALLBACK)}
    if not cfg.overwrite and any(all(q.exists() for q in qs) for qs in paths.values()):
        result.skipped += [str(q) for qs in paths.values() for q in qs if q.exists()]
        return
    t0 = time.perf_counter()
    day = _raw_day(run.source, run.plan if not run.reason else _target_only_plan(run.plan, spec), init)
    product, reason = (FALLBACK, run.reason) if run.reason else (POSTPROCESSED, "")
    if not run.reason:
        with torch.no_grad():
            batch = {k: v[None] for k, v in to_tensors(run.sampler.sample(day)).items()}
            mu_t, sigma_t = run.model(batch)  # physical inputs in, (mu, sigma) out: the model normalises
        mu, sigma = mu_t[0].double().numpy(), sigma_t[0].double().numpy()
        if not (np.isfinite(mu).all() and np.isfinite(sigma).all()):
            product, reason = FALLBACK, "the model produced non-finite values"
    if product == FALLBACK:
        variable = schema.TARGETS[spec.target].variable
        mu = spec.select(day[contract.ens_mean(variable)]).astype(np.float64)
        sigma = np.maximum(spec.select(day[contract.ens_std(variable)]).astype(np.float64), 1e-6)
    attrs = {"product": product, "postcast_fallback": int(product == FALLBACK), "model_name": run.name,
             "checkpoint": str(cfg.checkpoint), "checkpoint_sha256": run.ckpt_hash,
             "model": str(run.model.hparams["family"]), "inputs": str(cfg.input),
             "comment": reason or "post-processed with the checkpoint's model"}
    ds = products(mu, sigma, target=spec.target, init=init, step_h=spec.step_h, lat=run.sampler.lat,
                  lon=run.sampler.lon, quantiles=cfg.quantiles, thresholds=cfg.thresholds, attrs=attrs)
    for path in paths[product]:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".nc":
            io.write_netcdf(ds, path)
        else:
            with io.atomic_path(path) as tmp:
                io.write_zarr(ds, tmp)
        result.written.append(str(path))
        if product == FALLBACK:
            result.fallback.append(str(path))
    log.info("%s %s %s: %s in %.2f s", run.name, spec.target, init, product, time.perf_counter() - t0)
