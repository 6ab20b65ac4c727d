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
from collections.abc import Callable

import numpy as np
import pandas as pd
import xarray as xr

from postcast.datasets import contract, schema
from postcast.datasets.core.errors import BadInputError, MissingInputError

log = logging.getLogger(__name__)

# dimension / coordinate aliases -> canonical
_DIM_ALIASES = {
    "number": schema.MEMBER, "realization": schema.MEMBER, "ensemble": schema.MEMBER, "ens": schema.MEMBER,
    "isobaricInhPa": schema.LEVEL, "pressure_level": schema.LEVEL, "plev": schema.LEVEL, "lev": schema.LEVEL,
    "lat": schema.LAT, "lon": schema.LON, "forecast_reference_time": schema.INIT_TIME,
    "lead_time": schema.STEP, "prediction_timedelta": schema.STEP, "forecast_period": schema.STEP,
}
# variable aliases (GRIB short names, cdo -t ecmwf names) -> canonical
_CDO_NAMES = {"Z": "z", "T": "t", "Q": "q", "W": "w", "D": "d", "U": "u", "V": "v", "SSTK": "sst",
              "TCW": "tcw", "TCWV": "tcwv", "CP": "cp", "TP": "tp", "MSL": "msl", "TCC": "tcc",
              "U10M": "u10", "V10M": "v10", "T2M": "t2m", "SKT": "skt"}
# WeatherBench 2 / ARCO-ERA5 long names
_WB2_NAMES = {"geopotential": "z", "temperature": "t", "specific_humidity": "q", "vertical_velocity": "w",
              "divergence": "d", "u_component_of_wind": "u", "v_component_of_wind": "v",
              "sea_surface_temperature": "sst", "total_column_water": "tcw", "total_column_water_vapour": "tcwv",
              "convective_precipitation": "cp", "mean_sea_level_pressure": "msl", "total_cloud_cover": "tcc",
              "10m_u_component_of_wind": "u10", "10m_v_component_of_wind": "v10", "2m_temperature": "t2m",
              "total_precipitation": "tp", "skin_temperature": "skt"}
_VAR_ALIASES = {**{v.grib_short_name: v.name for v in schema.VARIABLES.values()}, **_CDO_NAMES, **_WB2_NAMES}
POINTS = "values"  # cfgrib's dimension of a reduced Gaussian grid (per-point latitude/longitude)


def _unit_key(units: str) -> str:
    return units.replace(" ", "").replace("**", "").replace("^", "").replace("·", "").lower()


def _lazy(x: xr.DataArray) -> xr.DataArray:
    """Arithmetic on a lazily indexed (non-dask) array would load it whole: chunk it first."""
    return x if x.chunks is not None else x.chunk()


def _scale(f: float) -> Callable[[xr.DataArray], xr.DataArray]:
    return lambda x: _lazy(x) * f


def _shift(c: float) -> Callable[[xr.DataArray], xr.DataArray]:
    return lambda x: _lazy(x) + c


def _IDENTITY(x: xr.DataArray) -> xr.DataArray:
    return x
# canonical unit -> {alias key: converter to canonical}
_UNIT_TABLE: dict[str, dict[str, Callable[[xr.DataArray], xr.DataArray]]] = {
    "K": {"k": _IDENTITY, "kelvin": _IDENTITY, "degk": _IDENTITY, "degc": _shift(273.15), "c": _shift(273.15),
          "°c": _shift(273.15), "celsius": _shift(273.15), "degree_celsius": _shift(273.15)},
    "m**2 s**-2": {"m2s-2": _IDENTITY, "m2/s2": _IDENTITY, "m2s2": _IDENTITY, "j/kg": _IDENTITY,
                   "jkg-1": _IDENTITY, "m": _scale(schema.GRAVITY), "gpm": _scale(schema.GRAVITY),
                   "dam": _scale(10 * schema.GRAVITY)},
    "kg kg**-1": {"kgkg-1": _IDENTITY, "kg/kg": _IDENTITY, "1": _IDENTITY, "g/kg": _scale(1e-3),
                  "gkg-1": _scale(1e-3)},
    "Pa s**-1": {"pas-1": _IDENTITY, "pa/s": _IDENTITY, "hpa/s": _scale(100.0), "hpas-1": _scale(100.0)},
    "s**-1": {"s-1": _IDENTITY, "1/s": _IDENTITY},
    "m s**-1": {"ms-1": _IDENTITY, "m/s": _IDENTITY, "kmh-1": _scale(1 / 3.6), "km/h": _scale(1 / 3.6),
                "knots": _scale(0.514444), "kt": _scale(0.514444)},
    "kg m**-2": {"kgm-2": _IDENTITY, "kg/m2": _IDENTITY, "mm": _IDENTITY},
    "m": {"m": _IDENTITY, "mm": _scale(1e-3), "kgm-2": _scale(1e-3), "kg/m2": _scale(1e-3)},
    "Pa": {"pa": _IDENTITY, "hpa": _scale(100.0), "mb": _scale(100.0), "mbar": _scale(100.0)},
    "(0 - 1)": {"(0-1)": _IDENTITY, "0-1": _IDENTITY, "1": _IDENTITY, "fraction": _IDENTITY,
                "dimensionless": _IDENTITY, "%": _scale(0.01), "percent": _scale(0.01)},
}


