"""Batch forecast: raw ensemble forecasts + a checkpoint -> calibrated, CF-compliant forecast files.

``postcast forecast --checkpoint C --input RAW --init-time T [--end T2] --out DIR`` reads the raw
ensemble for each init time with the ingestion code (GRIB, netCDF or zarr; conventions normalised,
values checked), builds the samples the checkpoint's sample spec declares (in physical units: the model normalises
them itself) and writes, per model, target and init time, one file

    DIR/<product>/<model>/<target>/<target>_<YYYYmmddTHH>.nc      (and/or .zarr)

``model`` is the forecast's name (``--name``; default: the checkpoint's model family), so the
products of two models never share a path.

holding the predictive law of the checkpoint's family (``model.distribution``: its name, its
parameters, its mean and std in closed form, its quantiles and probabilities of exceeding thresholds,
all by the law of :mod:`postcast.datasets.laws`), with CF metadata
(forecast_reference_time, time, forecast_period, units, standard_name) and provenance (checkpoint
hash, code version, inputs). ``product`` is ``postprocessed``, or ``fallback_raw`` when the model
cannot run (the raw ensemble's own law in the target's family, :func:`fallback_law`, flagged in the
attributes). A derived target (ws10, tp24) is read as the variables it is computed from at the leads it
needs (tp24: +24 and +48 h), its fallback is taken over its derived members, and its default thresholds
are its own. Writes are atomic; a file that
exists is kept (idempotent reruns) unless ``overwrite``.

The layout, the CF content (:func:`products`: mean, std and the law -> CF dataset) and the atomic
writes are the archive's contract, ``pipeline/products/archive.py``, which ``postcast serve`` reads with;
drivers here: :func:`forecast` and the CLI.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import xarray as xr

from postcast.datasets import laws, schema, sources
from postcast.datasets.core import checksums
from postcast.datasets.core.cluster import client_for, in_order
from postcast.datasets.core.errors import BadInputError, ConfigError, MissingInputError
from postcast.datasets.loaders.datamodule import to_tensors
from postcast.datasets.sample import Sampler, SampleSpec
from postcast.datasets.sources import regrid
from postcast.datasets.statistics import ensemble_statistics
from postcast.models import distributions, losses
from postcast.models.module import PostProcessor
from postcast.pipeline.checkpoints import one_thread, open_checkpoint
from postcast.pipeline.forecast_grids import model_grid, output_grid, regrid_params
from postcast.pipeline.products.archive import (
    DEFAULT_QUANTILES,
    EXTENSIONS,
    FALLBACK,
    POSTPROCESSED,
    product_identity,
    product_path,
    write_product,
)
from postcast.pipeline.products.content import CLIMATE, GIVEN, OWN, Law, products

log = logging.getLogger(__name__)
Params = dict[str, np.ndarray]  # a family's parameters by name, (lat, lon) each (Bernstein's coef: (K, lat, lon))


@dataclass(frozen=True)
class ForecastConfig:
    checkpoint: str
    input: str
    out: str
    init_time: str  # first init time (ISO), inclusive
    end: str | None = None  # last init time, inclusive (None: just init_time)
    quantiles: tuple[float, ...] = DEFAULT_QUANTILES
    thresholds: tuple[float, ...] = ()  # in the target's units; none: the checkpoint's (training-truth quantiles)
    formats: tuple[str, ...] = ("netcdf",)  # netcdf and/or zarr
    overwrite: bool = False
    name: str | None = None  # the model's name in the output paths (None: the checkpoint's model family)
    regrid_method: str = "bilinear"  # inputs on another grid than the checkpoint's: bilinear | nearest | conservative
    on_input_grid: bool = False  # write on the input's regular grid (cut to a regional checkpoint's area)
    scheduler: str | None = None  # dask scheduler address or file (None: a LocalCluster, or this process)
    workers: int | None = None  # LocalCluster workers (0: this process; None: 2, or 0 for a few init times)
    processes: bool = True  # the LocalCluster's workers as processes (False: threads of this process)

    def __post_init__(self) -> None:
        name = self.name
        odd = name is not None and (set(name) & set("/\\") or not name.isprintable() or name.startswith("."))
        if name is not None and (odd or not 0 < len(name) <= 100):
            shown = f"{name[:40]!r}{'...' * (len(name) > 40)}"
            msg = f"name {shown}: give a plain file-name part (1-100 characters, no / or \\), e.g. unet_t850"
            raise ConfigError(msg)
        bad = [q for q in self.quantiles if not 0.0 < q < 1.0]
        if bad:
            msg = f"quantiles {bad}: each must be strictly between 0 and 1"
            raise ConfigError(msg)
        for name, values in (("quantiles", self.quantiles), ("thresholds", self.thresholds)):
            if not all(math.isfinite(v) for v in values):
                msg = f"--{name} {list(values)}: give finite numbers"
                raise ConfigError(msg)
            if len(set(values)) != len(values):
                msg = f"--{name} {list(values)}: give each value once"
                raise ConfigError(msg)
        unknown = set(self.formats) - {"netcdf", "zarr"}
        if unknown or not self.formats:
            msg = f"formats {list(self.formats)}: use netcdf and/or zarr"
            raise ConfigError(msg)
        if self.workers is not None and self.workers < 0:
            msg = f"--workers {self.workers}: give 0 (forecast in this process) or a positive number"
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


# --- drivers -----------------------------------------------------------------------------------
def _raw_day(source: sources.ForecastSource, plan: sources.Plan, init: pd.Timestamp, name: str) -> xr.Dataset:
    """The raw ensemble of ``init`` with its mean and std. The plan lists ``init``, so fields missing
    on that date are a damaged input (65), not a missing one."""
    try:
        ds = source.load(init, plan)  # checked by the source (sources.check_values)
    except MissingInputError as err:
        msg = (
            f"{name}: the fields of init time {init.isoformat()} are incomplete although the input lists that "
            "date (a damaged or partly written input): check it (`postcast inspect --verify` for a store) and "
            "rewrite it, or leave that date out with --init-time/--end"
        )
        raise BadInputError(msg) from err
    day = xr.merge([ds, ensemble_statistics(ds)])
    return day.isel({schema.INIT_TIME: 0}) if schema.INIT_TIME in day.dims else day


def _leads(spec: SampleSpec) -> tuple[int, ...]:
    """The leads (h) a sample reads: the spec's, and those a derived target is computed from (tp24 at +48 h:
    +24 and +48 h)."""
    offsets = {0, *(off for _, off in spec.resolved_target.inputs)}
    return tuple(sorted(spec.step_h + off for off in offsets))


def _expectation(model: PostProcessor, spec: SampleSpec, method: str) -> sources.Expectation:
    """What the checkpoint reads: its leads (:func:`_leads`), on its own grid (inputs on other grids are
    regridded), its member count when the model reads the members (the first N), else every member."""
    members: str | int = model.meta.n_members if spec.members else "all"
    return sources.Expectation(members=members, steps_h=_leads(spec), method=method, exact_grid=model_grid(model))


def _fallback_reason(source: sources.ForecastSource, expect: sources.Expectation, variables: tuple[str, ...]) -> str:
    """Why the model cannot run on this input, in forecast's terms (its options are --input and --checkpoint)."""
    try:
        have = source.plan(replace(expect, variables=None, levels=None, members="all")).variables
    except MissingInputError:
        have = ()
    lacking = [v for v in variables if v not in have]
    what = f"the variables {', '.join(lacking)}" if lacking else "levels, members or the lead time the model reads"
    return (
        f"the input is missing {what} (it has {', '.join(have) or 'none of them'}): give --input a source "
        "that has them, or a --checkpoint trained without them"
    )


