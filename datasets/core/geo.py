"""Geometry of the latitude-longitude grid, torch-free: the regular :class:`Grid` (ENS-10's 0.5 deg and any
other spacing or regional area), latitude weights for area-weighted means, and the one check of a file's
coordinates (:func:`coordinate_problems`: finite, in range, each once, monotonic) that ingest, the forecast
archive's reader and the service share.

One implementation for the whole project: :mod:`postcast.pipeline.verify.scores` re-exports
:func:`latitude_weights` (evaluation scores) and :mod:`postcast.compression.metrics` weights its
errors with it (the ``cos`` kind).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
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


LON_RANGE = (-360.0, 720.0)  # degrees east: -180..180, 0..360, and a regional grid unwrapped across the date line
DEG_TOL = 1e-4  # degrees: float32 coordinates of 90 or 360 written by other tools


def _first(mask: np.ndarray, values: np.ndarray) -> str:
    """'3 values, first 91.5 at index 12' for the values where ``mask`` holds."""
    k = int(np.argmax(mask))
    return f"{int(mask.sum())} value{'s' * (int(mask.sum()) > 1)}, first {values[k]:g} at index {k}"


def _axis_order(name: str, values: np.ndarray, steps: np.ndarray) -> str | None:
    """Why an axis whose successive ``steps`` these are is not strictly monotonic (None when it is)."""
    if (steps > 0).all() or (steps < 0).all():
        return None
    same = steps == 0
    if same.any():
        k = int(np.argmax(same))
        return f"{name} repeated ({values[k]:g} at indices {k} and {k + 1})"
    k = int(np.argmax(np.sign(steps) != np.sign(steps[0])))
    return f"{name} not monotonic ({values[k]:g}, {values[k + 1]:g} at indices {k}, {k + 1} after steps the other way)"


def coordinate_problems(lat: np.ndarray, lon: np.ndarray, *, points: bool = False) -> list[str]:
    """What is wrong with a grid's coordinates, in words ([] when nothing): every latitude and longitude
    finite, latitudes in -90..90 and longitudes in -360..720; for 1-D axes (``points`` False), each
    latitude once and in one direction, and each longitude once modulo 360 and in one direction around the
    circle (a grid across the date line, 170..190 or 170..-170, is monotonic). ``points``: per-point
    coordinates (a reduced Gaussian or projected grid), only finite and in range."""
    out = []
    for name, values, lo, hi in (("latitude", lat, -90.0, 90.0), ("longitude", lon, *LON_RANGE)):
        v = np.asarray(values, dtype=np.float64).ravel()
        if not np.isfinite(v).all():
            out.append(f"{name} not finite ({_first(~np.isfinite(v), v)})")
            continue
        outside = (v < lo - DEG_TOL) | (v > hi + DEG_TOL)
        if outside.any():
            out.append(f"{name} outside {lo:g}..{hi:g} ({_first(outside, v)})")
            continue
        if points or v.size < 2:
            continue
        steps = np.diff(v) if name == "latitude" else _circle_steps(v)
        order = _axis_order(name, v, steps)
        if order:
            out.append(order)
    return out


def _circle_steps(lon: np.ndarray) -> np.ndarray:
    """Successive steps of longitudes around the circle, eastward positive, each in (-180, 180]; a repeat
    modulo 360 is a step of 0. Their sum spans less than one turn when the axis goes once around."""
    steps = np.mod(np.diff(lon) + 180.0, 360.0) - 180.0
    steps = np.where(steps == -180.0, 180.0, steps)
    turn = np.abs(np.cumsum(steps))
    return np.where(turn >= 360.0 - DEG_TOL, 0.0, steps)  # back at the first meridian: a repeat


@dataclass(frozen=True)
class Grid:
    """A regular latitude/longitude grid: global with both poles (ENS-10: 0.5 deg, 361 x 720), or
    regional with ``area = (south, north, west, east)`` in degrees, edges included. Regional
    longitudes increase from ``west`` (0..360) and may pass 360 (a grid across the date line)."""

    resolution: float = 0.5  # degrees
    area: tuple[float, float, float, float] | None = None  # (south, north, west, east); None: global

    def __post_init__(self) -> None:
        r = self.resolution
        divides = math.isfinite(r) and 0 < r <= 180 and all(abs(x / r - round(x / r)) <= 1e-9 for x in (180.0, 360.0))
        if not divides:  # (0, NaN and inf checked before dividing: 0.0 was a ZeroDivisionError, inf a 1-point grid)
            msg = f"grid resolution {self.resolution} deg does not divide 180 and 360; use e.g. 0.5, 1, 2, 2.5, 3, 4, 5"
            raise ValueError(msg)
        if self.area is not None:
            self._check_area(tuple(float(a) for a in self.area))

    def _check_area(self, area: tuple[float, ...]) -> None:
        s, n, w, e = area
        spans = ((n - s) / self.resolution, (e - w) / self.resolution)
        if not (
            -90 <= s < n <= 90 and 0 <= w < 360 and w < e < w + 360 and all(abs(x - round(x)) < 1e-6 for x in spans)
        ):
            msg = (
                f"grid area {list(area)} (south, north, west, east): need -90 <= south < north <= 90, "
                f"0 <= west < 360, west < east < west + 360, spans that are multiples of {self.resolution:g} deg"
            )
            raise ValueError(msg)

    @property
    def is_global(self) -> bool:
        return self.area is None

    @property
    def n_lat(self) -> int:
        if self.area is not None:
            return round((self.area[1] - self.area[0]) / self.resolution) + 1
        return round(180.0 / self.resolution) + 1

    @property
    def n_lon(self) -> int:
        if self.area is not None:
            return round((self.area[3] - self.area[2]) / self.resolution) + 1
        return round(360.0 / self.resolution)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n_lat, self.n_lon)

    def latitudes(self) -> np.ndarray:
        """Ascending latitudes (canonical order), float64, degrees north."""
        if self.area is not None:
            return self.area[0] + np.arange(self.n_lat, dtype=np.float64) * self.resolution
        return np.linspace(-90.0, 90.0, self.n_lat)

    def longitudes(self) -> np.ndarray:
        west = self.area[2] if self.area is not None else 0.0
        return west + np.arange(self.n_lon, dtype=np.float64) * self.resolution

    def describe(self) -> str:
        """For provenance and messages: 'regular_ll 1 deg global 181x360' or '... lat 30..70 lon 340..400 41x61'."""
        where = (
            "global"
            if self.area is None
            else (f"lat {self.area[0]:g}..{self.area[1]:g} lon {self.area[2]:g}..{self.area[3]:g}")
        )
        return f"regular_ll {self.resolution:g} deg {where} {self.n_lat}x{self.n_lon}"

    @classmethod
    def from_coords(cls, lat: np.ndarray, lon: np.ndarray, *, regional: bool = False) -> Grid:
        """Recognise a regular global grid from coordinates (with ``regional``, also an evenly spaced
        regional one), or raise ``ValueError`` naming the problem."""
        lat = np.sort(np.asarray(lat, dtype=np.float64))
        lon = np.asarray(lon, dtype=np.float64)
        if lat.size < 3 or lon.size < 3:
            msg = f"grid too small: {lat.size} latitudes x {lon.size} longitudes"
            raise ValueError(msg)
        res = float(lat[1] - lat[0])
        grid = cls(round(res, 6))
        if regional and (lat.size != grid.n_lat or lon.size != grid.n_lon):
            return cls._regional(lat, lon, grid.resolution)
        if lat.size != grid.n_lat or lon.size != grid.n_lon:
            msg = (
                f"not a global {res} deg grid: got {lat.size} x {lon.size} points, expected "
                f"{grid.n_lat} x {grid.n_lon} (latitude -90..90 with both poles, longitude 0..360)"
            )
            raise ValueError(msg)
        if not (np.allclose(lat, grid.latitudes(), atol=1e-4) and np.allclose(lon, grid.longitudes(), atol=1e-4)):
            msg = (
                f"grid coordinates are not the regular {res} deg grid (latitude {lat[0]}..{lat[-1]}, "
                f"longitude {lon[0]}..{lon[-1]}); regrid to a global regular grid first"
            )
            raise ValueError(msg)
        return grid

    @classmethod
    def _regional(cls, lat: np.ndarray, lon: np.ndarray, res: float) -> Grid:
        """An evenly spaced regional grid (longitudes in their order, unwrapped from the first)."""
        lon_u = np.mod(lon - lon[0], 360.0) + np.mod(lon[0], 360.0)
        s, n, w, e = (round(float(x), 6) for x in (lat[0], lat[-1], lon_u[0], lon_u[-1]))
        area = (s, n, w, e)
        grid = cls(res, area)
        if not (np.allclose(lat, grid.latitudes(), atol=1e-4) and np.allclose(lon_u, grid.longitudes(), atol=1e-4)):
            msg = (
                f"not an evenly spaced {res:g} deg grid (latitude {lat[0]}..{lat[-1]}, longitude "
                f"{lon[0]}..{lon[-1]} in steps of {res:g})"
            )
            raise ValueError(msg)
        return grid
