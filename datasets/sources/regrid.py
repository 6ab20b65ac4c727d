"""Regridding onto postcast's regular latitude/longitude grids, with well-kept libraries.

A source grid (:class:`SourceGrid`) is either *regular* (1-D latitude and longitude vectors: any
resolution, extent, latitude order, 0..360 or -180..180, crossing the date line) or a *point cloud*
(per-point latitude/longitude, as cfgrib returns reduced Gaussian grids: a 1-D ``values`` axis).
:func:`to_grid` maps fields ``(..., y, x)`` or ``(..., n)`` onto a :class:`schema.Grid`:

* regular -> regular: ``xarray.DataArray.interp`` (scipy), ``bilinear`` or ``nearest``; longitudes
  are made periodic by padding one column each side when the source is global in longitude;
* reduced Gaussian (rows of equally spaced points, ECMWF classic or octahedral): ``bilinear`` =
  ``interp`` along each row in longitude (periodic), then between rows in latitude, which is the
  bilinear rule on a reduced grid; target rows poleward of the outermost Gaussian row take that row;
* any point cloud: ``nearest`` with pyresample's KD-tree (``kd_tree.resample_nearest``);
* a projected regional grid (Lambert conformal, polar stereographic, rotated lat/lon: a point cloud with
  eccodes' per-point latitudes and longitudes, :meth:`SourceGrid.projected`): ``nearest``, onto the
  largest regular latitude/longitude grid that lies inside the projected domain (every stored value is
  the value of the source point nearest to it).

``conservative`` (onto a coarser grid): area-weighted means of the source points in each target
cell (xarray ``groupby`` for regular sources; ``np.bincount`` over point areas for reduced Gaussian
grids); a refinement or an unstructured point cloud raises ``ValueError`` naming what works.
No torch; pure numpy in, numpy out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import xarray as xr

from postcast.datasets import schema
from postcast.datasets.core.errors import ConfigError

METHODS = ("bilinear", "nearest", "conservative")
EARTH_RADIUS_M = 6_371_000.0


@dataclass(frozen=True, eq=False)
class SourceGrid:
    """Where a source's values sit: ``kind`` "regular" (``lat``/``lon`` are the axes) or "points"
    (``lat``/``lon`` per point); ``name`` describes it for the store and the forecast files."""

    kind: str
    lat: np.ndarray
    lon: np.ndarray
    name: str = ""
    rows: dict[str, Any] = field(default_factory=dict)
    spacing: float = 0.0  # a projected regional grid's median distance between neighbours (radians); 0: global

    @classmethod
    def regular(cls, lat: np.ndarray, lon: np.ndarray) -> SourceGrid:
        lat, lon = np.asarray(lat, np.float64), np.asarray(lon, np.float64)
        dlat = abs(float(lat[1] - lat[0])) if lat.size > 1 else 0.0
        name = (
            f"regular_ll {dlat:g} deg {lat.size}x{lon.size} lat {lat.min():g}..{lat.max():g} "
            f"lon {lon.min():g}..{lon.max():g}"
        )
        return cls("regular", lat, lon, name)

    @classmethod
    def points(cls, lat: np.ndarray, lon: np.ndarray, name: str = "") -> SourceGrid:
        lat, lon = np.asarray(lat, np.float64).ravel(), np.mod(np.asarray(lon, np.float64).ravel(), 360.0)
        rows = reduced_rows(lat)
        label = name or (f"reduced_gg {len(rows['lat'])} rows ({lat.size} points)" if rows else f"points ({lat.size})")
        return cls("points", lat, lon, label, rows)

    @classmethod
    def projected(cls, lat: np.ndarray, lon: np.ndarray, name: str) -> SourceGrid:
        """A regional grid on a map projection, as its points' latitudes and longitudes (storage order)."""
        lat, lon = np.asarray(lat, np.float64).ravel(), np.mod(np.asarray(lon, np.float64).ravel(), 360.0)
        distance, _ = _tree(lat, lon).query(_unit(lat, lon), k=2)
        return cls("points", lat, lon, name, spacing=float(np.median(distance[:, 1])))

    @property
    def regional(self) -> bool:
        return self.spacing > 0.0

    def inside(self, lat: np.ndarray, lon: np.ndarray) -> np.ndarray:
        """Whether each point (lat, lon) lies inside a projected source's domain: its nearest source point is
        within 3/4 of the source's spacing (a cell's centre is within 0.71 of it; outside, it soon is not)."""
        distance, _ = _tree(self.lat, self.lon).query(_unit(lat, lon))
        return np.asarray(distance <= 0.75 * self.spacing)

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.lat.size, self.lon.size) if self.kind == "regular" else (self.lat.size,)

    def is_grid(self, grid: schema.Grid) -> bool:
        """Whether this is exactly ``grid`` (ascending latitude, the grid's longitudes modulo 360): no regridding."""
        return (
            self.kind == "regular"
            and self.lat.size == grid.n_lat
            and self.lon.size == grid.n_lon
            and np.allclose(self.lat, grid.latitudes(), atol=1e-4)
            and np.allclose(np.mod(self.lon, 360.0), np.mod(grid.longitudes(), 360.0), atol=1e-4)
        )

    @property
    def is_global(self) -> bool:
        """Whether the source covers the globe (a point cloud is taken as a global reduced grid)."""
        return (self.kind != "regular" and not self.regional) or (
            _periodic(self.lon)
            and self.lat.min() <= -90 + _step(self.lat) + 1e-6
            and self.lat.max() >= 90 - _step(self.lat) - 1e-6
        )

    def covers(self, grid: schema.Grid) -> bool:
        """Whether every point of ``grid`` lies inside this source (regridding leaves no NaN edge)."""
        if self.is_global:
            return True
        if self.regional:
            tlat, tlon = np.meshgrid(grid.latitudes(), grid.longitudes(), indexing="ij")
            return bool(self.inside(tlat.ravel(), tlon.ravel()).all())
        lat, tol = grid.latitudes(), 1e-6
        if self.kind != "regular" or lat.min() < self.lat.min() - tol or lat.max() > self.lat.max() + tol:
            return self.kind != "regular"
        west = float(self.lon[0])
        span = np.mod(self.lon - west, 360.0).max()
        return bool((np.mod(grid.longitudes() - west + tol, 360.0) - tol <= span + tol).all())


