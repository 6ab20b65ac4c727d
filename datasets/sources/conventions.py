"""Normalise conventions once, at the read boundary: names, latitude order, longitudes, units, time.

:func:`normalise` takes a forecast dataset in any of the conventions postcast meets (cfgrib/ENS-10:
``number``, ``time``, ``isobaricInhPa``, descending latitude; cdo/ENS-10 baseline files: ``plev`` in
Pa, ``lat``/``lon``, upper-case ECMWF names; WeatherBench-style ``level``/``realization``) and
returns it in the canonical form of :mod:`postcast.datasets.schema`. Nothing downstream re-checks.
:func:`to_ens10` does the reverse, for writers that produce ENS-10 look-alike files.

Both functions are pure ``xr.Dataset -> xr.Dataset`` and keep dask arrays lazy.
"""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd
import xarray as xr

from postcast.datasets import schema
from postcast.datasets.core.errors import BadInputError, MissingInputError
from postcast.datasets.core.geo import coordinate_problems

log = logging.getLogger(__name__)

# dimension / coordinate aliases -> canonical
DIM_ALIASES = {
    "number": schema.MEMBER,
    "realization": schema.MEMBER,
    "ensemble": schema.MEMBER,
    "ens": schema.MEMBER,
    "isobaricInhPa": schema.LEVEL,
    "pressure_level": schema.LEVEL,
    "plev": schema.LEVEL,
    "lev": schema.LEVEL,
    "lat": schema.LAT,
    "lon": schema.LON,
    "forecast_reference_time": schema.INIT_TIME,
    "lead_time": schema.STEP,
    "prediction_timedelta": schema.STEP,
    "forecast_period": schema.STEP,
}
# variable aliases (GRIB short names, cdo -t ecmwf names) -> canonical
_CDO_NAMES = {
    "Z": "z",
    "T": "t",
    "Q": "q",
    "W": "w",
    "D": "d",
    "U": "u",
    "V": "v",
    "SSTK": "sst",
    "TCW": "tcw",
    "TCWV": "tcwv",
    "CP": "cp",
    "TP": "tp",
    "MSL": "msl",
    "TCC": "tcc",
    "U10M": "u10",
    "V10M": "v10",
    "T2M": "t2m",
    "SKT": "skt",
}
# WeatherBench 2 / ARCO-ERA5 long names
_WB2_NAMES = {
    "geopotential": "z",
    "temperature": "t",
    "specific_humidity": "q",
    "vertical_velocity": "w",
    "divergence": "d",
    "u_component_of_wind": "u",
    "v_component_of_wind": "v",
    "sea_surface_temperature": "sst",
    "total_column_water": "tcw",
    "total_column_water_vapour": "tcwv",
    "convective_precipitation": "cp",
    "mean_sea_level_pressure": "msl",
    "total_cloud_cover": "tcc",
    "10m_u_component_of_wind": "u10",
    "10m_v_component_of_wind": "v10",
    "2m_temperature": "t2m",
    "total_precipitation": "tp",
    "skin_temperature": "skt",
}
VAR_ALIASES = {**{v.grib_short_name: v.name for v in schema.VARIABLES.values()}, **_CDO_NAMES, **_WB2_NAMES}
POINTS = "values"  # cfgrib's dimension of a reduced Gaussian grid (per-point latitude/longitude)


def _unit_key(units: str) -> str:
    return units.replace(" ", "").replace("**", "").replace("^", "").replace("·", "").lower()


def lazy(x: xr.DataArray) -> xr.DataArray:
    """Arithmetic on a lazily indexed (non-dask) array would load it whole: chunk it first."""
    return x if x.chunks is not None else x.chunk()


Conversion = tuple[float, float]  # (scale, offset): canonical = value * scale + offset
IDENTITY: Conversion = (1.0, 0.0)


def _scale(f: float) -> Conversion:
    return (f, 0.0)


def _shift(c: float) -> Conversion:
    return (1.0, c)


