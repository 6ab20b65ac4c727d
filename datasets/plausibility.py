"""Per-variable plausibility of decoded fields, whatever their units attribute says.

A mislabelled unit is the commonest silent error in weather data: geopotential height in metres
labelled as geopotential (9.80665x too small), Celsius labelled as kelvin, hPa labelled as Pa. The
value ranges in :mod:`schema` are wide enough to hold every level, so they miss a factor g at 500
hPa. Here the *median* of a field (robust to a few bad points) is compared with its typical value:
geopotential with the ICAO standard atmosphere at its pressure level, temperatures, pressure and
humidity with climatological bands. A field outside its band is matched against the known mistakes
and the error names the likely cause and the fix. :func:`infinite` is the one finiteness check of every
value a store is given (forecast members, their statistics, truth, oracle): NaN marks a missing value
(SST over land, truth a date lacks), an infinity is never a value. Pure numpy, no torch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import xarray as xr

from postcast.datasets import schema

# median bands (canonical units) for variables without levels, or at every level
_BANDS: dict[str, tuple[float, float]] = {
    "t": (170.0, 320.0),
    "t2m": (200.0, 320.0),
    "skt": (190.0, 330.0),
    "sst": (265.0, 310.0),
    "msl": (9.5e4, 1.06e5),
    "q": (0.0, 0.03),
    # derived targets (their own units): a field's median 10 m wind speed, 24 h precipitation
    "ws10": (0.0, 40.0),
    "tp24": (0.0, 50.0),
}
# (name, scale, offset): value_seen = true * scale + offset for a mistake; used to name the cause
_MISTAKES: dict[str, list[tuple[str, float, float]]] = {
    "z": [
        (
            "geopotential height in m labelled as geopotential (m2 s-2): multiply by 9.80665 or set units 'm'",
            1 / schema.GRAVITY,
            0.0,
        ),
        ("geopotential labelled as height in m (converted twice): set units 'm**2 s**-2'", schema.GRAVITY, 0.0),
        ("geopotential in dam labelled as m2 s-2: set units 'dam'", 1 / (10 * schema.GRAVITY), 0.0),
    ],
    "t": [
        ("temperature in degC labelled as K: set units 'degC'", 1.0, -273.15),
        ("temperature in K labelled as degC (shifted twice): set units 'K'", 1.0, 273.15),
    ],
    "msl": [
        ("pressure in hPa labelled as Pa: set units 'hPa'", 0.01, 0.0),
        ("pressure in Pa labelled as hPa: set units 'Pa'", 100.0, 0.0),
    ],
    "q": [("specific humidity in g/kg labelled as kg/kg: set units 'g/kg'", 1000.0, 0.0)],
    "tp24": [("precipitation in mm labelled as m: set units 'mm'", 1000.0, 0.0)],
}
for _alias in ("t2m", "skt", "sst"):
    _MISTAKES[_alias] = _MISTAKES["t"]


def standard_geopotential(level_hpa: float) -> float:
    """Geopotential (m2 s-2) of a pressure level in the ICAO standard atmosphere (troposphere formula,
    isothermal above 226.32 hPa)."""
    if level_hpa >= 226.32:
        height = 44330.8 * (1.0 - (level_hpa / 1013.25) ** 0.190263)
    else:
        height = 11000.0 + 6341.6 * np.log(226.32 / level_hpa)
    return schema.GRAVITY * float(height)


def band(variable: str, level: int | None) -> tuple[float, float] | None:
    """The plausible range of the median of one field (None: no check for this variable)."""
    if variable == "z" and level is not None:
        z0 = standard_geopotential(level)
        tol = max(0.2 * z0, 1500.0 * schema.GRAVITY)  # weather moves a level by far less than this
        return (z0 - tol, z0 + tol)
    return _BANDS.get(variable)


SAMPLE = 200_000  # values whose median stands for a field's (a 0.5 deg field of 10 members has 2.6 million)


def problem(variable: str, level: int | None, values: np.ndarray, units: str | None = None) -> str | None:
    """None if the field's median is plausible, else a sentence naming the value and the likely fix
    (``units``: the field's, default its schema variable's)."""
    limits = band(variable, level)
    flat = values.ravel()
    sample = flat[:: max(1, flat.size // SAMPLE)]  # an evenly strided sample: the bands are ~20 % wide
    finite = sample[np.isfinite(sample)]
    if limits is None or finite.size == 0:
        return None
    med = float(np.median(finite))
    lo, hi = limits
    if lo <= med <= hi:
        return None
    units = units or schema.VARIABLES[variable].units
    where = f" at {level} hPa" if level is not None else ""
    text = f"{variable!r}{where} has median {med:.4g} {units}, outside the plausible {lo:.4g}..{hi:.4g} {units}"
    for cause, scale, offset in _MISTAKES.get(variable, []):
        true = (med - offset) / scale
        if lo <= true <= hi:
            return f"{text}: looks like {cause}"
    return f"{text}: wrong units or corrupt data? check the units attribute"


def value_range(tg: schema.Target) -> tuple[float, float]:
    """The physically possible values of a target (its units): its variable's range, or for a derived
    target the range its declaration makes of its variables' (a magnitude: 0 up to that of the largest
    components; an accumulation: its lower clip, or 0, up to the variable's largest amount, scaled)."""
    if tg.derive is None:
        var = schema.VARIABLES[tg.variable]
        return var.valid_min, var.valid_max
    parts = [schema.VARIABLES[v] for v in tg.derive.variables]
    if tg.derive.kind is schema.DeriveKind.HYPOT:
        return 0.0, float(np.hypot.reduce([max(abs(v.valid_min), abs(v.valid_max)) for v in parts]))
    low = 0.0 if tg.derive.clip_min is None else tg.derive.clip_min
    return low * tg.derive.scale, parts[0].valid_max * tg.derive.scale


