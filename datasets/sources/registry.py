"""The registry of source kinds and the one place postcast opens raw data: GRIB, netCDF and zarr forecasts, truth.

:func:`discover` looks at a path and returns a :class:`ForecastSource` plus optional truth and
oracle sources. Every source answers two questions:

* :meth:`ForecastSource.plan`: what does it hold, and is it complete? (metadata only; raises
  :class:`MissingInputError` listing *every* missing member x step x level x variable per date);
* :meth:`ForecastSource.load`: one init time as a canonical, numpy-backed dataset
  (dims ``init_time=1, member, step, [level], latitude, longitude``), values checked.

Sources are small and picklable, so dask workers can load dates in parallel.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from postcast.datasets.core.errors import MissingInputError
from postcast.datasets.sources.base import ForecastSource
from postcast.datasets.sources.grib import GribSource
from postcast.datasets.sources.kinds import GRIB_SUFFIXES, is_grib, is_netcdf, kind_of, truth_paths
from postcast.datasets.sources.netcdf import XarraySource
from postcast.datasets.sources.truth import TruthSource


# --- discovery -----------------------------------------------------------------------------------
@dataclass
class Discovered:
    forecast: ForecastSource
    truth: TruthSource | None
    oracle: TruthSource | None


def discover(path: str | Path, *, truth: str | Path | None = None) -> Discovered:
    """Find the forecast, truth and oracle sources under ``path`` (a directory written by
    ``postcast synth``, a directory of ENS-10 GRIB/netCDF files, a zarr store or a single file)."""
    p = Path(path)
    if not p.exists():
        msg = f"{p}: no such file or directory"
        raise MissingInputError(msg)
    forecast: ForecastSource
    found_truth: list[Path] = []
    oracle = None
    if p.is_dir() and kind_of(p) != "zarr":
        gribs = sorted(q for q in p.iterdir() if is_grib(q))
        ncs = sorted(q for q in p.iterdir() if q.name.startswith("output.") and is_netcdf(q))
        if (p / "forecast.zarr").exists():
            forecast = XarraySource([p / "forecast.zarr"])
        elif gribs:
            forecast = GribSource(gribs)
        elif ncs:
            forecast = XarraySource(ncs)
        else:
            msg = (
                f"{p}: no forecasts found; expected GRIB files (ENS-10's output.pl.2018MMDD and "
                f"output.sfc.2018MMDD, or {', '.join('*' + s for s in GRIB_SUFFIXES)}), output.*.nc files or "
                "forecast.zarr"
            )
            raise MissingInputError(msg)
        if (p / "era5.zarr").exists():
            found_truth = [p / "era5.zarr"]
        elif (p / "era5").is_dir():
            found_truth = sorted((p / "era5").glob("*.nc"))
        if (p / "oracle.zarr").exists():
            oracle = TruthSource([p / "oracle.zarr"], oracle=True)
    elif kind_of(p) in ("zarr", "netcdf"):
        forecast = XarraySource([p])
    else:
        forecast = GribSource([p])
    if truth is not None:
        found_truth = truth_paths(truth)
    return Discovered(forecast, TruthSource(found_truth) if found_truth else None, oracle)
