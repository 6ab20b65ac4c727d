"""Geometry of the latitude-longitude grid, torch-free: latitude weights for area-weighted means.

One implementation for the whole project: :mod:`postcast.pipeline.metrics` re-exports
:func:`latitude_weights` (evaluation scores) and :mod:`postcast.compression.metrics` weights its
errors with it (the ``cos`` kind).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

LatitudeWeighting = Literal["area", "cos"]


def latitude_weights(lat: np.ndarray, kind: LatitudeWeighting = "area") -> np.ndarray:
    """Latitude weights normalised to mean 1 over the rows (WeatherBench 2 conventions).

    ``lat``: row latitudes in degrees (any order; the weights follow it), returned as float64 (H,).

    * ``area`` (default): the cell area ``sin(upper) - sin(lower)`` with bounds halfway between
      neighbouring rows (in sorted order), the outermost bounds clipped at +-90, so pole rows get
      their small cap (for a regular grid with spacing d: ``sin(90) - sin(90 - d/2)``);
    * ``cos``: ``cos(lat)`` (pole rows get exactly 0).

    A weighted mean over the grid is then ``(field * w[:, None]).mean()``.
    """
    lat = np.asarray(lat, dtype=np.float64)
    if kind == "cos":
        w = np.cos(np.deg2rad(lat))
    elif kind == "area":
        order = np.argsort(lat)
        s = lat[order]
        edges = np.concatenate([[-90.0], 0.5 * (s[1:] + s[:-1]), [90.0]])
        area = np.sin(np.deg2rad(edges[1:])) - np.sin(np.deg2rad(edges[:-1]))
        w = np.empty_like(area)
        w[order] = area
    else:
        msg = f"latitude weights {kind!r}: use 'area' or 'cos'"
        raise ValueError(msg)
    return w / w.mean()