def _unit(lat: np.ndarray, lon: np.ndarray) -> np.ndarray:
    """Points on the unit sphere (n, 3): chord distances between them are angles (radians) to 1e-4 relative
    at the spacing of a weather model's grid."""
    la, lo = np.radians(np.ravel(lat)), np.radians(np.ravel(lon))
    return np.stack([np.cos(la) * np.cos(lo), np.cos(la) * np.sin(lo), np.sin(la)], axis=-1)


def _tree(lat: np.ndarray, lon: np.ndarray) -> Any:
    from scipy.spatial import cKDTree

    return cKDTree(_unit(lat, lon))


def _step(axis: np.ndarray) -> float:
    return abs(float(axis[1] - axis[0])) if axis.size > 1 else 0.0


def reduced_rows(lat: np.ndarray) -> dict[str, Any]:
    """Rows of a reduced (Gaussian) grid given per-point latitudes in row order: ``lat`` per row and
    ``start``/``count`` of each row's points; empty when the points are not in rows."""
    change = np.flatnonzero(np.diff(lat) != 0) + 1
    start = np.concatenate([[0], change])
    count = np.diff(np.concatenate([start, [lat.size]]))
    if lat.size == 0 or len(start) < 2 or len(np.unique(lat[start])) != len(start):
        return {}
    return {"lat": lat[start], "start": start, "count": count}


def _periodic(lon: np.ndarray) -> bool:
    """Whether regular longitudes cover the whole circle (last + step == first + 360)."""
    if lon.size < 3:
        return False
    step = float(np.median(np.diff(np.sort(np.mod(lon, 360.0)))))
    return bool(abs(lon.size * step - 360.0) < 1e-6 * 360 + 1e-9)


