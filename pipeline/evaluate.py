"""Evaluation: score the raw ensemble, trained post-processors and the oracle side by side.

Pure core: :func:`verification_dataset` gathers, for one target, lead and split, the truth, the raw
members and the Gaussian forecasts of every entry (dims ``forecast, init_time, latitude,
longitude``); a checkpoint of another predictive family (``model.distribution``) joins as a
:class:`FamilyForecast` beside it; :func:`score_lead` turns them into a results Dataset (metrics and regions of
:mod:`postcast.pipeline.verification`, significance of :mod:`postcast.pipeline.significance`),
:func:`score_target` stacks every lead with truth, :func:`summary` is its JSON summary. Drivers:
:func:`evaluate` (checkpoints + store -> ``results.nc``, ``metrics.json`` and the report, see
:mod:`postcast.pipeline.report`) and ``postcast evaluate``.

Conventions (docs/verification.md): CRPS and EECRPS unweighted (ENS-10) and area-weighted
(WeatherBench 2: sum_t sum_p w_p s_tp / (T sum_p w_p)); EFI from the forecasts' own model climate
(members of the init dates within the ENS-10 climate window); ``gap_closed`` = (CRPS_raw - CRPS) /
(CRPS_raw - CRPS_oracle); differences against the raw Gaussian tested per init date (Diebold-Mariano
with HAC variance, stationary bootstrap interval).

Bad inputs are one line each: a chunk of the target's arrays deleted after ingest (66) or of another
size (65) is named before scoring (:func:`postcast.datasets.reads.check_chunks`), one that does not
decode when the read fails (65); a checkpoint that does not fit the store (another grid or region,
inputs the store lacks, another ensemble size) names what differs (65: the two inputs disagree).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import xarray as xr

from postcast.datasets import contract, io, reads, schema
from postcast.datasets.core.errors import BadInputError, ConfigError, MissingInputError, PostcastError
from postcast.datasets.loaders.datamodule import DataConfig, StoreDataset
from postcast.datasets.sample import SampleSpec
from postcast.models import distributions
from postcast.models.module import load_checkpoint
from postcast.pipeline import forecast, metrics, significance, verification

log = logging.getLogger(__name__)

RAW, ORACLE, ENSEMBLE = "raw", "oracle", "raw_ensemble"
ENSEMBLE_KEYS = {"crps": "crps_fair"}  # metrics.json names the members' fair CRPS beside crps_standard


@dataclass(frozen=True)
class EvalConfig:
    store: str
    checkpoints: tuple[str, ...] = ()
    targets: tuple[str, ...] | None = None  # None: the checkpoints' targets, else those the store has truth for
    split: str = "test"
    out: str = "reports/eval"
    bootstrap: int = 1000
    names: dict[str, str] = field(default_factory=dict)  # checkpoint path -> display name

    def __post_init__(self) -> None:
        if self.split not in contract.SPLITS:
            msg = f"split {self.split!r}: use one of {list(contract.SPLITS)}"
            raise ConfigError(msg)
        if self.bootstrap < 1:
            msg = (f"--bootstrap {self.bootstrap}: the 95 % interval needs resamples: give a positive number "
                   "(default 1000; a few hundred at least for a stable interval)")
            raise ConfigError(msg)
        for t in self.targets or ():
            if t not in schema.TARGETS:
                msg = f"target {t!r}: use one of {list(schema.TARGETS)}"
                raise ConfigError(msg)


# --- gathering forecasts ----------------------------------------------------------------------
def _step(ds: xr.Dataset, name: str, step_h: int, level: int | None) -> xr.DataArray:
    da = ds[name].sel({schema.STEP: pd.Timedelta(hours=step_h)})
    if schema.LEVEL in da.dims:
        da = da.sel({schema.LEVEL: level})
    return da


def target_members(ds: xr.Dataset, target: str, step_h: int) -> xr.DataArray:
    """The members (init_time, member, lat, lon) of ``target`` at the lead: a variable's, or a derived
    target's computed per member from its inputs (ws10 from u10/v10; tp24 from tp at the lead and 24 h before)."""
    tg = schema.TARGETS[target]
    if not tg.derived:
        return _step(ds, tg.variable, step_h, tg.level)
    first = _step(ds, tg.inputs[0][0], step_h + tg.inputs[0][1], None)
    values = tg.members(lambda v, off: np.asarray(_step(ds, v, step_h + off, None).values, dtype=np.float64))
    return first.drop_vars(schema.STEP).copy(data=values).rename(target)


