"""Error and size measures for compressed fields (the measures compression studies report: docs/compression.md)."""

from __future__ import annotations

from typing import Any

import numpy as np

from postcast.datasets.geo import latitude_weights


def field_errors(data: np.ndarray, decoded: np.ndarray, lat: np.ndarray) -> dict[str, Any]:
    """Errors of ``decoded`` against ``data`` (..., H, W) with latitudes ``lat`` (H,): cos-latitude
    weighted RMSE (WeatherBench weights, mean 1), RMSE, MAE, max absolute error, PSNR over the data range."""
    err = decoded.astype(np.float64) - data.astype(np.float64)
    w = latitude_weights(lat, "cos")
    wmse = float((err**2 * w[:, None]).mean())
    mse = float((err**2).mean())
    rng = float(data.max() - data.min())
    return {"wrmse": wmse**0.5, "rmse": mse**0.5, "mae": float(np.abs(err).mean()),
            "max_abs": float(np.abs(err).max()), "psnr_db": 20 * np.log10(rng) - 10 * np.log10(max(mse, 1e-300))}
