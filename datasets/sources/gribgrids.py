"""The grids of GRIB messages: which grid an index's messages share (:func:`grid_of`: regular lat/lon in
any scanning order, regular Gaussian, reduced Gaussian / lat-lon as points, Lambert conformal, polar
stereographic and rotated lat/lon as projected points; other grid types refused in one line naming them)
and a message's values in the grid's order (:func:`in_grid_order`)."""

from __future__ import annotations

import os

# isort: off
import pyproj  # noqa: F401  (before eccodes: see messages.py)
import eccodes

# isort: on
import numpy as np
import pandas as pd

from postcast.datasets.core.errors import BadInputError
from postcast.datasets.sources import regrid

# the scanning flags as bits (GRIB's scanning mode keys; GRIB1 has no alternate rows)
SCAN_BITS = {"iScansNegatively": 8, "jScansPositively": 4, "jPointsAreConsecutive": 2, "alternativeRowScanning": 1}


def scan_flags(h: int) -> int:
    """The scanning flags of a message as bits (:data:`SCAN_BITS`; GRIB1 has no alternate rows: 0)."""
    return sum(
        bit for key, bit in SCAN_BITS.items() if eccodes.codes_is_defined(h, key) and eccodes.codes_get_long(h, key)
    )


PROJECTED = {  # regional grids on a map projection: read as points, regridded (nearest) inside their domain
    "lambert": "Lambert conformal",
    "polar_stereographic": "polar stereographic",
    "rotated_ll": "rotated latitude/longitude",
}
REGRIDDED_ELSEWHERE = {"sh": "spherical harmonics"}


def grid_of(index: pd.DataFrame, path: str | os.PathLike[str]) -> regrid.SourceGrid:
    """The grid shared by every message of an index (regular lat/lon of any extent and scan order, a
    regular Gaussian grid, or reduced Gaussian / lat-lon as per-point coordinates), or :class:`BadInputError`
    (another grid type is named, with what to do)."""
    shapes = index[
        ["grid_type", "ni", "nj", "n_values", "lat_first", "lat_last", "lon_first", "lon_last", "scan"]
    ].drop_duplicates()
    if len(shapes) != 1:
        msg = f"{path}: messages on {len(shapes)} different grids; split the file by grid (grib_copy)"
        raise BadInputError(msg)
    gtype, ni, nj, _, la0, la1, lo0, lo1, scan = shapes.iloc[0]
    if gtype == "regular_ll":
        lat = np.sort(np.linspace(la0, la1, int(nj)))  # decode returns latitude ascending
        return regrid.SourceGrid.regular(lat, _longitudes(int(ni), lo0, lo1, int(scan)))
    if gtype == "regular_gg":
        return _gaussian(index, path, shapes.iloc[0])
    if gtype in ("reduced_gg", "reduced_ll"):
        return regrid.SourceGrid.points(*_point_coords(_first_message(index, path)))
    if gtype in PROJECTED:
        lat, lon, _ = _point_coords(_first_message(index, path))
        return regrid.SourceGrid.projected(lat, lon, f"{gtype} ({PROJECTED[gtype]}) {ni}x{nj}")
    what = f" ({REGRIDDED_ELSEWHERE[gtype]})" if gtype in REGRIDDED_ELSEWHERE else ""
    msg = (
        f"{path}: gridType {gtype}{what} is not read by postcast (it reads regular_ll, regular_gg, reduced_gg, "
        f"reduced_ll, {', '.join(PROJECTED)}): regrid the file to a regular latitude/longitude grid first, "
        "e.g. cdo remapbil,r360x181"
    )
    raise BadInputError(msg)


def _longitudes(ni: int, first: float, last: float, scan: int) -> np.ndarray:
    """The ``ni`` longitudes west to east of a regular row from its first and last points (swapped when
    i scans negatively), evenly spaced across 360/180 freely, whatever increment the header states."""
    west, east = (last, first) if scan & SCAN_BITS["iScansNegatively"] else (first, last)
    span = np.mod(east - west, 360.0) or 360.0
    return west + np.arange(ni) * (span / (ni - 1) if ni > 1 else 0.0)