def baseline(target: str) -> str:
    """The forecast the others are measured against: the raw ensemble's Gaussian (mean, std) for a Gaussian
    target (ENS-10's convention), the members themselves (fair CRPS) for any other family's target."""
    return RAW if schema.TARGETS[target].family == distributions.Gaussian.name else ENSEMBLE


def verification_dataset(store: xr.Dataset, target: str, split: str, step_h: int = schema.TARGET_STEP_H
                         ) -> xr.Dataset:
    """Truth, raw members, the raw ensemble's Gaussian (its members' mean and population std) and a
    Gaussian oracle's of ``target`` on one split; another family's oracle parameters as ``oracle_<param>``."""
    tg = schema.TARGETS[target]
    truth = _step(store, contract.truth_name(target), step_h, tg.level)
    rows = contract.split_rows(store, split, target=target, step_h=step_h)
    if not rows.size:
        msg = f"no init date with truth for {target} at +{step_h} h in split {split!r}"
        raise MissingInputError(msg)
    sub = store.isel({schema.INIT_TIME: rows})
    members = target_members(sub, target, step_h)
    if tg.derived:
        mu, sigma = [members.mean(schema.MEMBER)], [members.std(schema.MEMBER)]
    else:
        mu = [_step(sub, contract.ens_mean(tg.variable), step_h, tg.level)]
        sigma = [_step(sub, contract.ens_std(tg.variable), step_h, tg.level)]
    names = [RAW]
    oracle = {p: _step(sub, n, step_h, tg.level) for p, n in contract.oracle_parameters(target).items() if n in sub}
    if tg.family == distributions.Gaussian.name and oracle:
        mu.append(oracle["mu"])
        sigma.append(oracle["sigma"])
        names.append(ORACLE)
    drop = [c for c in (schema.STEP, schema.LEVEL, contract.SPLIT) if c in sub.coords]
    family_oracle = {} if tg.family == distributions.Gaussian.name else {f"oracle_{p}": v for p, v in oracle.items()}
    out = xr.Dataset({
        "truth": truth.isel({schema.INIT_TIME: rows}),
        "members": members,
        "mu": xr.concat([m.drop_vars(drop, errors="ignore") for m in mu], dim="forecast"),
        "sigma": xr.concat([s.drop_vars(drop, errors="ignore") for s in sigma], dim="forecast"),
        **family_oracle,
    }).drop_vars(drop, errors="ignore").assign_coords(forecast=names).astype(np.float64).compute()
    out = out.transpose("forecast", schema.INIT_TIME, schema.MEMBER, schema.LAT, schema.LON)
    out["sigma"] = out["sigma"].clip(min=1e-6)
    out.attrs.update(target=target, step_h=step_h, split=split, units=tg.units)
    return out


def oracle_forecast(ver: xr.Dataset) -> dict[str, FamilyForecast]:
    """{"oracle": the oracle's law} for a target of another family than the Gaussian, from the parameters
    :func:`verification_dataset` carries; {} without them (a Gaussian oracle is among ``mu``/``sigma``)."""
    params = {str(k).removeprefix("oracle_"): ver[k] for k in ver.data_vars if str(k).startswith("oracle_")}
    if not params:
        return {}
    family = distributions.get(schema.TARGETS[ver.attrs["target"]].family)
    return {ORACLE: FamilyForecast(family(**{p: torch.from_numpy(v.values) for p, v in params.items()}))}


def _check_shape(ver: xr.Dataset, name: str, shape: tuple[int, ...]) -> None:
    if shape != ver["truth"].shape:
        msg = f"forecast {name!r} has shape {shape}, the truth {ver['truth'].shape}: a checkpoint of another grid?"
        raise BadInputError(msg)


