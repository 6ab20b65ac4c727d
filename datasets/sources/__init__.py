"""Raw forecasts and truth, opened in one place: one module per source kind, the registry beside them.

``kinds`` tells a zarr store, netCDF and GRIB files apart; ``registry.discover`` picks the source of a
path; ``grib`` (decoding in ``messages``), ``netcdf`` (netCDF and zarr through xarray) and ``truth`` are
the source kinds, each a :class:`~postcast.datasets.sources.base.ForecastSource` (or truth source);
``conventions`` normalises names, latitude order and units at this boundary and ``regrid`` maps other
grids onto the store grid. The names below are the package's interface: callers write
``sources.discover(...)`` and ``sources.Plan``.
"""

from postcast.datasets.sources.base import Expectation, ForecastSource, Plan, check_values
from postcast.datasets.sources.grib import GribSource
from postcast.datasets.sources.kinds import find_sources, kind_of, truth_paths
from postcast.datasets.sources.netcdf import XarraySource, open_raw
from postcast.datasets.sources.registry import Discovered, discover
from postcast.datasets.sources.truth import TruthSource

__all__ = [
    "Discovered",
    "Expectation",
    "ForecastSource",
    "GribSource",
    "Plan",
    "TruthSource",
    "XarraySource",
    "check_values",
    "discover",
    "find_sources",
    "kind_of",
    "open_raw",
    "truth_paths",
]