# The one table of unit conversions (netCDF units attributes, GRIB messages' units keys):
# canonical unit -> {alias key (_unit_key): conversion to canonical}
_UNIT_TABLE: dict[str, dict[str, Conversion]] = {
    "K": {
        "k": IDENTITY,
        "kelvin": IDENTITY,
        "degk": IDENTITY,
        "degc": _shift(273.15),
        "c": _shift(273.15),
        "°c": _shift(273.15),
        "celsius": _shift(273.15),
        "degree_celsius": _shift(273.15),
    },
    "m**2 s**-2": {
        "m2s-2": IDENTITY,
        "m2/s2": IDENTITY,
        "m2s2": IDENTITY,
        "j/kg": IDENTITY,
        "jkg-1": IDENTITY,
        "m": _scale(schema.GRAVITY),
        "gpm": _scale(schema.GRAVITY),
        "dam": _scale(10 * schema.GRAVITY),
    },
    "kg kg**-1": {"kgkg-1": IDENTITY, "kg/kg": IDENTITY, "1": IDENTITY, "g/kg": _scale(1e-3), "gkg-1": _scale(1e-3)},
    "Pa s**-1": {"pas-1": IDENTITY, "pa/s": IDENTITY, "hpa/s": _scale(100.0), "hpas-1": _scale(100.0)},
    "s**-1": {"s-1": IDENTITY, "1/s": IDENTITY},
    "m s**-1": {
        "ms-1": IDENTITY,
        "m/s": IDENTITY,
        "kmh-1": _scale(1 / 3.6),
        "km/h": _scale(1 / 3.6),
        "knots": _scale(0.514444),
        "kt": _scale(0.514444),
    },
    "kg m**-2": {"kgm-2": IDENTITY, "kg/m2": IDENTITY, "mm": IDENTITY},
    "m": {"m": IDENTITY, "mm": _scale(1e-3), "kgm-2": _scale(1e-3), "kg/m2": _scale(1e-3)},  # water: 1 kg m-2 = 1 mm
    "Pa": {"pa": IDENTITY, "hpa": _scale(100.0), "mb": _scale(100.0), "mbar": _scale(100.0)},
    "(0 - 1)": {
        "(0-1)": IDENTITY,
        "0-1": IDENTITY,
        "1": IDENTITY,
        "fraction": IDENTITY,
        "dimensionless": IDENTITY,
        "%": _scale(0.01),
        "percent": _scale(0.01),
    },
}


def conversion(units: str | None, var: schema.Variable, source: str = "") -> Conversion:
    """How values in ``units`` (None: the canonical ones) become ``var``'s canonical units, from the one
    table; :class:`BadInputError` naming the units and those it knows when there is none."""
    if units is None or units == var.units:
        return IDENTITY
    conv = _UNIT_TABLE[var.units].get(_unit_key(str(units)))
    if conv is None:
        known = sorted(_UNIT_TABLE[var.units])
        msg = (
            f"{source}: variable {var.name!r} has units {units!r}, which postcast cannot convert to "
            f"{var.units!r}; use one of {known}"
        )
        raise BadInputError(msg)
    return conv


def convert_units(da: xr.DataArray, var: schema.Variable, source: str = "") -> xr.DataArray:
    """Convert ``da`` to the canonical units of ``var``; raise :class:`BadInputError` if unknown."""
    scale, offset = conversion(da.attrs.get("units"), var, source)
    out = da if scale == 1.0 else lazy(da) * scale
    out = out if offset == 0.0 else lazy(out) + offset
    return out.assign_attrs({**da.attrs, "units": var.units})


def _rename(ds: xr.Dataset, source: str) -> xr.Dataset:
    names = {k: v for k, v in DIM_ALIASES.items() if k in ds.variables or k in ds.dims}
    # ``time`` is the init time in forecasts (cfgrib, scalar when one date); ``valid_time`` stays a
    # coordinate, except in analysis-only files without ``time`` (CDS 2024+), where it is the date.
    if "time" in ds.variables and schema.INIT_TIME not in ds.variables:
        names["time"] = schema.INIT_TIME
    elif "valid_time" in ds.dims and "time" not in ds.variables and schema.STEP not in ds.variables:
        names["valid_time"] = schema.INIT_TIME
    names.update({k: v for k, v in VAR_ALIASES.items() if k in ds.data_vars and k != v})
    clash = [v for k, v in names.items() if v in ds.variables and k != v]
    if clash:
        msg = f"{source}: both an alias and the canonical name exist for {clash}; drop one of them"
        raise BadInputError(msg)
    return ds.rename(names)


