"""The truth's conventions (:func:`normalise_truth`) and the truth of the derived targets (ws10, tp24),
computed as their declarations in the schema say: the hypotenuse of the wind components, or the
accumulation over a window of hourly, 6-hourly or daily accumulated fields (m or mm), clipped, NaN where
the window is incomplete."""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd
import xarray as xr

from postcast.datasets import contract, schema
from postcast.datasets.core.errors import BadInputError, MissingInputError
from postcast.datasets.sources.conventions import (
    DIM_ALIASES,
    VAR_ALIASES,
    convert_units,
    fix_level,
    fix_lonlat,
    fix_step,
    lazy,
)

# CF standard names of the 10 m wind in a truth file (fields without levels; u and v share them otherwise)
_CF_WIND = {"eastward_wind": "u10", "northward_wind": "v10"}

log = logging.getLogger(__name__)


# the truth variables the derived targets (ws10, tp24) are computed from: u10, v10, tp
_DERIVED_INPUTS = tuple(dict.fromkeys(v for t in schema.derived_targets() for v in t.input_variables))


_TIME_CHUNK = 24  # valid times per chunk of the fields the derived truths are computed from


def _truth_variable(name: str, da: xr.DataArray) -> str:
    """The schema name of a truth file's variable under any name the forecast side takes (GRIB short name,
    cdo and WeatherBench names, paramId, long name), or the CF wind name (name or ``standard_name``) of
    a field without levels; else the name itself."""
    canon = VAR_ALIASES.get(name) or schema.resolve(name) or name
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
            levels: list[int] = np.atleast_1d(da[schema.LEVEL].values).tolist() if schema.LEVEL in da.coords else []
            if tg.level in levels:
                return tg
    return None


def _derived_truths(
    inputs: dict[str, tuple[str, xr.DataArray]], wanted: list[schema.Target], source: str
) -> dict[str, xr.DataArray]:
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
    return {
        contract.truth_name(t.name): da.assign_attrs(units=t.units, target=t.name)
        for t, da in made.items()
        if da is not None
    }


def _truth_hypot(tg: schema.Target, inputs: dict[str, tuple[str, xr.DataArray]], source: str) -> xr.DataArray | None:
    """The magnitude (ws10: the speed in m/s of the truth's 10 m wind) of the components ``tg`` is derived from,
    None unless the truth has every one."""
    assert tg.derive is not None
    names = tg.derive.variables
    have = [v for v in names if v in inputs]
    if len(have) < len(names):
        if have:
            log.info(
                "%s: %s without %s: no %s truth",
                source,
                ", ".join(have),
                ", ".join(v for v in names if v not in inputs),
                tg.name,
            )
        return None
    parts = [convert_units(_by_time(inputs[v][1], _TIME_CHUNK), schema.VARIABLES[v], source) for v in names]
    log.info(
        "%s: truth %s from %s (the file's %s): their magnitude (%s) in %s",
        source,
        tg.name,
        ", ".join(names),
        ", ".join(inputs[v][0] for v in names),
        tg.derive.kind,
        tg.units,
    )
    return xr.apply_ufunc(tg.derive, *parts, dask="allowed")  # lazy: np.hypot of the dask arrays


def _truth_accumulation(tg: schema.Target, name: str, acc: xr.DataArray, source: str) -> xr.DataArray | None:
    """The amount over the target's window (tp24: the 24 h precipitation in mm) ending at each valid time from
    amounts ``acc`` per interval ending at their valid times (ERA5's hourly tp: the hour up to the valid time;
    a daily sum: the 24 h): the sum over (valid time - window, valid time] times the declared scale, NaN where
    an amount of that window is missing, clipped at the declared minimum. None for truth paired with forecasts
    (its tp would be an accumulation from the start)."""
    assert tg.derive is not None
    if schema.VALID_TIME not in acc.dims:
        log.info(
            "%s: %s is not indexed by valid time: no %s truth from it (give %s)",
            source,
            name,
            tg.name,
            contract.truth_name(tg.name),
        )
        return None
    acc = acc.sortby(schema.VALID_TIME)
    times = pd.DatetimeIndex(acc[schema.VALID_TIME].values)
    every = _accumulation_period(times, name, source, tg)
    n = pd.Timedelta(hours=tg.derive.window_h) // every  # amounts per window
    chunk = max(n, _TIME_CHUNK)  # a window reaches back into one chunk at most
    variable = schema.VARIABLES[tg.derive.variables[0]]
    mm = convert_units(_by_time(acc, chunk), variable, source) * tg.derive.scale  # tp: m -> mm
    _check_amounts(mm.isel({schema.VALID_TIME: slice(0, max(2 * n, 8) + 1)}), name, source, tg)
    full = pd.date_range(times[0], times[-1], freq=every)
    if len(full) != len(times):  # gaps between the dates: each missing interval is NaN (an incomplete window)
        mm = _by_time(mm.reindex({schema.VALID_TIME: full}), chunk)
    axis = mm.get_axis_num(schema.VALID_TIME)
    data = mm.data.map_overlap(
        _window_sums, depth={axis: (n - 1, 0)}, boundary="none", n=n, axis=axis, dtype=np.float64
    )  # lazy, one chunk of times and the n - 1 before it at a time
    sums = xr.DataArray(data, coords=mm.coords, dims=mm.dims).sel({schema.VALID_TIME: times})
    clipped = "" if tg.derive.clip_min is None else f", clipped at {tg.derive.clip_min:g}"
    log.info(
        "%s: truth %s from %s (the file's %s): sums of the %d amounts of %s ending at each valid time, in %s%s",
        source,
        tg.name,
        variable.name,
        name,
        n,
        _hours(every),
        tg.units,
        clipped,
    )
    return sums if tg.derive.clip_min is None else sums.clip(min=tg.derive.clip_min)