def _target_expectation(expect: sources.Expectation, tg: schema.Target) -> sources.Expectation:
    """What the raw fallback reads: the variables the target is read or derived from, every member."""
    return replace(expect, variables=tg.input_variables, levels=(tg.level,) if tg.level else None, members="all")


def _check_lead(source: sources.ForecastSource, expect: sources.Expectation, spec: SampleSpec) -> None:
    """An input without the checkpoint's leads has no forecast to make, not even the raw fallback: say so
    in forecast's terms (the lead is the checkpoint's, not an option of this verb)."""
    tg, need = spec.resolved_target, _leads(spec)
    try:
        held = source.plan(replace(_target_expectation(expect, tg), steps_h=None)).steps_h
    except MissingInputError:
        return  # the target's variables themselves are missing: the fallback's planning names them
    lacking = [h for h in need if h not in held]
    if lacking:
        offsets = [h - spec.step_h for h in need]
        usable = [h for h in held if all(h + off in held for off in offsets)]  # the leads it could predict
        have, needs = ", ".join(f"+{h}" for h in held), ", ".join(f"+{h}" for h in lacking)
        derived = f" from {', '.join(f'+{h}' for h in need)} h" if len(need) > 1 else ""
        train = f" (train with --data.cfg.sample.step_h {usable[-1]})" if usable else ""
        msg = (
            f"this checkpoint predicts {spec.target} at +{spec.step_h} h{derived}; the input {source.path} holds "
            f"{have} h: give --input forecasts at {needs} h, or a --checkpoint trained at a lead it holds{train}"
        )
        raise MissingInputError(msg)