def _gaussian(index: pd.DataFrame, path: str | os.PathLike[str], shape: pd.Series) -> regrid.SourceGrid:
    """A regular Gaussian grid as per-point coordinates in storage order: its rows are the Gaussian latitudes
    of N between the first and last rows, its columns evenly spaced. The header's increments may be wrong
    (eccodes' own geoiterator then fails, with ERROR lines): a global grid's N is taken from its number of
    rows (2N) when the stated one does not give them."""
    h = _first_message(index, path)
    try:
        stated = eccodes.codes_get_long(h, "N")
    finally:
        eccodes.codes_release(h)
    lat = _gaussian_rows(stated, shape.lat_first, shape.lat_last)
    if lat.size != int(shape.nj) and abs(shape.lat_first + shape.lat_last) < 1e-3 and int(shape.nj) % 2 == 0:
        lat = _gaussian_rows(int(shape.nj) // 2, shape.lat_first, shape.lat_last)  # a global grid: 2N rows
    if int(shape.scan) & SCAN_BITS["jScansPositively"]:
        lat = lat[::-1]
    lon = _longitudes(int(shape.ni), shape.lon_first, shape.lon_last, int(shape.scan))
    if int(shape.scan) & SCAN_BITS["iScansNegatively"]:
        lon = lon[::-1]
    if lat.size * lon.size != int(shape.n_values):
        msg = (
            f"{path}: a regular Gaussian grid (N{stated}) whose {shape.nj} rows from {shape.lat_first:g} to "
            f"{shape.lat_last:g} are not Gaussian latitudes: its header is inconsistent; regrid or rewrite the file"
        )
        raise BadInputError(msg)
    rows, cols = np.meshgrid(lat, lon, indexing="ij")  # (rows, columns) in storage order
    return regrid.SourceGrid.points(rows.ravel(), cols.ravel(), f"regular_gg N{lat.size // 2} ({rows.size} points)")


def _gaussian_rows(n: int, first: float, last: float) -> np.ndarray:
    """The Gaussian latitudes of N (the 2N roots of the Legendre polynomial of degree 2N) from ``first`` to
    ``last``, north to south."""
    lat = np.degrees(np.arcsin(np.polynomial.legendre.leggauss(2 * n)[0]))[::-1]
    lo, hi = sorted((first, last))
    return lat[(lat >= lo - 1e-3) & (lat <= hi + 1e-3)]


def _first_message(index: pd.DataFrame, path: str | os.PathLike[str]) -> int:
    """An eccodes handle on the first message of an index (the caller releases it)."""
    with open(path, "rb") as f:
        f.seek(int(index["offset"].iloc[0]))
        return int(eccodes.codes_new_from_message(f.read(int(index["length"].iloc[0]))))


def _point_coords(h: int) -> tuple[np.ndarray, np.ndarray, str]:
    """Per-point latitude/longitude of a message (in storage order) and a grid name (O8, N32); releases ``h``."""
    try:
        lat = eccodes.codes_get_array(h, "latitudes")
        lon = eccodes.codes_get_array(h, "longitudes")
        name = eccodes.codes_get_string(h, "gridName") if eccodes.codes_is_defined(h, "gridName") else ""
        gtype = eccodes.codes_get_string(h, "gridType")
    finally:
        eccodes.codes_release(h)
    return lat, lon, f"{gtype} {name} ({lat.size} points)".replace("  ", " ")


def in_grid_order(values: np.ndarray, shape: tuple[int, ...], scan: int) -> np.ndarray:
    """A message's values (storage order) as the grid holds them: (n_lat, n_lon) latitude ascending and
    longitude eastward for a regular grid, as stored for points. eccodes' ``values`` already undo
    alternate-row scanning (its boustrophedonic accessor), so only the direction flags are applied."""
    if len(shape) != 2:
        return values.reshape(shape)
    nj, ni = shape
    field = values.reshape(ni, nj).T if scan & SCAN_BITS["jPointsAreConsecutive"] else values.reshape(nj, ni)
    if scan & SCAN_BITS["iScansNegatively"]:
        field = field[:, ::-1]
    return field if scan & SCAN_BITS["jScansPositively"] else field[::-1]
