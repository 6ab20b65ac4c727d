"""Error and size measures for compressed fields (the measures compression studies report: docs/compression.md)."""

from __future__ import annotations

from typing import Any

import numpy as np

from postcast.datasets.core.geo import latitude_weights


def field_errors(data: np.ndarray, decoded: np.ndarray, lat: np.ndarray) -> dict[str, Any]:
    """Errors of ``decoded`` against ``data`` (..., H, W) with latitudes ``lat`` (H,): cos-latitude
    weighted RMSE (WeatherBench weights, mean 1), RMSE, MAE, max absolute error, PSNR over the data range."""
    err = decoded.astype(np.float64) - data.astype(np.float64)
    w = latitude_weights(lat, "cos")
    wmse = float((err**2 * w[:, None]).mean())
    mse = float((err**2).mean())
    rng = float(data.max() - data.min())
    return {
        "wrmse": wmse**0.5,
        "rmse": mse**0.5,
        "mae": float(np.abs(err).mean()),
        "max_abs": float(np.abs(err).max()),
        "psnr_db": 20 * np.log10(rng) - 10 * np.log10(max(mse, 1e-300)),
    }


def weighted_std(data: np.ndarray, lat: np.ndarray) -> float:
    """Cos-latitude weighted standard deviation of ``data`` (..., H, W) over all its points."""
    x = data.astype(np.float64)
    w = np.broadcast_to(latitude_weights(lat, "cos")[:, None], x.shape)
    mean = np.average(x, weights=w)
    return float(np.sqrt(np.average((x - mean) ** 2, weights=w)))


def relative_wrmse(data: np.ndarray, decoded: np.ndarray, lat: np.ndarray) -> float:
    """The largest weighted RMSE / weighted std over the levels of ``data`` (T, L, H, W): 0 is exact,
    1 no better than the level's mean field."""
    worst = 0.0
    for lv in range(data.shape[1]):
        spread = weighted_std(data[:, lv], lat)
        wrmse = field_errors(data[:, lv], decoded[:, lv], lat)["wrmse"]
        worst = max(worst, wrmse / spread if spread > 0 else (0.0 if wrmse == 0 else float("inf")))
    return worst