def add_forecast(ver: xr.Dataset, name: str, mu: np.ndarray, sigma: np.ndarray) -> xr.Dataset:
    """Append one Gaussian forecast (init_time, lat, lon) to a verification dataset."""
    _check_shape(ver, name, mu.shape)
    new = xr.Dataset({"mu": (ver["truth"].dims, mu), "sigma": (ver["truth"].dims, sigma)}).expand_dims(
        forecast=[name])
    merged = xr.concat([ver[["mu", "sigma"]], new.assign_coords(ver["truth"].coords)], dim="forecast")
    merged = merged.transpose("forecast", *ver["truth"].dims)
    return ver.drop_vars(["mu", "sigma", "forecast"]).assign(mu=merged["mu"], sigma=merged["sigma"])


@dataclass(frozen=True)
class FamilyForecast:
    """A predictive distribution of :mod:`postcast.models.distributions` (parameters (T, lat, lon)) as
    numpy float64 in and out: the :class:`postcast.pipeline.verification.Predictive` of a checkpoint."""

    dist: distributions.Distribution

    @property
    def name(self) -> str:
        return self.dist.name

    @property
    def shape(self) -> tuple[int, ...]:
        """The forecast's shape S (T, lat, lon), that of its median."""
        return self.quantile(0.5).shape

    def _at(self, fn: Callable[[torch.Tensor], torch.Tensor], x: np.ndarray | float) -> np.ndarray:
        with torch.no_grad():
            return fn(torch.as_tensor(np.asarray(x, dtype=np.float64))).double().numpy()

    def crps(self, y: np.ndarray) -> np.ndarray:
        return self._at(self.dist.crps, y)

    def cdf(self, x: np.ndarray) -> np.ndarray:
        return self._at(self.dist.cdf, x)

    def cdf_left(self, x: np.ndarray) -> np.ndarray:
        return self._at(self.dist.cdf_left, x)

    def sf(self, x: np.ndarray) -> np.ndarray:
        return self._at(self.dist.sf, x)

    def quantile(self, tau: float) -> np.ndarray:
        return self._at(self.dist.quantile, tau)

    def quantile_where(self, tau: float, mask: np.ndarray) -> np.ndarray:
        """Q(tau) of the distributions where ``mask`` (S, bool) holds: (N,)."""
        with torch.no_grad():
            return self.dist.select(torch.from_numpy(mask)).quantile(torch.tensor(tau, dtype=torch.float64)).numpy()

    def moments(self) -> tuple[np.ndarray, np.ndarray]:
        """(mean, std) (T, lat, lon) in closed form, :func:`postcast.pipeline.forecast.moments` a date at a
        time (it reads one field's parameters, (lat, lon) each, Bernstein's coef as (K, lat, lon))."""
        params = {k: v.numpy() for k, v in self.dist.params.items()}  # (T, lat, lon) [coef (T, lat, lon, K)]
        per_date = [forecast.moments(self.name, {k: np.moveaxis(v[i], -1, 0) if v.ndim == 4 else v[i]
                                                 for k, v in params.items()}) for i in range(self.shape[0])]
        return np.stack([m for m, _ in per_date]), np.stack([sd for _, sd in per_date])


@torch.no_grad()
def _predict(path: str, store: str, split: str, batch_size: int = 4
             ) -> tuple[str, int, np.ndarray, distributions.Distribution]:
    """(target, lead in hours, init_times, predictive distribution (T, lat, lon) in float64) of a
    checkpoint on one split, any family: samples as its sample spec declares, in physical units (the
    model normalises them with the statistics it carries)."""
    model, meta = load_checkpoint(path)
    cfg = DataConfig(store=store, sample=SampleSpec.from_dict(meta["sample"]))
    check_fits(path, dict(model.hparams), cfg.sample, contract.open_store(store))
    data = StoreDataset(cfg, split)
    parts = []
    for start in range(0, len(data), batch_size):
        items = [data[i] for i in range(start, min(start + batch_size, len(data)))]
        batch = {k: torch.stack([it[k] for it in items]) for k in items[0]}
        parts.append(model.predictive(batch))  # parameters (B, lat, lon)
    family = type(parts[0])
    dist = family(**{k: torch.cat([p.params[k] for p in parts]).double() for k in parts[0].params})
    times = contract.open_store(store)[schema.INIT_TIME].values[data.indices]
    return cfg.sample.target, cfg.sample.step_h, times, dist