def _regular_da(values: np.ndarray, lat: np.ndarray, lon: np.ndarray) -> xr.DataArray:
    """(..., y, x) values as a DataArray with ascending latitude and longitudes unwrapped so they
    increase (a date-line crossing 170..-170 becomes 170..190), padded periodically if global."""
    lon = np.asarray(lon, np.float64)
    lon_u = np.mod(lon - lon[0], 360.0) + lon[0]  # monotone from the first longitude (date line)
    order = np.argsort(lon_u)
    lon_u, values = lon_u[order], values[..., order]
    if _periodic(lon):
        values = np.concatenate([values[..., -1:], values, values[..., :1]], axis=-1)
        lon_u = np.concatenate([[lon_u[-1] - 360.0], lon_u, [lon_u[0] + 360.0]])
    dims = [f"d{i}" for i in range(values.ndim - 2)] + ["lat", "lon"]
    da = xr.DataArray(values, dims=dims, coords={"lat": lat, "lon": lon_u})
    return da.sortby("lat")


EDGE_TOL = 1e-6  # degrees: a target point this close outside a source's first or last row or column lies on it


def _onto(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Target coordinates ``x`` with those a rounding error outside ``lo..hi`` put on the edge (0.1 deg
    steps summed from 350 give 379.00000000000006 where the source's last column is 379: the column was NaN)."""
    x = np.where((x < lo) & (x > lo - EDGE_TOL), lo, x)
    return np.where((x > hi) & (x < hi + EDGE_TOL), hi, x)


def _interp_lon(da: xr.DataArray, target_lon: np.ndarray, method: Literal["linear", "nearest"]) -> xr.DataArray:
    """Interpolate in longitude to target longitudes 0..360, shifting each by 360 into the source's range
    (one a rounding error west of the first column is on it, not a turn east of it)."""
    lo, hi = float(da["lon"].min()), float(da["lon"].max())
    east = np.mod(target_lon - lo, 360.0)  # degrees east of the source's first column
    east = np.where(east > 360.0 - EDGE_TOL, 0.0, east)
    out = da.interp(lon=_onto(east + lo, lo, hi), method=method, kwargs={"fill_value": np.nan})
    return out.assign_coords(lon=target_lon)


def _regular(values: np.ndarray, src: SourceGrid, grid: schema.Grid, method: str) -> np.ndarray:
    if method == "conservative":
        return _cell_means(values, src, grid)
    da = _regular_da(values, src.lat, src.lon)
    interp: Literal["linear", "nearest"] = "linear" if method == "bilinear" else "nearest"
    lat = _onto(grid.latitudes(), float(da["lat"].min()), float(da["lat"].max()))
    out = _interp_lon(da, grid.longitudes(), interp).interp(lat=lat, method=interp, kwargs={"fill_value": np.nan})
    return np.asarray(out.values)


def _cell_means(values: np.ndarray, src: SourceGrid, grid: schema.Grid) -> np.ndarray:
    """Conservative (area-weighted mean) remapping to a coarser grid: each source point goes to the
    target cell holding its centre (xarray ``groupby``), weighted by cos(latitude)."""
    res_src = abs(float(src.lat[1] - src.lat[0]))
    if grid.resolution < 2 * res_src - 1e-9:
        msg = (
            f"conservative regridding averages source cells into coarser target cells ({res_src:g} deg -> "
            f"{grid.resolution:g} deg); to refine use method bilinear or nearest"
        )
        raise ConfigError(msg)
    dims = [f"d{i}" for i in range(values.ndim - 2)] + ["lat", "lon"]
    w = xr.DataArray(np.clip(np.cos(np.radians(src.lat)), 1e-6, None), dims=["lat"])
    south, west = float(grid.latitudes()[0]), float(grid.longitudes()[0])
    ilat = np.rint((src.lat - south) / grid.resolution).astype(int)
    ilon = np.rint(np.mod(src.lon - west, 360.0) / grid.resolution).astype(int)
    ilon = ilon % grid.n_lon if grid.is_global else ilon
    da = xr.DataArray(values, dims=dims, coords={"ilat": ("lat", ilat), "ilon": ("lon", ilon)})
    num = (da * w).groupby("ilat").sum().groupby("ilon").sum()
    den = (w * xr.ones_like(da.isel({d: 0 for d in dims[:-2]}, drop=True))).groupby("ilat").sum().groupby("ilon").sum()
    out = (num / den).reindex(ilat=np.arange(grid.n_lat), ilon=np.arange(grid.n_lon))
    return np.asarray(out.transpose(*dims[:-2], "ilat", "ilon").values)


def _reduced_cell_means(values: np.ndarray, src: SourceGrid, grid: schema.Grid) -> np.ndarray:
    """Conservative remapping from a reduced Gaussian grid to a coarser regular one: the area-weighted
    mean of the source points whose centres fall in each target cell. A point's area is its row's band
    (between the midpoints to the neighbouring rows, in sin latitude) divided by the row's point count.
    A pole row of a global target is one point: the mean over its polar cap; a cell no source point
    falls in takes the nearest point's value."""
    rows = src.rows
    spacing = 180.0 / len(rows["lat"])
    if grid.resolution < 2 * spacing - 1e-9:
        msg = (
            f"conservative regridding averages source cells into coarser target cells (~{spacing:.3g} deg -> "
            f"{grid.resolution:g} deg); to refine use method bilinear or nearest"
        )
        raise ConfigError(msg)
    row_lat = np.asarray(rows["lat"], np.float64)
    order = np.argsort(row_lat)
    edges = np.concatenate([[-90.0], (row_lat[order][1:] + row_lat[order][:-1]) / 2, [90.0]])
    band = np.empty(row_lat.size)
    band[order] = np.diff(np.sin(np.radians(edges)))
    area = np.repeat(band / rows["count"], rows["count"])  # (n,) steradians / 2 pi
    south, west = float(grid.latitudes()[0]), float(grid.longitudes()[0])
    ilat = np.rint((src.lat - south) / grid.resolution).astype(int)
    ilon = np.rint(np.mod(src.lon - west, 360.0) / grid.resolution).astype(int)
    ilon = ilon % grid.n_lon if grid.is_global else ilon
    poles = grid.is_global & ((ilat == 0) | (ilat == grid.n_lat - 1))
    ilon = np.where(poles, 0, ilon)  # a pole row is one point: the mean over its cap, spread below
    inside = (ilat >= 0) & (ilat < grid.n_lat) & (ilon >= 0) & (ilon < grid.n_lon)
    cell, n_cells = (ilat * grid.n_lon + ilon)[inside], grid.n_lat * grid.n_lon
    den = np.bincount(cell, weights=area[inside], minlength=n_cells)
    flat = values.reshape(-1, values.shape[-1])[:, inside]  # (fields, points inside)
    num = np.stack([np.bincount(cell, weights=area[inside] * f, minlength=n_cells) for f in flat])
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan).reshape(-1, *grid.shape)
    if grid.is_global:
        out[:, [0, -1]] = out[:, [0, -1], :1]
    empty = den.reshape(grid.shape) == 0
    if grid.is_global:
        empty[[0, -1]] = empty[[0, -1], :1]
    if empty.any():  # cells no source centre falls in (target close to the source spacing): nearest point
        out[:, empty] = _nearest_points(values.reshape(-1, values.shape[-1]), src, grid)[:, empty]
    return out.reshape(*values.shape[:-1], *grid.shape)


def _reduced(values: np.ndarray, src: SourceGrid, grid: schema.Grid) -> np.ndarray:
    """Bilinear on a reduced grid: each row interpolated in longitude (periodic), then in latitude."""
    rows, tlon = src.rows, grid.longitudes()
    per_row = []
    for start, count in zip(rows["start"], rows["count"], strict=True):
        lon = src.lon[start : start + count]
        row = _regular_da(values[..., None, start : start + count], np.zeros(1), lon).isel(lat=0)
        per_row.append(_interp_lon(row, tlon, "linear").values)
    stacked = np.stack(per_row, axis=-2)  # (..., rows, target lon)
    da = _regular_da_lat(stacked, rows["lat"], tlon)
    lat = grid.latitudes()
    clipped = np.clip(lat, float(da["lat"].min()), float(da["lat"].max()))  # poleward: outermost row
    return np.asarray(da.interp(lat=clipped, method="linear").values)


def _regular_da_lat(values: np.ndarray, lat: np.ndarray, lon: np.ndarray) -> xr.DataArray:
    dims = [f"d{i}" for i in range(values.ndim - 2)] + ["lat", "lon"]
    return xr.DataArray(values, dims=dims, coords={"lat": lat, "lon": lon}).sortby("lat")


def _nearest_points(values: np.ndarray, src: SourceGrid, grid: schema.Grid) -> np.ndarray:
    from pyresample import geometry, kd_tree

    source = geometry.SwathDefinition(lons=_lon180(src.lon), lats=src.lat)
    tlon, tlat = np.meshgrid(grid.longitudes(), grid.latitudes())
    target = geometry.GridDefinition(lons=_lon180(tlon), lats=tlat)  # (a regional grid's may pass 540 deg east)
    radius = 4.0 * np.radians(max(grid.resolution, 180.0 / max(len(src.rows.get("lat", [])), 1))) * EARTH_RADIUS_M
    radius = 0.75 * src.spacing * EARTH_RADIUS_M if src.regional else radius  # NaN outside a projected domain
    flat = values.reshape(-1, values.shape[-1])  # (fields, n)
    # reduce_data=False: pyresample's default first drops the source points outside the target's latitude /
    # longitude box, and with them the nearest point of a target at the box's edge (a NaN inside the domain)
    out = kd_tree.resample_nearest(
        source, np.moveaxis(flat, 0, -1), target, radius_of_influence=radius, fill_value=None, reduce_data=False
    )
    out = np.ma.filled(np.ma.asarray(out, dtype=np.float64), np.nan)  # (y, x[, fields])
    out = out[..., None] if out.ndim == 2 else out
    return np.moveaxis(out, -1, 0).reshape(*values.shape[:-1], *grid.shape)


def _lon180(lon: np.ndarray) -> np.ndarray:
    """Longitudes (any number of turns east) in -180..180, as pyresample takes them."""
    return np.mod(lon + 180.0, 360.0) - 180.0


def to_grid(values: np.ndarray, src: SourceGrid, grid: schema.Grid, method: str = "bilinear") -> np.ndarray:
    """Fields on ``src`` -> fields on ``grid`` (float32, latitude ascending, longitude 0..360).

    ``values``: (..., y, x) for a regular source, (..., n) for points. NaN where the source does
    not cover the target (a regional source) or where the source is NaN (SST over land)."""
    if method not in METHODS:
        msg = f"regridding method {method!r}: use one of {', '.join(METHODS)}"
        raise ConfigError(msg)
    values = np.asarray(values, dtype=np.float64)
    if src.kind == "regular":
        if src.is_grid(grid):
            return values.astype(np.float32)
        out = _regular(values, src, grid, method)
    elif method == "nearest" or not src.rows:
        out = _nearest_points(values, src, grid)
    elif method == "bilinear":
        out = _reduced(values, src, grid)
    else:
        out = _reduced_cell_means(values, src, grid)
    return out.astype(np.float32)


def default_grid(src: SourceGrid) -> schema.Grid:
    """The grid a source is stored on when the user names none: its own grid when that is a regular
    one postcast can hold (global, or regional at a resolution dividing 180 deg), else the closest
    such resolution (global for point clouds, over the source's area for regional sources)."""
    if src.kind == "regular" and src.lat.size > 1:
        res = _step(src.lat)
    elif src.regional:
        res = float(np.degrees(src.spacing))
    else:
        n_rows = len(src.rows.get("lat", [])) or int(np.sqrt(src.lat.size / 2))
        res = 180.0 / max(n_rows, 1)
    choices = (0.1, 0.125, 0.2, 0.25, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 9.0, 10.0)
    near = min(choices, key=lambda c: abs(c - res))
    return grid_at(src, res if abs(near - res) < 1e-6 else near)


def grid_at(src: SourceGrid, resolution: float) -> schema.Grid:
    """The grid at ``resolution`` over the source: global when the source is global, else the
    largest regional grid of that resolution inside the source's area."""
    if src.is_global:
        return schema.Grid(resolution)
    if src.regional:
        return _inside_projected(src, resolution)
    r = resolution
    lon_u = np.mod(src.lon - src.lon[0], 360.0) + np.mod(src.lon[0], 360.0)  # increasing from the first
    south, north = np.ceil(src.lat.min() / r - 1e-6) * r, np.floor(src.lat.max() / r + 1e-6) * r
    west, east = np.ceil(lon_u.min() / r - 1e-6) * r, np.floor(lon_u.max() / r + 1e-6) * r
    shift = np.floor(west / 360.0) * 360.0  # west into 0..360
    try:
        return schema.Grid(r, (float(south), float(north), float(west - shift), float(east - shift)))
    except ValueError as err:
        msg = f"{src.name}: no {r:g} deg grid fits inside this source ({err}); choose another --grid"
        raise ConfigError(msg) from err


def _inside_projected(src: SourceGrid, r: float) -> schema.Grid:
    """The largest regular grid of resolution ``r`` whose every point lies inside a projected domain: the
    largest rectangle of inside points of the ``r`` grid over the domain's latitude/longitude box; a domain
    holding a pole gets every longitude up to that pole, so a cap round it can be chosen."""
    centre = np.degrees(np.angle(np.exp(1j * np.radians(src.lon)).mean()))  # the circular mean longitude
    lon_u = centre + np.mod(src.lon - centre + 180.0, 360.0) - 180.0  # unwrapped around it
    poles = src.inside(np.array([-90.0, 90.0]), np.zeros(2))  # (south, north): whether the domain holds each
    south, north = -90.0 if poles[0] else src.lat.min(), 90.0 if poles[1] else src.lat.max()
    lat = np.arange(np.ceil(south / r - 1e-6), np.floor(north / r + 1e-6) + 1) * r
    lon = np.arange(np.ceil(lon_u.min() / r - 1e-6), np.floor(lon_u.max() / r + 1e-6) + 1) * r
    if poles.any():  # a cap round the pole: every longitude, once
        lon = lon[0] + np.arange(round(360.0 / r)) * r
    tlat, tlon = np.meshgrid(lat, lon, indexing="ij")
    rows, cols = _largest_rectangle(src.inside(tlat.ravel(), tlon.ravel()).reshape(tlat.shape))
    if rows.stop - rows.start < 2 or cols.stop - cols.start < 2:
        msg = f"{src.name}: no {r:g} deg grid of 2 x 2 points fits inside this source; choose a finer --grid"
        raise ConfigError(msg)
    west = float(lon[cols.start])
    shift = np.floor(west / 360.0) * 360.0  # west into 0..360
    area = (float(lat[rows.start]), float(lat[rows.stop - 1]), west - shift, float(lon[cols.stop - 1]) - shift)
    return schema.Grid(r, area)


def _largest_rectangle(mask: np.ndarray) -> tuple[slice, slice]:
    """The rows and columns of the largest all-True rectangle of a 2-D mask (by points; the histogram
    method: for each row, the largest rectangle under the heights of True runs ending there)."""
    best, found = 0, (slice(0, 0), slice(0, 0))
    heights = np.zeros(mask.shape[1] + 1, dtype=int)  # a 0 sentinel closes every bar at the end
    for i, row in enumerate(mask):
        heights[:-1] = np.where(row, heights[:-1] + 1, 0)
        stack: list[int] = []
        for j, h in enumerate(heights):
            start = j
            while stack and heights[stack[-1]] >= h:
                top = stack.pop()
                start = stack[-1] + 1 if stack else 0
                if heights[top] * (j - start) > best:
                    best = int(heights[top] * (j - start))
                    found = (slice(i - heights[top] + 1, i + 1), slice(start, j))
            stack.append(j)
    return found


def coverage(src: SourceGrid) -> str:
    """Latitude/longitude extent of a source, for messages."""
    return f"lat {src.lat.min():g}..{src.lat.max():g}, lon {src.lon.min():g}..{src.lon.max():g}"