def convert_units(da: xr.DataArray, var: schema.Variable, source: str = "") -> xr.DataArray:
    """Convert ``da`` to the canonical units of ``var``; raise :class:`BadInputError` if unknown."""
    units = da.attrs.get("units")
    if units is None or units == var.units:
        out = da
    else:
        conv = _UNIT_TABLE[var.units].get(_unit_key(str(units)))
        if conv is None:
            known = sorted(_UNIT_TABLE[var.units])
            msg = (f"{source}: variable {var.name!r} has units {units!r}, which postcast cannot convert to "
                   f"{var.units!r}; use one of {known}")
            raise BadInputError(msg)
        out = conv(da)
    return out.assign_attrs({**da.attrs, "units": var.units})


def _rename(ds: xr.Dataset, source: str) -> xr.Dataset:
    names = {k: v for k, v in _DIM_ALIASES.items() if k in ds.variables or k in ds.dims}
    # ``time`` is the init time in forecasts (cfgrib, scalar when one date); ``valid_time`` stays a
    # coordinate, except in analysis-only files without ``time`` (CDS 2024+), where it is the date.
    if "time" in ds.variables and schema.INIT_TIME not in ds.variables:
        names["time"] = schema.INIT_TIME
    elif "valid_time" in ds.dims and "time" not in ds.variables and schema.STEP not in ds.variables:
        names["valid_time"] = schema.INIT_TIME
    names.update({k: v for k, v in _VAR_ALIASES.items() if k in ds.data_vars and k != v})
    clash = [v for k, v in names.items() if v in ds.variables and k != v]
    if clash:
        msg = f"{source}: both an alias and the canonical name exist for {clash}; drop one of them"
        raise BadInputError(msg)
    return ds.rename(names)


def _fix_level(ds: xr.Dataset) -> xr.Dataset:
    if schema.LEVEL not in ds.coords:
        return ds
    lev = ds[schema.LEVEL]
    values = np.asarray(lev.values, dtype=np.float64)
    units = str(lev.attrs.get("units", "")).lower()
    if units in ("pa", "pascal") or (values.size and values.max() > 2000):
        values = values / 100.0  # Pa -> hPa (cdo writes plev in Pa)
    ds = ds.assign_coords({schema.LEVEL: (schema.LEVEL, np.round(values).astype(np.int64), {"units": "hPa"})})
    return ds.sortby(schema.LEVEL)


def _fix_step(ds: xr.Dataset, source: str) -> xr.Dataset:
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