def check_fits(path: str, hparams: dict[str, Any], spec: SampleSpec, store: xr.Dataset) -> None:
    """BadInputError naming what differs when a checkpoint was trained on another grid, region or ensemble
    size than the store's, or reads variables the store lacks."""
    grid = (store.sizes[schema.LAT], store.sizes[schema.LON])
    area = schema.Grid.from_coords(store[schema.LAT].values, store[schema.LON].values, regional=True).area
    trained = hparams.get("grid_area")
    problems = [
        *([f"grid {tuple(hparams['grid'])} (lat x lon), the store {grid}"] if tuple(hparams["grid"]) != grid else []),
        *([f"area {trained}, the store {area}"] if (tuple(trained) if trained else None) != area else []),
        *([f"inputs {missing}, which the store lacks"] if (missing := [n for n in spec.store_variables()
                                                                    if n not in store]) else []),
        *([f"{hparams['n_members']} members, the store {store.sizes[schema.MEMBER]}"]
          if spec.members and hparams["n_members"] != store.sizes[schema.MEMBER] else []),
    ]
    if problems:
        msg = (f"{path}: checkpoint does not fit the store: trained with {'; '.join(problems)}; evaluate it on a "
               "store like the one it was trained on")
        raise BadInputError(msg)


def predict_checkpoint(path: str, store: str, split: str, batch_size: int = 4
                       ) -> tuple[str, np.ndarray, np.ndarray, np.ndarray]:
    """(target, init_times, mu, sigma) of a Gaussian checkpoint on one split (its own lead)."""
    target, _, times, dist = _predict(path, store, split, batch_size)
    if not isinstance(dist, distributions.Gaussian):
        msg = f"{path} predicts a {dist.name!r} distribution, not (mu, sigma): score it with postcast evaluate"
        raise BadInputError(msg)
    return target, times, dist.mu.numpy(), dist.sigma.numpy()


# --- scoring: one lead -> a results Dataset (postcast.pipeline.verification) -------------------
def efi_fields(store: xr.Dataset, ver: xr.Dataset) -> np.ndarray:
    """EFI (init_time, lat, lon) of the raw ensemble against the model climate of each date."""
    times = store[schema.INIT_TIME].values
    mds = sorted(set(zip(pd.DatetimeIndex(times).month, pd.DatetimeIndex(times).day, strict=True)))
    out = np.empty(ver["truth"].shape)
    for i, t in enumerate(ver[schema.INIT_TIME].values):
        window = np.flatnonzero(metrics.climate_window(times, t, month_days=mds))
        clim = target_members(store.isel({schema.INIT_TIME: window}), ver.attrs["target"], ver.attrs["step_h"]
                              ).values.astype(np.float64)  # (n, M, lat, lon): the window's dates only
        q = np.quantile(clim.reshape(-1, *clim.shape[2:]), metrics.EFI_LEVELS, axis=0)
        out[i] = metrics.efi(q, ver["members"].values[i])
    return out


def climate_thresholds(store: xr.Dataset, target: str, step_h: int) -> dict[str, np.ndarray]:
    """Events of the tail scores and reliability diagrams, each a threshold (lat, lon): below the 10 % and above
    the 90 % quantile of the training-split truth at each grid point (none when the training split has no
    truth), and above the target's own thresholds (tp24: 1 and 10 mm; ws10: 10 and 20 m/s) everywhere."""
    tg = schema.TARGETS[target]
    shape = (store.sizes[schema.LAT], store.sizes[schema.LON])
    fixed = {e: np.full(shape, t) for e, t in zip(verification.THRESHOLD_EVENTS, tg.thresholds, strict=False)}
    rows = contract.split_rows(store, "train", target=target, step_h=step_h)
    if not rows.size:
        return fixed
    truth = _step(store, contract.truth_name(target), step_h, tg.level)
    y = truth.isel({schema.INIT_TIME: rows}).values.astype(np.float64)  # (n, lat, lon)
    return dict(zip(verification.QUANTILE_EVENTS, np.nanquantile(y, [0.1, 0.9], axis=0), strict=True)) | fixed