def _target_only_plan(plan: sources.Plan, spec: SampleSpec) -> sources.Plan:
    return replace(plan, variables=spec.resolved_target.input_variables)


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
    thresholds: tuple[float, ...]  # --thresholds, else the checkpoint's climatological defaults
    threshold_source: str  # where they come from (content.THRESHOLD_SOURCES)


def _prepare(cfg: ForecastConfig) -> tuple[_Run, list[pd.Timestamp]]:
    """What every init time shares (the checkpoint, the input's plan) and the init times of the window."""
    start, end = cfg.window
    model, meta = open_checkpoint(cfg.checkpoint)
    spec = SampleSpec.from_dict(meta["sample"])
    found = sources.discover(cfg.input)
    variables, levels = spec.raw_needs()
    tg = spec.resolved_target
    reason = ""
    expect = _expectation(model, spec, cfg.regrid_method)
    try:
        plan = found.forecast.plan(replace(expect, variables=variables, levels=levels or None))
    except MissingInputError:  # the model cannot run: fall back to the raw ensemble of the target
        _check_lead(found.forecast, expect, spec)
        plan = found.forecast.plan(_target_expectation(expect, tg))
        reason = _fallback_reason(found.forecast, expect, variables)
        log.warning("%s; writing the raw-ensemble fallback", reason)
    inits = [t for t in plan.init_times if start <= t <= end]
    if not inits:
        msg = f"{cfg.input}: no init time between {start} and {end} (it has {len(plan.init_times)} dates)"
        raise MissingInputError(msg)
    run = _Run(
        cfg,
        model,
        Sampler(spec, plan.grid.latitudes(), plan.grid.longitudes()),
        found.forecast,
        plan,
        cfg.name or model.meta.network,
        checksums.sha256_file(cfg.checkpoint),
        reason,
        cfg.thresholds or tuple(meta.get("thresholds") or tg.thresholds),
        GIVEN if cfg.thresholds else OWN if tg.thresholds else CLIMATE,
    )
    return run, inits


@functools.lru_cache(maxsize=1)
def _worker_run(cfg: ForecastConfig) -> tuple[_Run, list[pd.Timestamp]]:
    """:func:`_prepare` once per worker process and forecast call (its config)."""
    return _prepare(cfg)


def _forecast_date(cfg: ForecastConfig, k: int) -> ForecastResult:
    """The task of one init time on a worker: the ``k``-th of the window."""
    run, inits = _worker_run(cfg)
    result = ForecastResult()
    _one(run, inits[k], result)
    return result


