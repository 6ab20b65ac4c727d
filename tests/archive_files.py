"""A small forecast archive of several targets, models and predictive families, written through the
archive's contract (``pipeline/products/archive.py``) as ``postcast forecast`` writes it, with evaluate's scores
beside it: what the page and browser tests serve."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from postcast.datasets import laws, schema
from postcast.pipeline.products.archive import DEFAULT_QUANTILES, POSTPROCESSED, product_path, write_product
from postcast.pipeline.products.content import Law
from postcast.serve.testing import postprocessed

CLIMATE_T2M = (258.0, 284.5, 302.3)  # training-climate 10/50/90 % quantiles, as a checkpoint carries them
INITS = (pd.Timestamp("2017-01-02"), pd.Timestamp("2017-01-03"))
# (target, model) -> (family, thresholds, CRPS in metrics.json (None: not scored))
MODELS = {
    ("t2m", "emos"): ("gaussian", CLIMATE_T2M, 1.10),
    ("t2m", "unet"): ("gaussian", CLIMATE_T2M, 0.95),
    ("tp24", "emos_gaussian_tp24"): ("gaussian", (1.0, 10.0), 1.40),
    ("tp24", "emos_csg"): ("csg", (1.0, 10.0), 1.20),
    ("ws10", "emos_truncnormal"): ("truncnormal", (10.0, 20.0), None),
}


def raw_members(mean: np.ndarray, std: np.ndarray, target: str, seed: int, n: int = 10) -> np.ndarray:
    """``n`` raw members (n, lat, lon) about the forecast's mean, under-dispersed as raw ensembles are; never
    below 0 for the amounts and speeds."""
    draws = mean + 0.6 * std * np.random.default_rng(seed).standard_normal((n, *mean.shape))
    return np.maximum(draws, 0.0) if target in ("tp24", "ws10") else draws


def params_of(family: str, target: str, lat: np.ndarray, lon: np.ndarray, seed: int) -> dict[str, np.ndarray]:
    """Smooth parameters of ``family`` on the grid (lat, lon), plausible for ``target``."""
    rng = np.random.default_rng(seed)
    shape = (lat.size, lon.size)
    wave = np.cos(np.deg2rad(lat))[:, None] * (1 + 0.5 * np.sin(np.deg2rad(2 * lon)))[None, :]  # (lat, lon)
    noise = rng.normal(0, 0.1, shape)
    if family == "csg":
        return {"shape": 0.8 + wave + noise**2, "scale": 1.5 + wave, "shift": 0.5 + 0.2 * wave}
    if family == "truncnormal":
        return {"mu": 4.0 + 6.0 * wave + noise, "sigma": 1.5 + 0.5 * wave}
    if target == "tp24":  # a Gaussian for rain: small means, a spread that reaches below zero
        return {"mu": 0.4 + 2.0 * wave + noise, "sigma": 1.5 + 0.3 * wave}
    return {"mu": 250.0 + 40.0 * wave + noise, "sigma": 1.0 + 0.5 * wave}


def write_archive(root: Path, resolution: float = 5.0) -> Path:
    """The archive of :data:`MODELS` at :data:`INITS` under ``root`` with its ``metrics.json``."""
    grid = schema.Grid(resolution)
    lat, lon = grid.latitudes(), grid.longitudes()
    scores: dict[str, dict[str, object]] = {}
    for k, ((target, model), (family, thresholds, crps)) in enumerate(MODELS.items()):
        for j, init in enumerate(INITS):
            p = params_of(family, target, lat, lon, seed=10 * k + j)
            law = Law.of(family, p, DEFAULT_QUANTILES, thresholds)
            mean, std = laws.get(family).moments(p)
            members = raw_members(mean, std, target, seed=10 * k + j)
            ds = postprocessed(
                mean, std, target, init, grid, thresholds, None if family == "gaussian" else law, members
            )
            write_product(ds, product_path(root, POSTPROCESSED, model, target, init, "nc"))
        if crps is not None:
            forecasts = scores.setdefault(target, {"forecasts": {}})["forecasts"]
            forecasts[model] = {"global": {"crps_weighted": crps}}  # type: ignore[index]
    (root / "metrics.json").write_text(json.dumps({"targets": scores}))
    return root