def _chunks(ver: xr.Dataset, efi: np.ndarray, families: dict[str, FamilyForecast]
            ) -> tuple[list[str], list[verification.Chunk]]:
    y = ver["truth"].values  # (T, lat, lon)
    names = [str(f) for f in ver["forecast"].values]
    chunks = [verification.Chunk(y, efi, mu=ver["mu"].sel(forecast=f).values, sigma=ver["sigma"].sel(forecast=f).values)
              for f in names]
    chunks += [verification.Chunk(y, efi, dist=d) for d in families.values()]
    return [*names, *families, ENSEMBLE], [*chunks, verification.Chunk(y, efi, members=ver["members"].values)]


def _significance(res: xr.Dataset, bootstrap: int) -> xr.Dataset:
    """Paired per-date CRPS differences of every forecast against the baseline (:func:`baseline`; the
    variable names say ``raw``), per region and weighting: mean, stationary-bootstrap 95 % interval,
    Diebold-Mariano p-value, significant."""
    crps = res["score_per_date"].sel(metric="crps")  # (forecast, region, weighting, init_time)
    out = np.full((4, *crps.shape[:-1]), np.nan)
    for idx in np.ndindex(*crps.shape[:-1]):
        ref = crps.sel(forecast=res.attrs["baseline"]).values[idx[1:]]
        p = significance.paired(crps.values[idx], ref, n=bootstrap)
        out[(slice(None), *idx)] = (p.mean, p.low, p.high, p.p_value)
    dims = crps.dims[:-1]
    return res.assign(crps_minus_raw=(dims, out[0]), crps_minus_raw_low=(dims, out[1]),
                      crps_minus_raw_high=(dims, out[2]), dm_p_value=(dims, out[3]),
                      significant=(dims, (out[3] < 1 - significance.LEVEL).astype(np.int8)))


def score_lead(ver: xr.Dataset, efi: np.ndarray, *, thresholds: dict[str, np.ndarray] | None = None,
               bootstrap: int = 1000, families: dict[str, FamilyForecast] | None = None) -> xr.Dataset:
    """Every forecast of ``ver``, then the ``families`` (name -> a checkpoint's non-Gaussian forecast on
    ``ver``'s dates), and the raw members as ``raw_ensemble``, on one lead: scores per metric, region and
    weighting, per-date scores, significance against the target's :func:`baseline`, the CRPS decomposition, CRPS
    maps, reliability, PIT and rank histograms."""
    names, chunks = _chunks(ver, efi, oracle_forecast(ver) | (families or {}))
    lat, lon = ver[schema.LAT].values, ver[schema.LON].values
    res = verification.as_dataset(names, chunks, lat, lon, ver[schema.INIT_TIME].values, thresholds)
    members = ver["members"].values
    rank = metrics.rank_histogram(members, ver["truth"].values, axis=1)
    res = res.assign(rank_histogram=(("rank",), rank), mean_abs_efi=((), float(np.abs(efi).mean())))
    res.attrs["baseline"] = baseline(ver.attrs["target"])
    return _significance(res, bootstrap)


def _metric_values(scores: xr.DataArray, kind: str, events: list[str], keys: dict[str, str] | None = None
                   ) -> dict[str, float]:
    """Every registered metric that applies to ``kind``, from the scores (metric, weighting) of one
    forecast and region: unweighted under its name (or ``keys[name]``), then the area-weighted values
    of the ``weighted`` metrics under that key + ``_weighted``."""
    applies = [m for m in verification.METRICS if kind in m.kinds and (not m.event or m.event in events)]
    key = {m.name: (keys or {}).get(m.name, m.name) for m in applies}
    out = {key[m.name]: float(scores.sel(metric=m.name, weighting="none")) for m in applies}
    out.update({f"{key[m.name]}_weighted": float(scores.sel(metric=m.name, weighting="area"))
                for m in applies if m.weighted})
    return out