_NOISE = 0.01  # target units (tp24: mm): packing noise of an amount; an amount below -_NOISE is negative
_RUNNING = 0.2  # an amount falling at fewer than this share of its changes between valid times is running


def _check_amounts(head: xr.DataArray, name: str, source: str, tg: schema.Target) -> None:
    """The first valid times' amounts per interval (``head``: valid_time first or not, target units) are
    amounts: none negative beyond packing noise, and not a running accumulation (one rising at every
    interval and falling only where it restarts, as a forecast's tp from its start does), which summed
    over a window gives tens of times the true amount."""
    t = np.moveaxis(np.asarray(head.values, dtype=np.float64), head.get_axis_num(schema.VALID_TIME), 0)
    if np.isnan(t).all():
        return
    low = float(np.nanmin(t))
    if low < -_NOISE:
        msg = (
            f"{source}: {name} has amounts down to {low:.4g} {tg.units} (negative: not amounts per interval); "
            f"give amounts >= 0, or {contract.truth_name(tg.name)}"
        )
        raise BadInputError(msg)
    change = np.diff(t, axis=0)  # (time - 1, ...)
    rises, falls = int((change > _NOISE).sum()), int((change < -_NOISE).sum())
    if rises + falls >= 20 and falls < _RUNNING * (rises + falls):
        msg = (
            f"{source}: {name} rises at {rises} and falls at {falls} of its changes between consecutive valid "
            f"times: a running accumulation (since a forecast's start), not amounts per interval; give the "
            f"amount of each interval (the differences of consecutive accumulations), or {contract.truth_name(tg.name)}"
        )
        raise BadInputError(msg)


def _unique_times(ds: xr.Dataset, source: str) -> None:
    """Each init or valid time of the truth once (a duplicate is ambiguous, and breaks the selection by time)."""
    for dim in (schema.VALID_TIME, schema.INIT_TIME):
        if dim in ds.dims:
            index = pd.Index(ds[dim].values)
            if index.has_duplicates:
                twice = index[index.duplicated()]
                msg = (
                    f"{source}: {dim} {pd.Timestamp(twice[0]):%Y-%m-%d %H:%M} appears more than once in the truth "
                    f"({len(twice)} duplicates); keep one of each (e.g. xarray's ds.drop_duplicates({dim!r}))"
                )
                raise BadInputError(msg)


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
    msg = (
        f"{source}: {name} ({what}) has {seen}; "
        f"{tg.name} truth needs amounts at a regular spacing that divides {_hours(window)} (hourly ERA5 amounts, "
        f"3- or 6-hourly, or daily {_hours(window)} sums): resample it, or give {contract.truth_name(tg.name)}"
    )
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
    out[n - 1 :] = np.where(gaps[n:] - gaps[:-n] > 0, np.nan, c[n:] - c[:-n])
    return np.moveaxis(out, 0, axis)


def _by_time(da: xr.DataArray, n: int) -> xr.DataArray:
    """``da`` in chunks of ``n`` valid times (when indexed by them): arithmetic on it then reads and computes
    only the chunks of the valid times selected, not the whole file (one chunk when it is stored contiguous)."""
    return da.chunk({schema.VALID_TIME: n}) if schema.VALID_TIME in da.dims else lazy(da)


def _hours(td: pd.Timedelta) -> str:
    return f"{td / pd.Timedelta(hours=1):g} h"


def normalise_truth(ds: xr.Dataset, *, source: str = "truth") -> xr.Dataset:
    """ERA5-like truth -> ``truth_<target>`` variables on a canonical grid, indexed by valid time
    (dim ``valid_time``), or already paired with forecasts (dims ``init_time``, ``step``). A derived
    target's truth is computed here when the file does not give it, as its declaration says
    (:class:`postcast.datasets.schema.Derivation`): ws10 from u10 and v10, tp24 from valid-time indexed
    precipitation amounts (:func:`_truth_accumulation`)."""
    names: dict[str, str] = {}
    if "time" in ds.dims:
        names["time"] = schema.INIT_TIME if "step" in ds.dims else schema.VALID_TIME
    names.update({k: v for k, v in DIM_ALIASES.items() if k in ds.dims or k in ds.coords})
    ds = ds.rename({k: v for k, v in names.items() if k in ds.variables or k in ds.dims})
    ds = fix_step(fix_level(ds), source)
    _unique_times(ds, source)
    ds = fix_lonlat(ds, source, any_grid=True)  # regridded to the store's grid when read
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
    out |= _derived_truths(
        inputs, [t for t in schema.derived_targets() if contract.truth_name(t.name) not in out], source
    )
    if not out:
        how = ", ".join(
            f"{t.name}{' is computed' * (i == 0)} from {t.derive.describe()}"
            for i, t in enumerate(schema.derived_targets())
            if t.derive is not None
        )
        msg = f"{source}: no truth variable for {', '.join(schema.TARGETS)} found (have {list(ds.data_vars)}; {how})"
        raise MissingInputError(msg)
    return xr.Dataset(out)
