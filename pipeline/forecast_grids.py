"""The grids of a forecast (:mod:`postcast.pipeline.forecast`): the one a checkpoint was trained on
(:func:`model_grid`), the input's own (:func:`input_grid`) and, with ``--on-input-grid``, the one the products are
written back on (:func:`output_grid`, cut to a regional checkpoint's area), and a law's parameter maps regridded
onto it (:func:`regrid_params`)."""

from __future__ import annotations

import numpy as np

from postcast.datasets import schema, sources
from postcast.datasets.core.errors import ConfigError
from postcast.datasets.sources import regrid
from postcast.models.module import PostProcessor


def model_grid(model: PostProcessor) -> schema.Grid:
    """The grid a checkpoint was trained on: global from its (H, W), or regional from its recorded area."""
    n_lat, area = model.meta.grid[0], model.meta.grid_area  # (H, W); (south, north, west, east) or None
    if area is None:
        return schema.Grid(180.0 / (n_lat - 1))
    south, north, west, east = area
    return schema.Grid(round((north - south) / (n_lat - 1), 6), (south, north, west, east))


def input_grid(plan: sources.Plan) -> schema.Grid:
    """The input's own grid when it is a regular one (global or regional; a CF file here holds no other)."""
    src = plan.source_grid
    assert src is not None
    grid = regrid.default_grid(src)
    if not src.is_grid(grid):
        msg = (
            f"--on-input-grid: the input is on {src.name}, not a regular latitude/longitude grid; "
            "write on the checkpoint's grid (drop the option)"
        )
        raise ConfigError(msg)
    return grid


def output_grid(plan: sources.Plan, model: PostProcessor) -> schema.Grid:
    """``--on-input-grid``: the input's grid, cut to the checkpoint's area when the checkpoint is
    regional (outside it the model says nothing: the product would be NaN there, and the service's
    reader refuses a product with NaN)."""
    back = input_grid(plan)
    area = model.meta.grid_area
    if area is None:
        return back
    south, north, west, east = area
    lat = np.round(back.latitudes(), 6)
    lat = lat[(lat >= south - 1e-6) & (lat <= north + 1e-6)]
    lon = np.round(west + np.mod(np.round(back.longitudes() - west, 6), 360.0), 6)  # into [west, west + 360)
    lon = np.sort(lon[lon <= east + 1e-6])
    if lat.size < 2 or lon.size < 2:
        msg = (
            f"--on-input-grid: the input's grid ({back.describe()}) has fewer than 2 x 2 points in the "
            f"checkpoint's area {model_grid(model).describe()}; drop the option (products on the checkpoint's grid)"
        )
        raise ConfigError(msg)
    return schema.Grid(back.resolution, (float(lat[0]), float(lat[-1]), float(lon[0]), float(lon[-1])))


def regrid_params(values: np.ndarray, src: regrid.SourceGrid, back: schema.Grid, method: str) -> np.ndarray:
    """A parameter map (lat, lon) or (K, lat, lon) on ``back``: each (lat, lon) slice regridded. The
    methods average with non-negative weights, so positive scales and increasing coefficients stay so."""
    if values.ndim == 3:
        return np.stack([regrid_params(v, src, back, method) for v in values])
    return regrid.to_grid(values, src, back, method).astype(np.float64)