def _events(res: xr.Dataset) -> list[str]:
    """The events the target's results hold (those with thresholds: :func:`climate_thresholds`)."""
    return [str(e) for e in res["event"].values]


def _region_summary(res: xr.Dataset, f: str, region: str) -> dict[str, Any]:
    out: dict[str, Any] = _metric_values(res["score"].sel(forecast=f, region=region), verification.GAUSSIAN,
                                                        _events(res))
    raw = float(res["score"].sel(forecast=res.attrs["baseline"], region=region, metric="crps", weighting="none"))
    out["skill_vs_raw"] = 1.0 - out["crps"] / raw
    if ORACLE in res["forecast"].values:
        gap = raw - float(res["score"].sel(forecast=ORACLE, region=region, metric="crps", weighting="none"))
        out["gap_closed"] = (raw - out["crps"]) / gap if gap > 0 else float("nan")
    sig = res.sel(forecast=f, region=region, weighting="none")
    out["crps_minus_raw"] = {"mean": float(sig["crps_minus_raw"]), "ci95": [float(sig["crps_minus_raw_low"]),
                             float(sig["crps_minus_raw_high"])], "dm_p_value": float(sig["dm_p_value"]),
                             "significant": bool(sig["significant"])}
    out["decomposition"] = {str(c): float(v) for c, v in zip(res["component"].values,
                                                             res["decomposition"].sel(forecast=f, region=region).values,
                                                             strict=True)}
    return out


def summary(res: xr.Dataset) -> dict[str, Any]:
    """The JSON summary of one lead's results: {"forecasts": {name: {region: {...}}}, "raw_ensemble":
    {region: {...}}, "per_date_crps": {name: [...]}, "crps_map": {name: (lat, lon) list}}."""
    regions = [str(r) for r in res["region"].values]
    gauss = [str(f) for f in res["forecast"].values if f != ENSEMBLE]
    out: dict[str, Any] = {"forecasts": {f: {r: _region_summary(res, f, r) for r in regions} for f in gauss}}
    for f in gauss:
        for r in regions:
            if r == "global":
                out["forecasts"][f][r]["pit_histogram"] = res["pit_histogram"].sel(forecast=f).values.tolist()
    ens = res["score"].sel(forecast=ENSEMBLE)
    out["raw_ensemble"] = {r: {
        **_metric_values(ens.sel(region=r), verification.ENSEMBLE, _events(res), ENSEMBLE_KEYS),
        "decomposition": {str(c): float(v) for c, v in zip(res["component"].values,
                                                           res["decomposition"].sel(forecast=ENSEMBLE, region=r).values,
                                                           strict=True)}} for r in regions}
    out["raw_ensemble"]["global"].update(rank_histogram=res["rank_histogram"].values.tolist(),
                                         mean_abs_efi=float(res["mean_abs_efi"]))
    dated = res["score_per_date"].sel(metric="crps", region="global", weighting="none")
    out["per_date_crps"] = {f: dated.sel(forecast=f).values.tolist() for f in gauss}
    out["crps_map"] = {f: res["crps_map"].sel(forecast=f).values.tolist() for f in gauss}
    return out


def score(ver: xr.Dataset, efi: np.ndarray, *, bootstrap: int = 1000) -> dict[str, Any]:
    """The JSON summary (:func:`summary`) of :func:`score_lead` on one lead."""
    return summary(score_lead(ver, efi, bootstrap=bootstrap))


# --- driver ----------------------------------------------------------------------------------
def _checkpoint_name(path: str, names: dict[str, str], taken: set[str]) -> str:
    """Display name: given, else the run directory (the one above ``lightning_logs``), else the file
    stem; made unique with a suffix."""
    p = Path(path).resolve()
    name = names.get(path)
    if name is None:
        parts = p.parts
        name = parts[parts.index("lightning_logs") - 1] if "lightning_logs" in parts[1:] else p.stem
    unique, i = name, 2
    while unique in taken or unique in (RAW, ORACLE, ENSEMBLE):
        unique, i = f"{name}_{i}", i + 1
    taken.add(unique)
    return unique


