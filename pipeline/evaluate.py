"""Evaluation: score the raw ensemble, trained post-processors and the oracle side by side.

Pure core: :func:`verification_dataset` gathers, for one target, lead and split, the truth, the raw
members and the Gaussian forecasts of every entry (dims ``forecast, init_time, latitude,
longitude``); :func:`score` turns that dataset into a metrics dict. Drivers: :func:`evaluate`
(checkpoints + store -> metrics JSON and a report, see :mod:`postcast.pipeline.report`) and
``postcast evaluate``.

Conventions: CRPS and EECRPS unweighted (ENS-10) and area-weighted (WeatherBench 2); EFI from the
forecasts' own model climate (members of the init dates within the ENS-10 climate window);
``gap_closed`` = (CRPS_raw - CRPS) / (CRPS_raw - CRPS_oracle); paired bootstrap over init dates.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import xarray as xr

from postcast.datasets import io, schema
from postcast.datasets import store as contract
from postcast.datasets.loaders.datamodule import DataConfig, StoreDataset
from postcast.datasets.sample import SampleSpec
from postcast.models.module import load_checkpoint
from postcast.pipeline import metrics

log = logging.getLogger(__name__)

RAW, ORACLE = "raw", "oracle"
REGIONS: dict[str, tuple[float, float]] = {"global": (-90.0, 90.0), "n_extratropics": (20.0, 90.0),
                                           "tropics": (-20.0, 20.0), "s_extratropics": (-90.0, -20.0)}
PIT_BINS = 10


@dataclass(frozen=True)
class EvalConfig:
    store: str
    checkpoints: tuple[str, ...] = ()
    targets: tuple[str, ...] | None = None  # None: the checkpoints' targets, else all three
    split: str = "test"
    out: str = "reports/eval"
    bootstrap: int = 1000
    names: dict[str, str] = field(default_factory=dict)  # checkpoint path -> display name

    def __post_init__(self) -> None:
        if self.split not in contract.SPLITS:
            msg = f"split {self.split!r}: use one of {list(contract.SPLITS)}"
            raise ValueError(msg)
        for t in self.targets or ():
            if t not in schema.TARGETS:
                msg = f"target {t!r}: use one of {list(schema.TARGETS)}"
                raise ValueError(msg)


# --- gathering forecasts ----------------------------------------------------------------------
def _step(ds: xr.Dataset, name: str, step_h: int, level: int | None) -> xr.DataArray:
    da = ds[name].sel({schema.STEP: pd.Timedelta(hours=step_h)})
    if schema.LEVEL in da.dims:
        da = da.sel({schema.LEVEL: level})
    return da


def verification_dataset(store: xr.Dataset, target: str, split: str, step_h: int = schema.TARGET_STEP_H
                         ) -> xr.Dataset:
    """Truth, raw members, and the raw-ensemble and oracle Gaussians of ``target`` on one split."""
    tg = schema.TARGETS[target]
    truth = _step(store, contract.truth_name(target), step_h, tg.level)
    rows = contract.split_rows(store, split, target=target, step_h=step_h)
    if not rows.size:
        msg = f"no init date with truth for {target} at +{step_h} h in split {split!r}"
        raise ValueError(msg)
    sub = store.isel({schema.INIT_TIME: rows})
    members = _step(sub, tg.variable, step_h, tg.level)
    mu = [_step(sub, contract.ens_mean(tg.variable), step_h, tg.level)]
    sigma = [_step(sub, contract.ens_std(tg.variable), step_h, tg.level)]
    names = [RAW]
    if contract.oracle_mean(target) in sub:
        mu.append(_step(sub, contract.oracle_mean(target), step_h, tg.level))
        sigma.append(_step(sub, contract.oracle_std(target), step_h, tg.level))
        names.append(ORACLE)
    drop = [c for c in (schema.STEP, schema.LEVEL, contract.SPLIT) if c in sub.coords]
    out = xr.Dataset({
        "truth": truth.isel({schema.INIT_TIME: rows}),
        "members": members,
        "mu": xr.concat(mu, dim="forecast"),
        "sigma": xr.concat(sigma, dim="forecast"),
    }).drop_vars(drop, errors="ignore").assign_coords(forecast=names).astype(np.float64).compute()
    out = out.transpose("forecast", schema.INIT_TIME, schema.MEMBER, schema.LAT, schema.LON)
    out["sigma"] = out["sigma"].clip(min=1e-6)
    out.attrs.update(target=target, step_h=step_h, split=split, units=tg.units)
    return out


def add_forecast(ver: xr.Dataset, name: str, mu: np.ndarray, sigma: np.ndarray) -> xr.Dataset:
    """Append one Gaussian forecast (init_time, lat, lon) to a verification dataset."""
    if mu.shape != ver["truth"].shape:
        msg = f"forecast {name!r} has shape {mu.shape}, the truth {ver['truth'].shape}"
        raise ValueError(msg)
    new = xr.Dataset({"mu": (ver["truth"].dims, mu), "sigma": (ver["truth"].dims, sigma)}).expand_dims(
        forecast=[name])
    merged = xr.concat([ver[["mu", "sigma"]], new.assign_coords(ver["truth"].coords)], dim="forecast")
    merged = merged.transpose("forecast", *ver["truth"].dims)
    return ver.drop_vars(["mu", "sigma", "forecast"]).assign(mu=merged["mu"], sigma=merged["sigma"])


@torch.no_grad()
def predict_checkpoint(path: str, store: str, split: str, batch_size: int = 4
                       ) -> tuple[str, np.ndarray, np.ndarray, np.ndarray]:
    """(target, init_times, mu, sigma) of a checkpoint on one split: samples as its sample spec declares,
    in physical units (the model normalises them with the statistics it carries)."""
    model, meta = load_checkpoint(path)
    cfg = DataConfig(store=store, sample=SampleSpec.from_dict(meta["sample"]))
    data = StoreDataset(cfg, split)
    mus, sigmas = [], []
    for start in range(0, len(data), batch_size):
        items = [data[i] for i in range(start, min(start + batch_size, len(data)))]
        batch = {k: torch.stack([it[k] for it in items]) for k in items[0]}
        mu, sigma = model(batch)
        mus.append(mu.double().numpy())
        sigmas.append(sigma.double().numpy())
    times = contract.open_store(store)[schema.INIT_TIME].values[data.indices]
    return cfg.sample.target, times, np.concatenate(mus), np.concatenate(sigmas)


# --- scoring ---------------------------------------------------------------------------------
def _weights(lat: np.ndarray, n_lon: int) -> np.ndarray:
    return np.repeat(metrics.latitude_weights(lat)[:, None], n_lon, axis=1)  # (lat, lon), mean 1


def efi_fields(store: xr.Dataset, ver: xr.Dataset) -> np.ndarray:
    """EFI (init_time, lat, lon) of the raw ensemble against the model climate of each date."""
    tg = schema.TARGETS[ver.attrs["target"]]
    all_members = _step(store, tg.variable, ver.attrs["step_h"], tg.level)
    times = store[schema.INIT_TIME].values
    mds = sorted(set(zip(pd.DatetimeIndex(times).month, pd.DatetimeIndex(times).day, strict=True)))
    out = np.empty(ver["truth"].shape)
    for i, t in enumerate(ver[schema.INIT_TIME].values):
        window = np.flatnonzero(metrics.climate_window(times, t, month_days=mds))
        clim = all_members.isel({schema.INIT_TIME: window}).values.astype(np.float64)  # (n, M, lat, lon)
        q = np.quantile(clim.reshape(-1, *clim.shape[2:]), metrics.EFI_LEVELS, axis=0)
        out[i] = metrics.efi(q, ver["members"].values[i])
    return out


def _region_mask(lat: np.ndarray, n_lon: int, region: str) -> np.ndarray:
    lo, hi = REGIONS[region]
    return np.repeat(((lat >= lo) & (lat <= hi))[:, None], n_lon, axis=1)


def _forecast_scores(crps: np.ndarray, mu: np.ndarray, sigma: np.ndarray, y: np.ndarray, w: np.ndarray,
                     efi: np.ndarray) -> dict[str, Any]:
    """Scores of one Gaussian forecast on one region; arrays (time, points)."""
    err = mu - y
    pit = metrics.pit_gaussian(mu, sigma, y)
    return {
        "crps": float(crps.mean()),
        "crps_weighted": float((crps * w).sum() / (w.sum())),
        "eecrps": float(np.mean([metrics.eecrps(crps[i], efi[i]) for i in range(crps.shape[0])])),
        "eecrps_weighted": float((np.abs(efi) * crps * w).sum() / w.sum()),
        "bias": float(err.mean()),
        "rmse": float(np.sqrt((err**2).mean())),
        "spread": float(np.sqrt((sigma**2).mean())),
        "spread_skill": float(np.sqrt((sigma**2).mean()) / np.sqrt((err**2).mean())),
        "pit_histogram": np.histogram(pit, bins=PIT_BINS, range=(0.0, 1.0))[0].tolist(),
    }


def score(ver: xr.Dataset, efi: np.ndarray, *, bootstrap: int = 1000) -> dict[str, Any]:
    """Metrics of every forecast in ``ver`` per region, plus raw-ensemble ensemble scores.

    Returns {"forecasts": {name: {region: {...}}}, "raw_ensemble": {region: {...}}, "per_date_crps":
    {name: [...]}, "crps_map": {name: (lat, lon) list}} with skill, gap closed and bootstrap CIs."""
    lat = ver[schema.LAT].values
    n_lon = ver.sizes[schema.LON]
    y = ver["truth"].values  # (T, lat, lon)
    w_full = _weights(lat, n_lon)
    members = ver["members"].values  # (T, M, lat, lon)
    out: dict[str, Any] = {"forecasts": {}, "raw_ensemble": {}, "per_date_crps": {}, "crps_map": {}}
    crps_all = {f: metrics.crps_gaussian(ver["mu"].sel(forecast=f).values, ver["sigma"].sel(forecast=f).values, y)
                for f in ver["forecast"].values}
    for f, crps in crps_all.items():
        mu, sigma = ver["mu"].sel(forecast=f).values, ver["sigma"].sel(forecast=f).values
        out["forecasts"][f] = {}
        for region in REGIONS:
            m = _region_mask(lat, n_lon, region)
            out["forecasts"][f][region] = _forecast_scores(crps[:, m], mu[:, m], sigma[:, m], y[:, m],
                                                           w_full[m][None], efi[:, m])
        out["per_date_crps"][f] = crps.reshape(crps.shape[0], -1).mean(axis=1).tolist()
        out["crps_map"][f] = crps.mean(axis=0).tolist()
    _add_relative(out, crps_all, bootstrap)
    for estimator in ("fair", "standard"):
        ens = metrics.crps_ensemble(members, y, axis=1, estimator=estimator)  # (T, lat, lon)
        for region in REGIONS:
            m = _region_mask(lat, n_lon, region)
            block = out["raw_ensemble"].setdefault(region, {})
            block[f"crps_{estimator}"] = float(ens[:, m].mean())
            block[f"crps_{estimator}_weighted"] = float((ens[:, m] * w_full[m][None]).sum() / (w_full[m].sum()
                                                                                             * ens.shape[0]))
    for region in REGIONS:
        m = _region_mask(lat, n_lon, region)
        mem = members[:, :, m]
        block = out["raw_ensemble"][region]
        block["spread_skill"] = metrics.spread_skill_ratio(mem.std(axis=1), mem.mean(axis=1), y[:, m])
        block["rank_histogram"] = metrics.rank_histogram(mem, y[:, m], axis=1).tolist()
        block["mean_abs_efi"] = float(np.abs(efi[:, m]).mean())
    return out


def _add_relative(out: dict[str, Any], crps_all: dict[str, np.ndarray], bootstrap: int) -> None:
    """Skill against the raw Gaussian, fraction of the raw-to-oracle gap closed, bootstrap CIs."""
    for f, regions in out["forecasts"].items():
        for region, s in regions.items():
            raw = out["forecasts"][RAW][region]["crps"]
            s["skill_vs_raw"] = 1.0 - s["crps"] / raw
            if ORACLE in out["forecasts"]:
                gap = raw - out["forecasts"][ORACLE][region]["crps"]
                s["gap_closed"] = (raw - s["crps"]) / gap if gap > 0 else float("nan")
        per_date = np.asarray(out["per_date_crps"][f])
        raw_dates = np.asarray(out["per_date_crps"][RAW])
        mean, lo, hi = metrics.paired_bootstrap(per_date, raw_dates, n=bootstrap)
        regions["global"]["crps_minus_raw"] = {"mean": mean, "ci95": [lo, hi]}


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
    while unique in taken or unique in (RAW, ORACLE):
        unique, i = f"{name}_{i}", i + 1
    taken.add(unique)
    return unique


def evaluate(cfg: EvalConfig, progress: Callable[[Iterable[Any]], Iterable[Any]] = iter) -> dict[str, Any]:
    """Score every checkpoint plus raw ensemble and oracle; writes ``metrics.json`` and the report."""
    from postcast.pipeline import report

    store = contract.open_store(cfg.store)
    preds: dict[str, list[tuple[str, np.ndarray, np.ndarray, np.ndarray]]] = {}
    taken: dict[str, set[str]] = {}  # display names are unique per target
    for path in progress(cfg.checkpoints):
        target, times, mu, sigma = predict_checkpoint(path, cfg.store, cfg.split)
        name = _checkpoint_name(path, cfg.names, taken.setdefault(target, set()))
        preds.setdefault(target, []).append((name, times, mu, sigma))
    targets = cfg.targets or (tuple(preds) if preds else tuple(schema.TARGETS))
    results: dict[str, Any] = {"store": cfg.store, "split": cfg.split, "targets": {}}
    for target in targets:
        ver = verification_dataset(store, target, cfg.split)
        for name, times, mu, sigma in preds.get(target, []):
            if not np.array_equal(times, ver[schema.INIT_TIME].values):
                msg = f"{name}: predicted init times differ from the verification dates of {target}"
                raise ValueError(msg)
            ver = add_forecast(ver, name, mu, sigma)
        log.info("scoring %s: %s", target, list(ver["forecast"].values))
        efi = efi_fields(store, ver)
        res = score(ver, efi, bootstrap=cfg.bootstrap)
        res.update(units=ver.attrs["units"], lead_h=ver.attrs["step_h"], n_dates=int(ver.sizes[schema.INIT_TIME]),
                   latitude=ver[schema.LAT].values.tolist(), longitude=ver[schema.LON].values.tolist())
        results["targets"][target] = res
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    io.write_json(out / "metrics.json", results)
    report.write_report(results, out)
    return results