def target_problem(tg: schema.Target, values: np.ndarray) -> str | None:
    """None if a target's field (e.g. its truth) is plausible: its median within its variable's band (at
    its level, as a forecast's fields are checked) and every finite value within :func:`value_range`; else
    a sentence naming the value and the likely fix."""
    bad = problem(tg.variable, tg.level, values, tg.units)
    finite = values[np.isfinite(values)]
    if bad or finite.size == 0:
        return bad
    lo, hi = value_range(tg)
    seen_lo, seen_hi = float(finite.min()), float(finite.max())
    if seen_lo < lo or seen_hi > hi:
        return (
            f"{tg.name} spans {seen_lo:.4g}..{seen_hi:.4g} {tg.units}, outside the possible {lo:.4g}..{hi:.4g} "
            f"{tg.units}: wrong units or corrupt data? check the units attribute"
        )
    return None


def infinite(ds: xr.Dataset) -> tuple[str, str] | None:
    """None when no value of ``ds`` is infinite, else the first variable holding one and a sentence saying
    how many, the first's sign and where (its coordinates but latitude and longitude: a step in hours)."""
    for name, da in ds.data_vars.items():
        values = np.asarray(da.values)
        if not np.issubdtype(values.dtype, np.floating) or _all_finite(values):
            continue
        inf = np.isinf(values)
        if not inf.any():
            continue
        at = np.unravel_index(int(np.argmax(inf)), values.shape)
        where = {
            str(d): label(da[d].values[i])
            for d, i in zip(da.dims, at, strict=True)
            if d in da.coords and d not in (schema.LAT, schema.LON)
        }
        return str(name), f"{int(inf.sum())} infinite values in {str(name)!r} (the first {values[at]:+g} at {where})"
    return None


def _all_finite(values: np.ndarray) -> bool:
    """True when no value is infinite or NaN, in one pass and no mask: the sum of finite values is finite
    (unless it overflows, or a value is NaN: then False, and the caller looks value by value)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return bool(np.isfinite(np.sum(values)))


def label(value: Any) -> str:
    """A coordinate value as a reader says it: a step in hours (not nanoseconds), a date, a level."""
    if isinstance(value, np.timedelta64):
        return f"{value / np.timedelta64(1, 'h'):g} h"
    if isinstance(value, np.datetime64):
        return str(np.datetime_as_string(value, unit="h"))
    return str(value.item() if isinstance(value, np.generic) else value)