Prediction = tuple[str, int, np.ndarray, distributions.Distribution]  # name, lead (h), init times, forecast


def leads_with_truth(store: xr.Dataset, target: str, split: str) -> list[int]:
    """Every lead (h) of the store with truth for ``target`` on some date of ``split`` (and, for a derived
    target, every lead its inputs are read at: tp24 at +24 h needs +0 h)."""
    steps = [int(pd.Timedelta(s) / pd.Timedelta(hours=1)) for s in store[schema.STEP].values]
    offsets = [off for _, off in schema.TARGETS[target].inputs]
    return [h for h in steps if all(h + off in steps for off in offsets)
            and contract.split_rows(store, split, target=target, step_h=h).size]


def score_target(store: xr.Dataset, target: str, split: str, preds: list[Prediction], bootstrap: int
                 ) -> xr.Dataset:
    """Results of ``target`` at every lead with truth (dim ``lead``, hours); models at their own lead."""
    per_lead = []
    leads = leads_with_truth(store, target, split)
    if not leads:
        msg = f"no lead of {target} has truth in split {split!r}"
        raise MissingInputError(msg)
    for h in leads:
        ver = verification_dataset(store, target, split, step_h=h)
        families: dict[str, FamilyForecast] = {}
        for name, lead, times, dist in preds:
            if lead != h:
                continue
            if not np.array_equal(times, ver[schema.INIT_TIME].values):
                msg = f"{name}: predicted init times differ from the verification dates of {target} at +{h} h"
                raise BadInputError(msg)
            if isinstance(dist, distributions.Gaussian):  # the closed forms of every release so far
                ver = add_forecast(ver, name, dist.mu.numpy(), dist.sigma.numpy())
            else:
                families[name] = FamilyForecast(dist)
                _check_shape(ver, name, families[name].shape)
        log.info("scoring %s +%d h: %s", target, h, ", ".join([*map(str, ver["forecast"].values), *families]))
        res = score_lead(ver, efi_fields(store, ver), thresholds=climate_thresholds(store, target, h),
                         bootstrap=bootstrap, families=families)
        per_lead.append(res.expand_dims(lead=[h]))
    out = xr.concat(per_lead, dim="lead", join="outer", data_vars="all", coords="different", compat="equals")
    out.attrs.update(target=target, units=schema.TARGETS[target].units, split=split)
    return out


def results_dataset(per_target: dict[str, xr.Dataset]) -> xr.Dataset:
    """One Dataset over targets (dim ``target``; forecasts and dates joined, NaN where absent), with
    the units of each target and of each score (``metric_units``: the target's, or 1)."""
    parts = [ds.expand_dims(target=[t]) for t, ds in per_target.items()]
    out = xr.concat(parts, dim="target", join="outer", data_vars="all", coords="different", compat="equals")
    units = [ds.attrs["units"] for ds in per_target.values()]
    out = out.assign_coords(units=("target", units), baseline=("target", [baseline(t) for t in per_target]),
                            metric_units=(("target", "metric"), [
        [u if m.units else "1" for m in verification.METRICS] for u in units]))
    out["lead"].attrs["units"] = "hours"
    out.attrs = {}
    out.attrs.update(title="postcast verification", conventions="docs/verification.md",
                     split=next(iter(per_target.values())).attrs["split"])
    return out


def headline_lead(res: xr.Dataset, preds: list[Prediction]) -> int:
    """The lead the summary and scorecard show: the models' lead, else the target lead (48 h)."""
    leads = [int(x) for x in res["lead"].values]
    for _, lead, *_ in preds:
        if lead in leads:
            return lead
    return schema.TARGET_STEP_H if schema.TARGET_STEP_H in leads else leads[-1]