def _fix_lonlat(ds: xr.Dataset, source: str, *, any_grid: bool = False) -> xr.Dataset:
    """Latitude ascending, longitude 0..360 on a regular global grid; with ``any_grid``, other regular
    grids (regional, any longitude convention) keep their longitudes and point grids (``values``) pass,
    to be regridded when read (datasets/sources/regrid.py)."""
    for c in (schema.LAT, schema.LON):
        if c not in ds.coords:
            msg = (f"{source}: no {c} coordinate; expected a latitude/longitude grid (regular, or reduced "
                   "Gaussian with per-point coordinates)")
            raise BadInputError(msg)
    if any_grid and POINTS in ds[schema.LAT].dims:
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
    return ds.assign_coords({
        schema.LAT: (schema.LAT, ds[schema.LAT].values.astype(np.float64),
                     {"units": "degrees_north", "standard_name": "latitude"}),
        schema.LON: (schema.LON, ds[schema.LON].values.astype(np.float64),
                     {"units": "degrees_east", "standard_name": "longitude"}),
    })


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
    ds = _fix_level(ds)
    ds = _fix_step(ds, source)
    ds = _fix_lonlat(ds, source, any_grid=True)
    held = [str(n) for n in ds.data_vars]
    ds = _fix_dims(ds)
    skipped = [n for n in held if n not in ds.data_vars]
    if not ds.data_vars:
        msg = (f"{source}: no ENS-10 variable found (the file holds {', '.join(held) or 'no variable'}; known: "
               f"{', '.join(schema.VARIABLES)})")
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
    return _fix_lonlat(_fix_step(ds, source), source)


def normalise_truth(ds: xr.Dataset, *, source: str = "truth") -> xr.Dataset:
    """ERA5-like truth -> ``truth_<target>`` variables on a canonical grid, indexed by valid time
    (dim ``valid_time``), or already paired with forecasts (dims ``init_time``, ``step``). A derived
    target's truth is computed here when the file does not give it, as its declaration says
    (:class:`postcast.datasets.schema.Derivation`): ws10 from u10 and v10, tp24 from valid-time indexed
    precipitation amounts (:func:`_truth_accumulation`)."""
    names: dict[str, str] = {}
    if "time" in ds.dims:
        names["time"] = schema.INIT_TIME if "step" in ds.dims else schema.VALID_TIME
    names.update({k: v for k, v in _DIM_ALIASES.items() if k in ds.dims or k in ds.coords})
    ds = ds.rename({k: v for k, v in names.items() if k in ds.variables or k in ds.dims})
    ds = _fix_step(_fix_level(ds), source)
    ds = _fix_lonlat(ds, source, any_grid=True)  # regridded to the store's grid when read
    out: dict[str, xr.DataArray] = {}
    inputs: dict[str, tuple[str, xr.DataArray]] = {}  # u10, v10, tp -> (the file's name, field)
    for name, da in ds.data_vars.items():
        key = str(name)
        if _truth_variable(key, da) in _DERIVED_INPUTS:
            inputs[_truth_variable(key, da)] = (key, da)
        tg = _truth_target(key, da)
        if tg is None:
            continue
        if tg.level is not None and schema.LEVEL in da.coords:
            if tg.level not in np.atleast_1d(da[schema.LEVEL].values):
                continue
            da = da.sel({schema.LEVEL: tg.level}, drop=True) if schema.LEVEL in da.dims else da.drop_vars(schema.LEVEL)
        conv = da if tg.derived else convert_units(da, schema.VARIABLES[tg.variable], source)
        out[contract.truth_name(tg.name)] = conv.assign_attrs(target=tg.name)
    out |= _derived_truths(inputs, [t for t in schema.derived_targets() if contract.truth_name(t.name) not in out],
                           source)
    if not out:
        how = ", ".join(f"{t.name}{' is computed' * (i == 0)} from {t.derive.describe()}"
                        for i, t in enumerate(schema.derived_targets()) if t.derive is not None)
        msg = (f"{source}: no truth variable for {', '.join(schema.TARGETS)} found (have {list(ds.data_vars)}; "
               f"{how})")
        raise MissingInputError(msg)
    return xr.Dataset(out)


# CF standard names of the 10 m wind in a truth file (fields without levels; u and v share them otherwise)
_CF_WIND = {"eastward_wind": "u10", "northward_wind": "v10"}
# the truth variables the derived targets (ws10, tp24) are computed from: u10, v10, tp
_DERIVED_INPUTS = tuple(dict.fromkeys(v for t in schema.derived_targets() for v in t.input_variables))
_TIME_CHUNK = 24  # valid times per chunk of the fields the derived truths are computed from


def _truth_variable(name: str, da: xr.DataArray) -> str:
    """The schema name of a truth file's variable under any name the forecast side takes (GRIB short name,
    cdo and WeatherBench names, paramId, long name), or the CF wind name (name or ``standard_name``) of
    a field without levels; else the name itself."""
    canon = _VAR_ALIASES.get(name) or schema.resolve(name) or name
    if canon not in schema.VARIABLES and schema.LEVEL not in da.coords:
        return _CF_WIND.get(name) or _CF_WIND.get(str(da.attrs.get("standard_name")), canon)
    return canon