def forecast(cfg: ForecastConfig) -> ForecastResult:
    """Write the calibrated forecast for every init time of the window (see the module docstring): here, or
    one task per init time on a dask cluster (:func:`cluster_for`), the results gathered in date order."""
    run, inits = _prepare(cfg)
    result = ForecastResult()
    with cluster_for(cfg, len(inits)) as client:
        if client is None:
            for init in inits:
                _one(run, init, result)
            return result
        for part in in_order(client, _forecast_date, cfg, len(inits)):
            for name in ("written", "skipped", "fallback"):
                getattr(result, name).extend(getattr(part, name))
    return result


SMALL_RANGE_DATES = 8  # init times forecast in this process by default


@contextlib.contextmanager
def cluster_for(cfg: ForecastConfig, n_dates: int) -> Iterator[Any | None]:
    """The dask client the init times run on: the scheduler given, else a LocalCluster of ``workers``
    (default 2, or none for at most SMALL_RANGE_DATES init times); None: this process."""
    workers = cfg.workers if cfg.workers is not None else (0 if n_dates <= SMALL_RANGE_DATES else 2)
    with client_for(cfg.scheduler, workers, cfg.processes) as client:
        yield client


def _current(path: Path, run: _Run) -> bool:
    """Whether an existing product is what this run would write: made by the same checkpoint (by
    content) from the same input, with the same quantile levels and thresholds. A stale one is said and
    rebuilt (idempotence by content, not by name)."""
    if not path.exists():
        return False
    have = product_identity(path)
    want = {
        "checkpoint_sha256": run.ckpt_hash,
        "inputs": str(run.cfg.input),
        "quantiles": [float(q) for q in run.cfg.quantiles],
        "thresholds": [float(t) for t in run.thresholds],
    }
    differs = [k for k in want if have.get(k) != want[k]]
    if differs:
        log.warning("%s: made with another %s; rebuilding it", path, " and ".join(differs))
    return not differs


def _predict(run: _Run, day: xr.Dataset) -> Params:
    """The model's predictive law on ``day``: its family's parameters, float64, (lat, lon) [coef (K, lat, lon)]."""
    with torch.no_grad(), one_thread():  # the same bits in this process and on any worker (checkpoints.one_thread)
        batch = {k: v[None] for k, v in to_tensors(run.sampler.sample(day)).items()}
        dist = run.model.predictive(batch)  # physical inputs in, parameters (1, H, W) [(1, H, W, K)] out
    return {
        k: np.moveaxis(v[0].double().numpy(), -1, 0) if v.ndim == 4 else v[0].double().numpy()
        for k, v in dist.params.items()
    }


def fallback_law(target: schema.Target, raw: dict[str, np.ndarray]) -> tuple[str, Params]:
    """The raw ensemble's own law when the model cannot run: the target's family (``schema.TARGETS``) through
    the shared head at zero outputs, from the members' mean ``m`` and std ``s`` (H, W; a derived target's over
    its derived members): the Gaussian N(m, s^2) for z500/t850/t2m, a normal truncated at 0 for ws10, a
    censored shifted gamma for tp24, so a bounded target's fallback never gives a negative quantile."""
    family = target.family
    m, s = (torch.from_numpy(raw[k].astype(np.float64)) for k in ("m", "s"))  # (H, W) target units
    zeros = [torch.zeros_like(m)] * distributions.get(family).n_raw
    dist = losses.distribution_head(zeros, m, s, family)  # s floored at 1e-6: identical members
    return family, {k: v.numpy() for k, v in dist.params.items()}  # (H, W) each


def target_members(sampler: Sampler, day: xr.Dataset) -> np.ndarray | None:
    """The raw ensemble's members of the target (M, H, W) float64 in its units: a derived target's as derived
    from its fields (ws10, tp24), a variable target's as read; None when the input holds no such field."""
    spec, tg = sampler.spec, sampler.spec.resolved_target
    if tg.derived:
        return sampler.derived_members(day)
    return spec.select(day[tg.variable]).astype(np.float64) if tg.variable in day else None