def fix_level(ds: xr.Dataset) -> xr.Dataset:
    if schema.LEVEL not in ds.coords:
        return ds
    lev = ds[schema.LEVEL]
    values = np.asarray(lev.values, dtype=np.float64)
    units = str(lev.attrs.get("units", "")).lower()
    if units in ("pa", "pascal") or (values.size and values.max() > 2000):
        values = values / 100.0  # Pa -> hPa (cdo writes plev in Pa)
    ds = ds.assign_coords({schema.LEVEL: (schema.LEVEL, np.round(values).astype(np.int64), {"units": "hPa"})})
    return ds.sortby(schema.LEVEL)


def fix_step(ds: xr.Dataset, source: str) -> xr.Dataset:
    if schema.STEP not in ds.coords:
        return ds
    step = ds[schema.STEP]
    if np.issubdtype(step.dtype, np.timedelta64):
        return ds
    units = str(step.attrs.get("units", "hours")).lower()
    factor = {"hours": "h", "hour": "h", "h": "h", "days": "D", "day": "D", "d": "D"}.get(units)
    if factor is None:
        msg = f"{source}: step has units {units!r}; use hours or days"
        raise BadInputError(msg)
    return ds.assign_coords({schema.STEP: pd.to_timedelta(np.asarray(step.values), unit=factor)})


def fix_lonlat(ds: xr.Dataset, source: str, *, any_grid: bool = False) -> xr.Dataset:
    """Latitude ascending, longitude 0..360 on a regular global grid; with ``any_grid``, other regular
    grids (regional, any longitude convention) keep their longitudes and point grids (``values``) pass,
    to be regridded when read (datasets/sources/regrid.py). Coordinates that are not finite, out of range,
    repeated or not monotonic (:func:`postcast.datasets.core.geo.coordinate_problems`, the check the
    forecast archive's reader makes too) are :class:`BadInputError` naming them."""
    for c in (schema.LAT, schema.LON):
        if c not in ds.coords:
            msg = (
                f"{source}: no {c} coordinate; expected a latitude/longitude grid (regular, or reduced "
                "Gaussian with per-point coordinates)"
            )
            raise BadInputError(msg)
    points = POINTS in ds[schema.LAT].dims
    wrong = coordinate_problems(ds[schema.LAT].values, ds[schema.LON].values, points=points)
    if wrong:
        msg = f"{source}: {'; '.join(wrong)}: fix the file's coordinates (a damaged or hand-edited file?)"
        raise BadInputError(msg)
    if any_grid and points:
        return ds
    if any_grid and not _is_global(ds):
        lat = ds[schema.LAT].values
        return ds.isel({schema.LAT: slice(None, None, -1)}) if lat.size > 1 and lat[0] > lat[-1] else ds
    lon = np.asarray(ds[schema.LON].values, dtype=np.float64)
    if lon.min() < 0:
        ds = ds.assign_coords({schema.LON: np.mod(lon, 360.0)}).sortby(schema.LON)
    lat = ds[schema.LAT].values
    if lat.size > 1 and lat[0] > lat[-1]:
        ds = ds.isel({schema.LAT: slice(None, None, -1)})  # ENS-10 / ERA5 are north -> south
    try:
        schema.Grid.from_coords(ds[schema.LAT].values, ds[schema.LON].values)
    except ValueError as err:
        msg_0 = f"{source}: wrong grid: {err}"
        raise BadInputError(msg_0) from err
    return ds.assign_coords(
        {
            schema.LAT: (
                schema.LAT,
                ds[schema.LAT].values.astype(np.float64),
                {"units": "degrees_north", "standard_name": "latitude"},
            ),
            schema.LON: (
                schema.LON,
                ds[schema.LON].values.astype(np.float64),
                {"units": "degrees_east", "standard_name": "longitude"},
            ),
        }
    )


def _is_global(ds: xr.Dataset) -> bool:
    lon = np.sort(np.mod(np.asarray(ds[schema.LON].values, dtype=np.float64), 360.0))
    try:
        schema.Grid.from_coords(ds[schema.LAT].values, lon)
    except ValueError:
        return False
    return True


