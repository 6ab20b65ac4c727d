"""What every postcast map shares (the service's ``/map.png`` and the report's CRPS maps): coastlines,
latitude/longitude axes and a colour scale that fits the quantity drawn.

Coastlines: Natural Earth's 1:110m land outline (public domain), shipped in ``geo/coastline_110m.npz``
(built by ``scripts/coastline_npz.py`` from the npm package world-atlas 2.0.2): one (N, 2) float32
array of (longitude, latitude) degrees, a NaN row between lines. Nothing is downloaded at run time.

Colour scales: sequential for amounts, speeds, probabilities, spreads and scores (one end is "none");
diverging only around a meaningful zero (anomalies, skill differences)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from postcast.datasets import schema

COASTLINE_FILE = Path(__file__).with_name("geo") / "coastline_110m.npz"
COASTLINE_GID = "coastline"  # the artist's gid: tests find the drawn coastline by it
COASTLINE_SOURCE = "Natural Earth 1:110m (public domain)"


@lru_cache(maxsize=1)
def _coastline() -> np.ndarray:
    with np.load(COASTLINE_FILE, allow_pickle=False) as z:
        return np.asarray(z["lonlat"], dtype=np.float64)  # (N, 2) degrees, NaN rows between lines


def coastline(lon_min: float = -180.0) -> tuple[np.ndarray, np.ndarray]:
    """The coastline's (x, y) for a map whose longitudes start at ``lon_min`` (-180: -180..180; 0: 0..360),
    NaN between lines and where a line crosses the map's edge."""
    lonlat = _coastline()
    x = (lonlat[:, 0] - lon_min) % 360.0 + lon_min  # into [lon_min, lon_min + 360)
    y = lonlat[:, 1].copy()
    jump = np.abs(np.diff(x)) > 180.0  # a segment that would cross the whole map: cut it
    x, y = np.insert(x, np.flatnonzero(jump) + 1, np.nan), np.insert(y, np.flatnonzero(jump) + 1, np.nan)
    return x, y


def draw_coastlines(ax: Any, lon: np.ndarray, lat: np.ndarray) -> Any:
    """Coastlines over a map of the grid (``lon``, ``lat`` in degrees), with degree axes and labels;
    returns the coastline's artist (gid :data:`COASTLINE_GID`)."""
    lon_min = -180.0 if float(np.min(lon)) < 0.0 else 0.0
    x, y = coastline(lon_min)
    (line,) = ax.plot(x, y, color="black", lw=0.6, gid=COASTLINE_GID)
    ax.set_xlim(float(np.min(lon)), float(np.max(lon)))
    ax.set_ylim(float(np.min(lat)), float(np.max(lat)))
    ax.set_xlabel("longitude (deg E)")
    ax.set_ylabel("latitude (deg N)")
    return line


@dataclass(frozen=True)
class Scale:
    """A colour scale: the matplotlib colour map, its limits (None: from the data) and what it shows."""

    cmap: str
    vmin: float | None
    vmax: float | None
    kind: str  # "sequential" or "diverging"


PROBABILITY = Scale("YlGnBu", 0.0, 1.0, "sequential")


def scale_for(target: str, quantity: str, values: np.ndarray) -> Scale:
    """The colour scale for ``quantity`` (mean, spread, quantile, probability) of ``target``: a
    probability on 0..1; a spread from 0; a non-negative target (rain, wind speed) from 0 in its colour map
    (:attr:`schema.Target.colour_map`); any other field sequential over its range (a temperature in K or a
    geopotential is no anomaly)."""
    if quantity == "probability":
        return PROBABILITY
    finite = values[np.isfinite(values)]
    hi = float(np.max(finite)) if finite.size else 1.0
    if quantity == "spread":
        return Scale("viridis", 0.0, hi, "sequential")
    tg = schema.TARGETS.get(target)  # a file's target may be one this version does not know
    if tg is not None and tg.colour_map is not None:
        return Scale(tg.colour_map, min(0.0, float(np.min(finite))) if finite.size else 0.0, hi, "sequential")
    return Scale("plasma", None, None, "sequential")


def diverging(values: np.ndarray) -> Scale:
    """A diverging scale symmetric around zero (a skill, an anomaly)."""
    finite = np.abs(values[np.isfinite(values)])
    lim = max(1.0, float(np.max(finite))) if finite.size else 1.0
    return Scale("RdBu", -lim, lim, "diverging")
