"""The ENS-10 schema as code: variables, levels, canonical names, targets and calendar (the grid and the
splits by init year are re-exported from :mod:`postcast.datasets.core.geo` and :mod:`postcast.datasets.core.splits`).

Everything that knows what ENS-10 *is* lives here; readers, writers and the generator import it.
The dataset itself (members, dates, grid, variables, files, targets, splits) is described in
docs/ens10.md; this module is that description as code.

Canonical conventions of every postcast dataset (after :func:`postcast.datasets.sources.conventions.normalise`):

===============  ==========================================================================
dimension        meaning
===============  ==========================================================================
``init_time``    forecast initialisation time, datetime64[ns] (00 UTC)
``member``       perturbed ensemble member, int 1..10 (ENS-10 ``number``)
``step``         lead time, timedelta64[ns] (0, 24, 48 h)
``level``        pressure level in hPa, int, ascending 10 .. 1000
``latitude``     degrees north, **ascending** -90 .. 90 (ENS-10 files are descending)
``longitude``    degrees east, 0 .. 360 - resolution
===============  ==========================================================================

``valid_time`` is a coordinate ``init_time + step``.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np
import pandas as pd

from postcast.datasets import laws
from postcast.datasets.core.errors import ConfigError
from postcast.datasets.core.geo import Grid as Grid  # the grid is geometry: it lives in core/geo.py
from postcast.datasets.core.splits import Splits as Splits  # the splits by init year: core/splits.py

# --- canonical dimension names -------------------------------------------------------------------
INIT_TIME = "init_time"
MEMBER = "member"
STEP = "step"
LEVEL = "level"
LAT = "latitude"
LON = "longitude"
VALID_TIME = "valid_time"

PL_DIMS = (INIT_TIME, MEMBER, STEP, LEVEL, LAT, LON)  # pressure-level member fields
SFC_DIMS = (INIT_TIME, MEMBER, STEP, LAT, LON)  # surface member fields

GRAVITY = 9.80665  # m s-2, WMO standard gravity (geopotential = g * geopotential height)

# ENS-10 pressure levels in hPa (ascending; GRIB files list them in any order).
LEVELS: tuple[int, ...] = (10, 50, 100, 200, 300, 400, 500, 700, 850, 925, 1000)
STEPS_H: tuple[int, ...] = (0, 24, 48)
N_MEMBERS = 10
REFORECAST_YEARS: tuple[int, ...] = tuple(range(1998, 2018))
TARGET_STEP_H = 48


def target_step_h(steps_h: tuple[int, ...] | list[int]) -> int:
    """The lead a store is judged at: 48 h (ENS-10's) when it has it, else its longest (a +78 h store)."""
    return TARGET_STEP_H if TARGET_STEP_H in steps_h or not steps_h else max(steps_h)


class LevelType(StrEnum):
    PRESSURE = "isobaricInhPa"
    SURFACE = "surface"


@dataclass(frozen=True)
class Variable:
    """One ENS-10 variable: canonical name, GRIB identity, CF metadata and a plausibility range."""

    name: str  # canonical (= cfgrib) name, e.g. "t2m"
    grib_short_name: str  # eccodes shortName, e.g. "2t"
    param_id: int  # ECMWF GRIB parameter id (table 128)
    units: str  # canonical units (ECMWF parameter database)
    long_name: str
    standard_name: str | None
    level_type: LevelType
    valid_min: float  # physically plausible range, used by validation
    valid_max: float
    accumulated: bool = False  # accumulated since init (cp, tp)
    missing_over_land: bool = False  # sst
    # a parameter beyond the schema, taken on request from the GRIB keys (no plausibility range, no checks)
    generic: bool = False
    extra_attrs: tuple[tuple[str, str], ...] = ()  # further CF attributes (cell_methods, the GRIB level type)

    @property
    def on_levels(self) -> bool:
        """Whether the variable has a pressure-level dimension."""
        return self.level_type is LevelType.PRESSURE

    @property
    def dims(self) -> tuple[str, ...]:
        """Its canonical member-field dims: (init_time, member, step[, level], latitude, longitude)."""
        return PL_DIMS if self.on_levels else SFC_DIMS


def _pl(name: str, pid: int, units: str, long: str, std: str | None, lo: float, hi: float) -> Variable:
    return Variable(name, name, pid, units, long, std, LevelType.PRESSURE, lo, hi)


PL_VARIABLES: tuple[Variable, ...] = (
    _pl("z", 129, "m**2 s**-2", "Geopotential", "geopotential", -5.0e3, 3.5e5),
    _pl("t", 130, "K", "Temperature", "air_temperature", 150.0, 350.0),
    _pl("q", 133, "kg kg**-1", "Specific humidity", "specific_humidity", 0.0, 0.05),
    _pl("w", 135, "Pa s**-1", "Vertical velocity", "lagrangian_tendency_of_air_pressure", -20.0, 20.0),
    _pl("d", 155, "s**-1", "Divergence", "divergence_of_wind", -5e-3, 5e-3),
    _pl("u", 131, "m s**-1", "U component of wind", "eastward_wind", -200.0, 200.0),
    _pl("v", 132, "m s**-1", "V component of wind", "northward_wind", -200.0, 200.0),
)


def _sfc(
    name: str, short: str, pid: int, units: str, long: str, std: str | None, lo: float, hi: float, **kw: Any
) -> Variable:
    return Variable(name, short, pid, units, long, std, LevelType.SURFACE, lo, hi, **kw)


SFC_VARIABLES: tuple[Variable, ...] = (
    _sfc(
        "sst",
        "sst",
        34,
        "K",
        "Sea surface temperature",
        "sea_surface_temperature",
        260.0,
        320.0,
        missing_over_land=True,
    ),
    _sfc("tcw", "tcw", 136, "kg m**-2", "Total column water", None, 0.0, 150.0),
    _sfc(
        "tcwv",
        "tcwv",
        137,
        "kg m**-2",
        "Total column vertically-integrated water vapour",
        "atmosphere_mass_content_of_water_vapor",
        0.0,
        150.0,
    ),
    _sfc("cp", "cp", 143, "m", "Convective precipitation", None, 0.0, 1.0, accumulated=True),
    _sfc("tp", "tp", 228, "m", "Total precipitation", None, 0.0, 1.0, accumulated=True),
    _sfc("msl", "msl", 151, "Pa", "Mean sea level pressure", "air_pressure_at_mean_sea_level", 8.5e4, 1.1e5),
    _sfc("tcc", "tcc", 164, "(0 - 1)", "Total cloud cover", "cloud_area_fraction", 0.0, 1.0),
    _sfc("u10", "10u", 165, "m s**-1", "10 metre U wind component", "eastward_wind", -100.0, 100.0),
    _sfc("v10", "10v", 166, "m s**-1", "10 metre V wind component", "northward_wind", -100.0, 100.0),
    _sfc("t2m", "2t", 167, "K", "2 metre temperature", "air_temperature", 180.0, 340.0),
    _sfc("skt", "skt", 235, "K", "Skin temperature", "surface_temperature", 180.0, 350.0),
)

VARIABLES: dict[str, Variable] = {v.name: v for v in (*PL_VARIABLES, *SFC_VARIABLES)}
BY_SHORT_NAME: dict[str, Variable] = {v.grib_short_name: v for v in VARIABLES.values()}
BY_PARAM_ID: dict[int, Variable] = {v.param_id: v for v in VARIABLES.values()}


def _aliases() -> dict[str, str]:
    """Every name a user may type for a schema variable -> its postcast name: the postcast (= cfgrib) name,
    the GRIB shortName, the paramId, the ECMWF long name and the CF standard name where only one variable
    has it (``air_temperature`` is t and t2m: not an alias). Matched case-insensitively."""
    std = [v.standard_name for v in VARIABLES.values() if v.standard_name]
    out: dict[str, str] = {}
    for v in VARIABLES.values():
        names = [v.name, v.grib_short_name, str(v.param_id), v.long_name]
        names += [v.standard_name] if v.standard_name and std.count(v.standard_name) == 1 else []
        out |= {n.lower(): v.name for n in names}
    return out


ALIASES: dict[str, str] = _aliases()


def resolve(name: str) -> str | None:
    """The postcast name of a variable as a user types it (postcast or cfgrib name, GRIB shortName,
    paramId, long or unique CF standard name), or None when the schema does not know it."""
    return ALIASES.get(name.strip().lower())


def variable(name: str) -> Variable:
    """Look a schema variable up by any name :func:`resolve` knows."""
    canonical = resolve(name)
    if canonical is not None:
        return VARIABLES[canonical]
    msg = f"unknown ENS-10 variable {name!r}; known: {', '.join(VARIABLES)}"
    raise KeyError(msg)


def cf_attrs(var: Variable) -> dict[str, Any]:
    """The CF attributes of a variable as postcast writes them: units, long name, GRIB short name and
    parameter id, and the CF standard name where one exists."""
    attrs: dict[str, Any] = {
        "units": var.units,
        "long_name": var.long_name,
        "GRIB_shortName": var.grib_short_name,
        "GRIB_paramId": var.param_id,
    }
    if var.standard_name:
        attrs["standard_name"] = var.standard_name
    if var.accumulated and not var.generic:
        attrs["cell_methods"] = "time: sum"
        attrs["time_window"] = "accumulated from the start of the forecast (step 0) to the step"
    return attrs | dict(var.extra_attrs)


# --- targets -------------------------------------------------------------------------------------
class TargetKind(StrEnum):
    VARIABLE = "variable"  # a schema variable (at a level) at the lead
    DERIVED = "derived"  # computed per member from schema variables (wind speed, a 24 h amount)


class DeriveKind(StrEnum):
    HYPOT = "hypot"  # the magnitude sqrt(a^2 + b^2 + ...) of components at the lead (10 m wind speed)
    ACCUMULATION = "accumulation difference"  # an accumulated variable's amount over the window ending at the lead


@dataclass(frozen=True)
class Derivation:
    """How a derived target's values come from schema variables, as data: ``kind`` over ``variables``
    (:class:`DeriveKind`), over ``window_h`` hours for an accumulation, clipped below at ``clip_min`` (None:
    not clipped), then times ``scale`` (the variables' units -> the target's: m -> mm is 1000).

    Forecast members read the variables at the lead plus the offsets of :attr:`inputs` (an accumulation from
    the start: at the lead and ``window_h`` before); a truth file's fields are combined the same way
    (:func:`postcast.datasets.sources.derived.normalise_truth`; there an accumulation's amounts per
    interval are summed over the window)."""

    kind: DeriveKind
    variables: tuple[str, ...]  # the schema variables it is computed from, e.g. ("u10", "v10") or ("tp",)
    window_h: int = 0  # an accumulation's window (hours up to the lead)
    clip_min: float | None = None
    scale: float = 1.0

    def __post_init__(self) -> None:
        one = self.kind is DeriveKind.ACCUMULATION
        if (len(self.variables) != 1) if one else (len(self.variables) < 2):
            msg = f"a {self.kind} derivation over {self.variables}: give {'one variable' if one else 'two or more'}"
            raise ConfigError(msg)

    @property
    def inputs(self) -> tuple[tuple[str, int], ...]:
        """(schema variable, lead offset in hours) pairs, in the order :meth:`__call__` takes their values."""
        if self.kind is DeriveKind.ACCUMULATION:
            return ((self.variables[0], 0), (self.variables[0], -self.window_h))
        return tuple((v, 0) for v in self.variables)

    def __call__(self, *values: np.ndarray) -> np.ndarray:
        """The derived values from the values of :attr:`inputs` (elementwise; numpy or dask arrays)."""
        if self.kind is DeriveKind.HYPOT:
            out = functools.reduce(np.hypot, values)
        else:
            later, earlier = values
            out = later - earlier
        if self.clip_min is not None:
            out = np.maximum(out, self.clip_min)  # packing noise can make an accumulation shrink
        return out * self.scale if self.scale != 1.0 else out

    def describe(self) -> str:
        """For messages: ``u10 and v10``, ``tp``."""
        return " and ".join(self.variables)


@dataclass(frozen=True)
class Target:
    """A post-processing target: a variable at a level (None for surface) at the lead ``lead_h``, or a
    quantity derived per member from schema variables (``derive``: its :class:`Derivation`, data), with
    its units, default predictive family and exceedance thresholds. Resolve a name with :func:`target`."""

    name: str  # "z500", "t850", "t2m", "ws10", "tp24"
    variable: str  # the schema variable; a derived target: its own name
    level: int | None
    # Reference scale of the 48 h forecast error (units of the target); sets synthetic magnitudes.
    error_scale: float
    derive: Derivation | None = None  # a derived target's declaration; None: a variable target
    unit: str | None = None  # a derived target's units (a variable target has its variable's)
    cf_standard_name: str | None = None  # a derived target's CF standard name (a variable target: its variable's)
    lead_h: int = TARGET_STEP_H
    family: str = laws.DEFAULT  # the target's predictive family (datasets/laws.py)
    thresholds: tuple[float, ...] = ()  # default exceedance thresholds (units); () = climate quantiles
    dry_below: float | None = None  # a member below this (units) is dry: the dry fraction is a predictor
    colour_map: str | None = None  # its maps' matplotlib colour map from zero up (a non-negative amount or speed);
    # None: plasma over the field's range (pipeline/products/maps.py)

    @property
    def kind(self) -> TargetKind:
        return TargetKind.VARIABLE if self.derive is None else TargetKind.DERIVED

    @property
    def units(self) -> str:
        return self.unit or VARIABLES[self.variable].units

    @property
    def standard_name(self) -> str | None:
        """The CF standard name of the target's values (None when CF has none)."""
        return self.cf_standard_name if self.derived else VARIABLES[self.variable].standard_name

    @property
    def derived(self) -> bool:
        return self.derive is not None

    @property
    def inputs(self) -> tuple[tuple[str, int], ...]:
        """A derived target's (schema variable, lead offset h) pairs, e.g. ("tp", -24); () for a variable target."""
        return self.derive.inputs if self.derive is not None else ()

    @property
    def input_variables(self) -> tuple[str, ...]:
        """The schema variables the target is read or derived from (in order, once each)."""
        return self.derive.variables if self.derive is not None else (self.variable,)

    def members(self, read: Callable[[str, int], np.ndarray]) -> np.ndarray:
        """The target's member values (M, ...) at a lead: ``read(variable, offset_h)`` gives a variable's
        members (M, ...) at the lead plus ``offset_h``; a variable target reads its variable."""
        if self.derive is None:
            return read(self.variable, 0)
        return self.derive(*(read(v, off) for v, off in self.derive.inputs))


TARGETS: dict[str, Target] = {
    "z500": Target("z500", "z", 500, error_scale=140.0),  # m2 s-2 (~14 m of height)
    "t850": Target("t850", "t", 850, error_scale=1.2),  # K
    "t2m": Target("t2m", "t2m", None, error_scale=1.3),  # K
    "ws10": Target(
        "ws10",
        "ws10",
        None,
        error_scale=1.5,
        derive=Derivation(DeriveKind.HYPOT, ("u10", "v10")),
        unit="m s**-1",
        cf_standard_name="wind_speed",
        family="truncnormal",
        thresholds=(10.0, 20.0),
        colour_map="viridis",
    ),  # 10 m wind speed, m/s
    "tp24": Target(
        "tp24",
        "tp24",
        None,
        error_scale=2.0,
        derive=Derivation(DeriveKind.ACCUMULATION, ("tp",), window_h=24, clip_min=0.0, scale=1000.0),
        unit="mm",
        cf_standard_name="lwe_thickness_of_precipitation_amount",
        family="csg",
        thresholds=(1.0, 10.0),
        dry_below=0.1,
        colour_map="YlGnBu",
    ),  # mm in the 24 h up to the lead (tp in m)
}


def target(name: str) -> Target:
    """The target called ``name`` (a key of :data:`TARGETS`): resolve names once, where they come in (options,
    configs, checkpoint metadata, file attributes), and pass the :class:`Target` on. ConfigError naming the
    known targets for any other name."""
    found = TARGETS.get(name)
    if found is None:
        msg = f"target {name!r}: use one of {list(TARGETS)}"
        raise ConfigError(msg)
    return found


def derived_targets() -> tuple[Target, ...]:
    """The targets computed from schema variables (ws10, tp24), in :data:`TARGETS` order."""
    return tuple(t for t in TARGETS.values() if t.derived)


ENS10_TARGETS: tuple[str, ...] = ("z500", "t850", "t2m")  # the ENS-10 benchmark's three (Gaussian)
DEFAULT_TARGET = "t850"  # what a sample spec or a preset without a target post-processes


# --- calendar ------------------------------------------------------------------------------------
def ens10_month_days() -> list[tuple[int, int]]:
    """The 105 (month, day) pairs of ENS-10: the Mondays and Thursdays of 2018."""
    return list(_ens10_month_days())


@functools.cache
def _ens10_month_days() -> tuple[tuple[int, int], ...]:
    days = pd.date_range("2018-01-01", "2018-12-31", freq="D")
    picked = days[(days.day_of_week == 0) | (days.day_of_week == 3)]
    return tuple((int(d.month), int(d.day)) for d in picked)


def month_days_subset(n: int) -> list[tuple[int, int]]:
    """``n`` month-days spread evenly over the ENS-10 calendar (all 105 when n >= 105)."""
    all_md = ens10_month_days()
    if n <= 0:
        msg = f"dates_per_year must be positive, got {n}"
        raise ConfigError(msg)
    if n >= len(all_md):
        return all_md
    idx = np.floor((np.arange(n) + 0.5) * len(all_md) / n).astype(int)  # centres of n equal parts
    return [all_md[i] for i in idx]


def init_times(years: tuple[int, ...] | list[int], month_days: list[tuple[int, int]]) -> pd.DatetimeIndex:
    """Sorted 00 UTC init times for every year x month-day."""
    stamps = [dt.datetime(y, m, d) for y in years for (m, d) in month_days]
    return pd.DatetimeIndex(sorted(stamps), name=INIT_TIME)


def file_date_label(month: int, day: int) -> str:
    """The ``2018MMDD`` label of ENS-10 file names (the reforecast-production calendar)."""
    return f"2018{month:02d}{day:02d}"