def _fix_dims(ds: xr.Dataset) -> xr.Dataset:
    """Promote scalar coords (cfgrib's single-level ``surface``/``isobaricInhPa``) and order dims."""
    for dim in (schema.INIT_TIME, schema.STEP, schema.MEMBER):  # scalar coords (one date, one step, control)
        if dim in ds.coords and dim not in ds.dims:
            ds = ds.expand_dims(dim)
    if schema.STEP not in ds.coords:  # analyses: step 0
        ds = ds.expand_dims({schema.STEP: pd.to_timedelta([0], unit="h")})
    drop = [c for c in ("surface", "heightAboveGround", "entireAtmosphere", "meanSea") if c in ds.coords]
    ds = ds.drop_vars(drop)
    out = {}
    for name, da in ds.data_vars.items():
        var = schema.VARIABLES.get(str(name))
        if var is None:
            continue
        if var.on_levels and schema.LEVEL in da.coords and schema.LEVEL not in da.dims:
            da = da.expand_dims(schema.LEVEL)
        elif not var.on_levels and schema.LEVEL in da.dims:
            da = da.squeeze(schema.LEVEL, drop=True)
        order = var.dims
        horizontal = (schema.LAT, schema.LON) if POINTS in da.dims else ()
        missing = [d for d in order if d not in da.dims and d not in horizontal]
        if missing == [schema.MEMBER]:  # deterministic forecasts and analyses: member 0, as GRIB numbers them
            da = da.expand_dims({schema.MEMBER: [0]})
        out[str(name)] = da.transpose(*[d for d in order if d in da.dims], ...)
    return xr.Dataset(out, attrs=ds.attrs)


def normalise(ds: xr.Dataset, *, source: str = "input") -> xr.Dataset:
    """Any supported forecast convention -> canonical postcast forecast dataset (lazy-friendly).

    Raises :class:`BadInputError` (wrong grid, unconvertible units, name clashes) or
    :class:`MissingInputError` (no ENS-10 variable at all).
    """
    ds = _rename(ds, source)
    ds = fix_level(ds)
    ds = fix_step(ds, source)
    ds = fix_lonlat(ds, source, any_grid=True)
    held = [str(n) for n in ds.data_vars]
    ds = _fix_dims(ds)
    skipped = [n for n in held if n not in ds.data_vars]
    if not ds.data_vars:
        msg = (
            f"{source}: no ENS-10 variable found (the file holds {', '.join(held) or 'no variable'}; known: "
            f"{', '.join(schema.VARIABLES)})"
        )
        raise MissingInputError(msg)
    if skipped:
        log.info("%s: %d variables beyond the ENS-10 schema not taken: %s", source, len(skipped), ", ".join(skipped))
    for name in list(ds.data_vars):
        ds[name] = convert_units(ds[name], schema.VARIABLES[str(name)], source)
    if schema.STEP in ds.coords and schema.INIT_TIME in ds.coords:
        valid = ds[schema.INIT_TIME].values[:, None] + ds[schema.STEP].values[None, :]
        ds = ds.assign_coords({schema.VALID_TIME: ((schema.INIT_TIME, schema.STEP), valid)})
    return ds


def normalise_oracle(ds: xr.Dataset, *, source: str = "oracle") -> xr.Dataset:
    """The synthetic oracle (``oracle_mean_*`` / ``oracle_std_*``, paired with forecasts) with canonical
    dims, steps, latitude order and longitudes."""
    ren = {"time": schema.INIT_TIME, "lat": schema.LAT, "lon": schema.LON}
    ds = ds.rename({k: v for k, v in ren.items() if k in ds.dims})
    return fix_lonlat(fix_step(ds, source), source)


def to_ens10(ds: xr.Dataset) -> xr.Dataset:
    """Canonical forecast -> ENS-10/cfgrib look-alike (``number``, ``time``, ``isobaricInhPa``,
    descending latitude, GRIB short names kept as cfgrib does: ``t2m``, ``u10``)."""
    ren = {schema.MEMBER: "number", schema.INIT_TIME: "time", schema.LEVEL: "isobaricInhPa"}
    out = ds.rename({k: v for k, v in ren.items() if k in ds.dims})
    return out.isel({schema.LAT: slice(None, None, -1)})