def _target_summary(res: xr.Dataset, lead: int) -> dict[str, Any]:
    one = res.sel(lead=lead).dropna("forecast", how="all", subset=["score"]).dropna("init_time", how="all",
                                                                                    subset=["score_per_date"])
    out = summary(one)
    out.update(units=res.attrs["units"], lead_h=lead, n_dates=int(one.sizes[schema.INIT_TIME]),
               latitude=res[schema.LAT].values.tolist(), longitude=res[schema.LON].values.tolist(),
               baseline=res.attrs["baseline"], thresholds=dict(zip(verification.THRESHOLD_EVENTS,
                                                                   schema.TARGETS[res.attrs["target"]].thresholds,
                                                                   strict=False)))
    crps = res["score"].sel(metric="crps", region="global")
    out["leads"] = {int(h): {str(f): {w: float(crps.sel(lead=h, forecast=f, weighting=w)) for w in ("none", "area")}
                             for f in res["forecast"].values if np.isfinite(crps.sel(lead=h, forecast=f)).all()}
                    for h in res["lead"].values}
    return out


def write_results(ds: xr.Dataset, out: Path) -> Path:
    """``results.nc`` (atomic) in ``out``."""
    path = out / "results.nc"
    io.write_netcdf(ds, path, compress=False)
    return path


def target_arrays(store: xr.Dataset, target: str, path: str) -> list[str]:
    """The store arrays scoring ``target`` reads (members, or the members it is derived from; ensemble mean and
    std of a variable target; truth; the oracle's parameters when there)."""
    tg = schema.TARGETS[target]
    stats = [] if tg.derived else [contract.ens_mean(tg.variable), contract.ens_std(tg.variable)]
    names = [*tg.input_variables, *stats, contract.truth_name(target)]
    missing = [n for n in names if n not in store]
    if missing:
        msg = f"{path} has no {', '.join(missing)}: cannot score {target}; evaluate other --targets"
        raise MissingInputError(msg, missing=missing)
    return names + [n for n in contract.oracle_parameters(target).values() if n in store]


@contextlib.contextmanager
def chunk_named(path: str, names: list[str]) -> Iterator[None]:
    """A read inside xarray that fails (which names neither variable nor chunk) becomes the BadInputError
    naming the first chunk of ``names`` that does not decode; any other failure passes unchanged."""
    try:
        yield
    except PostcastError:
        raise
    except Exception as err:
        bad = reads.first_undecodable(path, names)
        if bad is None:
            raise
        raise bad from err


def evaluate(cfg: EvalConfig, progress: Callable[[Iterable[Any]], Iterable[Any]] = iter) -> dict[str, Any]:
    """Score every checkpoint plus raw ensemble and oracle at every lead with truth; writes
    ``results.nc`` (the results Dataset), ``metrics.json`` (its summary) and the report."""
    from postcast.pipeline import report

    store = contract.open_store(cfg.store)
    preds: dict[str, list[Prediction]] = {}
    taken: dict[str, set[str]] = {}  # display names are unique per target
    for path in progress(cfg.checkpoints):
        target, lead, times, dist = _predict(path, cfg.store, cfg.split)
        name = _checkpoint_name(path, cfg.names, taken.setdefault(target, set()))
        preds.setdefault(target, []).append((name, lead, times, dist))
    targets = cfg.targets or (tuple(preds) if preds else
                              tuple(t for t in schema.TARGETS if contract.truth_name(t) in store))  # with truth
    per_target = {}
    for t in targets:
        names = target_arrays(store, t, cfg.store)
        reads.check_chunks(cfg.store, names, range(store.sizes[schema.INIT_TIME]))
        with chunk_named(cfg.store, names):
            per_target[t] = score_target(store, t, cfg.split, preds.get(t, []), cfg.bootstrap)
    results: dict[str, Any] = {"store": cfg.store, "split": cfg.split, "results": "results.nc", "targets": {
        t: _target_summary(res, headline_lead(res, preds.get(t, []))) for t, res in per_target.items()}}
    for t, entries in preds.items():  # each checkpoint's family beside its scores
        for name, _, _, dist in entries:
            if t in results["targets"] and name in results["targets"][t]["forecasts"]:
                results["targets"][t]["forecasts"][name]["global"]["distribution"] = dist.name
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    ds = results_dataset(per_target)
    write_results(ds, out)
    io.write_json(out / "metrics.json", results)
    report.write_report(ds, results, out)
    return results