def _truth_target(name: str, da: xr.DataArray) -> schema.Target | None:
    if name.startswith("truth_") and name[6:] in schema.TARGETS:
        return schema.target(name[6:])
    if name in schema.TARGETS:
        return schema.target(name)
    canon = _truth_variable(name, da)
    for tg in schema.TARGETS.values():
        if canon == tg.variable:
            if tg.level is None:
                return tg
            levels: list[int] = (np.atleast_1d(da[schema.LEVEL].values).tolist()
                                 if schema.LEVEL in da.coords else [])
            if tg.level in levels:
                return tg
    return None


def _derived_truths(inputs: dict[str, tuple[str, xr.DataArray]], wanted: list[schema.Target],
                    source: str) -> dict[str, xr.DataArray]:
    """Of the ``wanted`` derived targets (those the file gives no truth of), the truth of each whose input
    variables the file has, computed as its declaration (``Target.derive``) says: ``truth_ws10`` when the
    truth has u10 and v10, ``truth_tp24`` when it has valid-time indexed tp."""
    made: dict[schema.Target, xr.DataArray | None] = {}
    for tg in wanted:
        if tg.derive is None:
            continue
        if tg.derive.kind is schema.DeriveKind.HYPOT:
            made[tg] = _truth_hypot(tg, inputs, source)
        elif tg.derive.variables[0] in inputs:  # an accumulation
            made[tg] = _truth_accumulation(tg, *inputs[tg.derive.variables[0]], source)
    return {contract.truth_name(t.name): da.assign_attrs(units=t.units, target=t.name)
            for t, da in made.items() if da is not None}


def _truth_hypot(tg: schema.Target, inputs: dict[str, tuple[str, xr.DataArray]], source: str) -> xr.DataArray | None:
    """The magnitude (ws10: the speed in m/s of the truth's 10 m wind) of the components ``tg`` is derived from,
    None unless the truth has every one."""
    assert tg.derive is not None
    names = tg.derive.variables
    have = [v for v in names if v in inputs]
    if len(have) < len(names):
        if have:
            log.info("%s: %s without %s: no %s truth", source, ", ".join(have),
                     ", ".join(v for v in names if v not in inputs), tg.name)
        return None
    parts = [convert_units(_by_time(inputs[v][1], _TIME_CHUNK), schema.VARIABLES[v], source) for v in names]
    log.info("%s: truth %s from %s (the file's %s): their magnitude (%s) in %s", source, tg.name, ", ".join(names),
             ", ".join(inputs[v][0] for v in names), tg.derive.kind, tg.units)
    return xr.apply_ufunc(tg.derive, *parts, dask="allowed")  # lazy: np.hypot of the dask arrays


def _truth_accumulation(tg: schema.Target, name: str, acc: xr.DataArray, source: str) -> xr.DataArray | None:
    """The amount over the target's window (tp24: the 24 h precipitation in mm) ending at each valid time from
    amounts ``acc`` per interval ending at their valid times (ERA5's hourly tp: the hour up to the valid time;
    a daily sum: the 24 h): the sum over (valid time - window, valid time] times the declared scale, NaN where
    an amount of that window is missing, clipped at the declared minimum. None for truth paired with forecasts
    (its tp would be an accumulation from the start)."""
    assert tg.derive is not None
    if schema.VALID_TIME not in acc.dims:
        log.info("%s: %s is not indexed by valid time: no %s truth from it (give %s)", source, name, tg.name,
                 contract.truth_name(tg.name))
        return None
    acc = acc.sortby(schema.VALID_TIME)
    times = pd.DatetimeIndex(acc[schema.VALID_TIME].values)
    every = _accumulation_period(times, name, source, tg)
    n = pd.Timedelta(hours=tg.derive.window_h) // every  # amounts per window
    chunk = max(n, _TIME_CHUNK)  # a window reaches back into one chunk at most
    variable = schema.VARIABLES[tg.derive.variables[0]]
    mm = convert_units(_by_time(acc, chunk), variable, source) * tg.derive.scale  # tp: m -> mm
    full = pd.date_range(times[0], times[-1], freq=every)
    if len(full) != len(times):  # gaps between the dates: each missing interval is NaN (an incomplete window)
        mm = _by_time(mm.reindex({schema.VALID_TIME: full}), chunk)
    axis = mm.get_axis_num(schema.VALID_TIME)
    data = mm.data.map_overlap(_window_sums, depth={axis: (n - 1, 0)}, boundary="none", n=n, axis=axis,
                               dtype=np.float64)  # lazy, one chunk of times and the n - 1 before it at a time
    sums = xr.DataArray(data, coords=mm.coords, dims=mm.dims).sel({schema.VALID_TIME: times})
    clipped = "" if tg.derive.clip_min is None else f", clipped at {tg.derive.clip_min:g}"
    log.info("%s: truth %s from %s (the file's %s): sums of the %d amounts of %s ending at each valid time, "
             "in %s%s", source, tg.name, variable.name, name, n, _hours(every), tg.units, clipped)
    return sums if tg.derive.clip_min is None else sums.clip(min=tg.derive.clip_min)


