"""A forecast-only source for the tests that bring their own truth file."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import xarray as xr

from postcast.datasets.synth import synthfiles
from postcast.datasets.synth.synthetic import SynthConfig


def forecast_only(cfg: SynthConfig, root: Path) -> tuple[Path, pd.DatetimeIndex, Path]:
    """``cfg``'s synthetic world under ``root``: a source folder holding only its forecast zarr (linked), the
    init times, and the forecast zarr itself."""
    synthfiles.write_synthetic(cfg, root / "raw", progress=False)
    zarr_path = root / "raw" / "forecast.zarr"
    src = root / "fc"
    src.mkdir()
    (src / "forecast.zarr").symlink_to(zarr_path)
    inits = pd.DatetimeIndex(xr.open_zarr(zarr_path, consolidated=False)["time"].values)
    return src, inits, zarr_path
