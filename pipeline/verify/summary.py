"""The JSON summary of one lead's results (``metrics.json``): per forecast and region every registered metric
that applies (area-weighted beside unweighted), skill against the baseline, the gap to the oracle closed, the
significance of the CRPS difference and its decomposition; the raw members' scores; per-date CRPS and the CRPS
map (:func:`summary`, from :func:`postcast.pipeline.verify.evaluate.score_lead`'s Dataset)."""

from __future__ import annotations

from typing import Any

import xarray as xr

from postcast.pipeline.verify import metrics
from postcast.pipeline.verify.chunk import ENSEMBLE as ENSEMBLE_KIND
from postcast.pipeline.verify.chunk import PREDICTIVE
from postcast.pipeline.verify.forecasts import ENSEMBLE, ORACLE

ENSEMBLE_KEYS = {"crps": "crps_fair"}  # metrics.json names the members' fair CRPS beside crps_standard


def _metric_values(
    scores: xr.DataArray, kind: str, events: list[str], keys: dict[str, str] | None = None
) -> dict[str, float]:
    """Every registered metric that applies to ``kind``, from the scores (metric, weighting) of one
    forecast and region: unweighted under its name (or ``keys[name]``), then the area-weighted values
    of the ``weighted`` metrics under that key + ``_weighted``."""
    applies = [m for m in metrics.METRICS if kind in m.kinds and (not m.event or m.event in events)]
    key = {m.name: (keys or {}).get(m.name, m.name) for m in applies}
    out = {key[m.name]: float(scores.sel(metric=m.name, weighting="none")) for m in applies}
    out.update(
        {f"{key[m.name]}_weighted": float(scores.sel(metric=m.name, weighting="area")) for m in applies if m.weighted}
    )
    return out


def _events(res: xr.Dataset) -> list[str]:
    """The events the target's results hold (those with thresholds: :func:`climate_thresholds`)."""
    return [str(e) for e in res["event"].values]


def _region_summary(res: xr.Dataset, f: str, region: str) -> dict[str, Any]:
    out: dict[str, Any] = _metric_values(res["score"].sel(forecast=f, region=region), PREDICTIVE, _events(res))
    raw = float(res["score"].sel(forecast=res.attrs["baseline"], region=region, metric="crps", weighting="none"))
    out["skill_vs_raw"] = 1.0 - out["crps"] / raw
    if ORACLE in res["forecast"].values:
        gap = raw - float(res["score"].sel(forecast=ORACLE, region=region, metric="crps", weighting="none"))
        out["gap_closed"] = (raw - out["crps"]) / gap if gap > 0 else float("nan")
    sig = res.sel(forecast=f, region=region, weighting="none")
    out["crps_minus_raw"] = {
        "mean": float(sig["crps_minus_raw"]),
        "ci95": [float(sig["crps_minus_raw_low"]), float(sig["crps_minus_raw_high"])],
        "dm_p_value": float(sig["dm_p_value"]),
        "significant": bool(sig["significant"]),
    }
    out["decomposition"] = {
        str(c): float(v)
        for c, v in zip(
            res["component"].values, res["decomposition"].sel(forecast=f, region=region).values, strict=True
        )
    }
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
    out["raw_ensemble"] = {
        r: {
            **_metric_values(ens.sel(region=r), ENSEMBLE_KIND, _events(res), ENSEMBLE_KEYS),
            "decomposition": {
                str(c): float(v)
                for c, v in zip(
                    res["component"].values, res["decomposition"].sel(forecast=ENSEMBLE, region=r).values, strict=True
                )
            },
        }
        for r in regions
    }
    out["raw_ensemble"]["global"].update(
        rank_histogram=res["rank_histogram"].values.tolist(), mean_abs_efi=float(res["mean_abs_efi"])
    )
    dated = res["score_per_date"].sel(metric="crps", region="global", weighting="none")
    out["per_date_crps"] = {f: dated.sel(forecast=f).values.tolist() for f in gauss}
    out["crps_map"] = {f: res["crps_map"].sel(forecast=f).values.tolist() for f in gauss}
    return out