def _accumulation_period(times: pd.DatetimeIndex, name: str, source: str, tg: schema.Target) -> pd.Timedelta:
    """The spacing of the valid times (the most common one; gaps of whole multiples of it are allowed):
    it must divide the target's window (tp24: 24 h)."""
    assert tg.derive is not None
    window = pd.Timedelta(hours=tg.derive.window_h)
    steps, counts = np.unique(np.diff(times.as_unit("ns").asi8), return_counts=True)  # ns, ascending
    diffs = pd.to_timedelta(steps, unit="ns")
    every = diffs[np.argmax(counts)] if len(diffs) else None
    if every is None:
        seen = "one valid time"
    elif window % every:
        seen = f"valid times every {_hours(every)}"
    elif any(d % every for d in diffs):
        seen = f"valid times at irregular spacings ({', '.join(map(_hours, diffs[:4]))})"
    else:
        return every
    what = schema.VARIABLES[tg.derive.variables[0]].long_name.split()[-1].lower()  # tp: precipitation
    msg = (f"{source}: {name} ({what}) has {seen}; "
           f"{tg.name} truth needs amounts at a regular spacing that divides {_hours(window)} (hourly ERA5 amounts, "
           f"3- or 6-hourly, or daily {_hours(window)} sums): resample it, or give {contract.truth_name(tg.name)}")
    raise BadInputError(msg)


def _window_sums(a: np.ndarray, n: int, axis: int) -> np.ndarray:
    """The sums of the ``n`` values up to each position along ``axis`` (a block of times with the n - 1 times
    before it), NaN where fewer than n precede or one of them is NaN; one cumulative sum, not n additions."""
    t = np.moveaxis(a, axis, 0)  # (time, ...)
    missing = np.isnan(t)
    zero = np.zeros((1, *t.shape[1:]))
    c = np.concatenate([zero, np.cumsum(np.where(missing, 0.0, t), axis=0, dtype=np.float64)])
    gaps = np.concatenate([zero, np.cumsum(missing, axis=0, dtype=np.float64)])
    out = np.full(t.shape, np.nan)
    out[n - 1:] = np.where(gaps[n:] - gaps[:-n] > 0, np.nan, c[n:] - c[:-n])
    return np.moveaxis(out, 0, axis)


def _by_time(da: xr.DataArray, n: int) -> xr.DataArray:
    """``da`` in chunks of ``n`` valid times (when indexed by them): arithmetic on it then reads and computes
    only the chunks of the valid times selected, not the whole file (one chunk when it is stored contiguous)."""
    return da.chunk({schema.VALID_TIME: n}) if schema.VALID_TIME in da.dims else _lazy(da)


def _hours(td: pd.Timedelta) -> str:
    return f"{td / pd.Timedelta(hours=1):g} h"


def to_ens10(ds: xr.Dataset) -> xr.Dataset:
    """Canonical forecast -> ENS-10/cfgrib look-alike (``number``, ``time``, ``isobaricInhPa``,
    descending latitude, GRIB short names kept as cfgrib does: ``t2m``, ``u10``)."""
    ren = {schema.MEMBER: "number", schema.INIT_TIME: "time", schema.LEVEL: "isobaricInhPa"}
    out = ds.rename({k: v for k, v in ren.items() if k in ds.dims})
    return out.isel({schema.LAT: slice(None, None, -1)})