def _law_of_day(run: _Run, day: xr.Dataset, init: pd.Timestamp) -> tuple[str, str, str, Params]:
    """(product, why it is a fallback, family, parameters (lat, lon) each) of the raw forecast ``day``: the
    checkpoint's law, else (no model for this input, or non-finite values) the raw ensemble's fallback law."""
    product, reason = (FALLBACK, run.reason) if run.reason else (POSTPROCESSED, "")
    family, params = run.model.meta.family, {}
    if not run.reason:
        params = _predict(run, day)
        if not all(np.isfinite(v).all() for v in params.values()):
            product, reason = FALLBACK, "the model produced non-finite values"
            log.warning("%s %s: %s (NaN weights?); writing the raw-ensemble fallback", run.cfg.checkpoint, init, reason)
    if product == FALLBACK:
        family, params = fallback_law(run.sampler.spec.resolved_target, run.sampler.target_statistics(day))
    return product, reason, family, params


def _file_attrs(run: _Run, product: str, reason: str) -> dict[str, Any]:
    """The file's attributes: which product, from which checkpoint and inputs, and why a fallback is one."""
    return {
        "product": product,
        "postcast_fallback": int(product == FALLBACK),
        "model_name": run.name,
        "checkpoint": str(run.cfg.checkpoint),
        "checkpoint_sha256": run.ckpt_hash,
        "model": run.model.meta.network,
        "inputs": str(run.cfg.input),
        "comment": reason or "post-processed with the checkpoint's model",
        "n_members": len(run.plan.members),
        "threshold_source": run.threshold_source,
        **run.plan.regridding,
    }


def _one(run: _Run, init: pd.Timestamp, result: ForecastResult) -> None:
    cfg, spec = run.cfg, run.sampler.spec
    exts = [EXTENSIONS[f] for f in cfg.formats]
    paths = {
        p: [product_path(cfg.out, p, run.name, spec.target, init, e) for e in exts] for p in (POSTPROCESSED, FALLBACK)
    }
    if not cfg.overwrite and any(all(_current(q, run) for q in qs) for qs in paths.values()):
        result.skipped += [str(q) for qs in paths.values() for q in qs if q.exists()]
        return
    t0 = time.perf_counter()
    day = _raw_day(run.source, run.plan if not run.reason else _target_only_plan(run.plan, spec), init, str(cfg.input))
    product, reason, family, params = _law_of_day(run, day, init)
    attrs = _file_attrs(run, product, reason)
    lat, lon = run.sampler.lat, run.sampler.lon
    members = target_members(run.sampler, day)  # (M, H, W) target units, shown beside the law
    if cfg.on_input_grid and run.plan.source_grid is not None:  # back from the checkpoint's grid
        back = output_grid(run.plan, run.model)
        src = regrid.SourceGrid.regular(lat, lon)
        params = {k: regrid_params(v, src, back, cfg.regrid_method) for k, v in params.items()}
        members = None if members is None else regrid_params(members, src, back, cfg.regrid_method)
        lat, lon = back.latitudes(), back.longitudes()
        attrs["output_grid"] = "input"
    mean, std = laws.get(family).moments(params)
    ds = products(
        mean,
        std,
        target=spec.resolved_target,
        init=init,
        step_h=spec.step_h,
        lat=lat,
        lon=lon,
        quantiles=cfg.quantiles,
        thresholds=run.thresholds,
        attrs=attrs,
        law=Law.of(family, params, cfg.quantiles, run.thresholds),
        members=members,
    )
    for path in paths[product]:
        write_product(ds, path)  # atomic; the layout is the archive's contract (pipeline/products/archive.py)
        result.written.append(str(path))
        if product == FALLBACK:
            result.fallback.append(str(path))
    log.info("%s %s %s: %s in %.2f s", run.name, spec.target, init, product, time.perf_counter() - t0)
