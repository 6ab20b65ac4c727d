"""What every raw source shares: the request (:class:`Expectation`), what a source holds (:class:`Plan`),
the value checks, and the :class:`ForecastSource` interface each source kind implements."""

from __future__ import annotations

import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from postcast.datasets import plausibility, schema
from postcast.datasets.core.errors import BadInputError, ConfigError, MissingInputError
from postcast.datasets.schema import LevelType, Variable
from postcast.datasets.sources import conventions, regrid

log = logging.getLogger(__name__)

MAX_REPORTED = 20  # missing items printed in an error message (the JSON report has them all)


def parse_members(spec: str | int | None) -> tuple[str, int, int]:
    """``--members``: ``all`` (what the source has), a count ``N`` (the first N members the source
    numbers) or an inclusive range ``A:B`` (``0:9``). Returns (kind, a, b); ValueError names the fix."""
    text = "all" if spec is None else str(spec).strip().lower()
    if text == "all":
        return ("all", 0, 0)
    a, sep, b = text.partition(":")
    if a.isdigit() and (not sep or b.isdigit()):
        if not sep:
            if int(a) < 1:
                msg = f"--members {spec}: a count must be at least 1"
                raise ConfigError(msg)
            return ("count", int(a), 0)
        if int(b) >= int(a):
            return ("range", int(a), int(b))
    msg = f"--members {spec!r}: give a count (10), an inclusive range (0:9 or 1:10) or all"
    raise ConfigError(msg)


def _span(members: list[int] | tuple[int, ...]) -> str:
    """0-9 for consecutive numbers, else the list."""
    m = sorted(members)
    if not m:
        return "none"
    return f"{m[0]}-{m[-1]}" if m == list(range(m[0], m[-1] + 1)) and len(m) > 1 else ",".join(map(str, m))


MIN_GRID_DEG = 0.1  # the finest store grid: 1801 x 3600 points
MIN_GRID_BYTES = 4 * 1801 * 3600  # one float32 field on it


def _distinct(name: str, values: tuple[Any, ...] | None) -> None:
    """An asked-for list names each item once and is not empty (None: whatever the source holds)."""
    if values is None:
        return
    if not values:
        msg = f"--{name} is empty: name at least one, or leave it out to take what the source holds"
        raise ConfigError(msg)
    twice = sorted({v for v in values if values.count(v) > 1})
    if twice:
        msg = f"--{name} lists {', '.join(map(str, twice))} more than once: give each once"
        raise ConfigError(msg)


@dataclass(frozen=True)
class Expectation:
    """What a complete forecast source must hold for every init date; ``None`` (and members ``all``):
    whatever the source has (the default: never the full ENS-10 schema unless asked)."""

    # None: every ENS-10 variable the source holds; names as users type them (2t, 167, t2m: see schema.resolve),
    # kept as given when the schema does not know them (a GRIB parameter beyond it, resolved against the file)
    variables: tuple[str, ...] | None = None
    levels: tuple[int, ...] | None = None  # None: the levels the source holds (same for all dates)
    members: str | int = "all"  # all | count N | range A:B (see parse_members)
    steps_h: tuple[int, ...] | None = None  # None: the steps the source holds
    grid: float | None = None  # target resolution (deg) over the source's area; None: the source's own grid
    method: str = "bilinear"  # regridding method when the source is on another grid
    exact_grid: schema.Grid | None = None  # this grid and no other (a checkpoint's); the source must cover it

    def __post_init__(self) -> None:
        if self.variables is not None:
            _unambiguous(self.variables)
            object.__setattr__(self, "variables", tuple(schema.resolve(v) or v for v in self.variables))
        for name, values in (("variables", self.variables), ("levels", self.levels), ("steps", self.steps_h)):
            _distinct(name, values)
        if self.levels is not None:
            bad = [lv for lv in self.levels if lv not in schema.LEVELS]
            if bad:
                msg = f"levels {bad} are not ENS-10 levels {list(schema.LEVELS)}"
                raise ConfigError(msg)
        parse_members(self.members)
        if self.grid is not None:
            if not (math.isfinite(self.grid) and MIN_GRID_DEG <= self.grid <= 90.0):
                msg = (
                    f"--grid {self.grid}: give a resolution between {MIN_GRID_DEG} and 90 degrees (finer grids "
                    f"exceed {MIN_GRID_BYTES / 1e6:.0f} MB per float32 field)"
                )
                raise ConfigError(msg)
            schema.Grid(self.grid)  # ValueError naming usable resolutions
        if self.method not in regrid.METHODS:
            msg = f"regridding method {self.method!r}: use one of {', '.join(regrid.METHODS)}"
            raise ConfigError(msg)

    def pick_members(self, have: list[int], source: str) -> tuple[int, ...]:
        """The members to read, or :class:`MissingInputError` in the user's terms with the fix."""
        kind, a, b = parse_members(self.members)
        have = sorted(have)
        ctrl = " (0 is the control)" if 0 in have else ""
        fix = f"pass --members {have[0]}:{have[-1]} or --members all" if have else "check the file"
        if kind == "all":
            if not have:
                raise_missing(["members (no ensemble members found)"], source, "items")
            return tuple(have)
        if kind == "count":
            if len(have) < a:
                raise_missing(
                    [f"members {_span(have)} found{ctrl}, {a} expected: pass --members {len(have)} or --members all"],
                    source,
                    "items",
                )
            return tuple(have[:a])
        want = list(range(a, b + 1))
        lacking = [m for m in want if m not in have]
        if lacking:
            raise_missing([f"members {_span(have)} found{ctrl}, {a}-{b} expected: {fix}"], source, "items")
        return tuple(want)

    def pick(
        self, what: str, asked: tuple[int, ...] | None, have: list[int], unit: str, source: str
    ) -> tuple[int, ...]:
        """Levels or steps: those asked (all must be there) or, by default, those the source has."""
        if asked is None:
            return tuple(sorted(have))
        lacking = [x for x in asked if x not in have]
        if lacking:
            hint = (
                f"the source has {', '.join(map(str, sorted(have))) or 'none'} {unit}: pass --{what} "
                f"{','.join(map(str, sorted(have)))} or omit it"
            )
            raise_missing([f"{what.removesuffix('s')} {x} {unit} ({hint})" for x in lacking], source, "items")
        return tuple(sorted(asked))


@dataclass
class Plan:
    """What a source holds once checked; the shape of the store ingestion will write. ``grid`` is the
    target grid; ``source_grid`` is where the source's values sit (None: already on ``grid``)."""

    init_times: list[pd.Timestamp]
    variables: tuple[str, ...]
    levels: tuple[int, ...]
    members: tuple[int, ...]
    steps_h: tuple[int, ...]
    grid: schema.Grid
    files: list[str] = field(default_factory=list)
    source_grid: regrid.SourceGrid | None = None
    method: str = "bilinear"
    generic: dict[str, schema.Variable] = field(default_factory=dict)  # parameters beyond the schema, by name

    def variable(self, name: str) -> schema.Variable:
        """A variable of the plan: the schema's, or a generic one described by the source's GRIB keys."""
        return self.generic[name] if name in self.generic else schema.VARIABLES[name]

    @property
    def regridding(self) -> dict[str, str]:
        """Provenance of the horizontal grid, for the store and the forecast files."""
        if self.source_grid is None:
            return {"source_grid": self.grid.describe(), "regrid_method": "none"}
        return {"source_grid": self.source_grid.name, "regrid_method": self.method}

    def to_dict(self) -> dict[str, Any]:
        generic = {"generic_variables": {n: dict(schema.cf_attrs(v)) for n, v in self.generic.items()}}
        return {
            "init_times": [str(t) for t in self.init_times],
            "variables": list(self.variables),
            "levels": list(self.levels),
            "members": list(self.members),
            "steps_h": list(self.steps_h),
            "resolution": self.grid.resolution,
            "area": self.grid.area,
            "files": self.files,
            **self.regridding,
            **(generic if self.generic else {}),
        }


def raise_missing(missing: list[str], source: str, what: str = "forecast fields", fix: str | None = None) -> None:
    if not missing:
        return
    shown = "; ".join(missing[:MAX_REPORTED])
    more = f" ... and {len(missing) - MAX_REPORTED} more" if len(missing) > MAX_REPORTED else ""
    msg = f"{source}: {len(missing)} {what} missing: {shown}{more}{f'; {fix}' if fix else ''}"
    raise MissingInputError(msg, missing=missing)


def _missing_slices(da: xr.DataArray, source: str) -> None:
    """Whole members, levels or steps that are all NaN (a file lacking them, joined with others):
    reported as missing, not as NaN values."""
    for dim in (schema.MEMBER, schema.LEVEL, schema.STEP):
        if dim not in da.dims or da.sizes[dim] < 2:
            continue
        other = [d for d in da.dims if d != dim]
        empty = np.isnan(da.values).all(axis=tuple(da.dims.index(d) for d in other))
        if empty.any():
            labels = [str(x) for x in np.asarray(da[dim].values)[empty]]
            msg = (
                f"{source}: {dim} {', '.join(labels)} of {da.name!r} missing on this date (another date or file has "
                f"it); add the file that holds it or pass --{dim}s without {labels[0]}"
            )
            raise MissingInputError(msg)


def check_values(ds: xr.Dataset, source: str, generic: frozenset[str] = frozenset()) -> None:
    """NaNs only where they belong (SST over land), values within physical ranges, each field's median
    plausible for its variable and level (datasets/plausibility.py). The ``generic`` variables (beyond the
    schema: no known range) are only checked not to be entirely missing."""
    for name, da in ds.data_vars.items():
        values = np.asarray(da.values)
        if name in generic:
            if np.isnan(values).all():
                msg = f"{source}: {name!r} is entirely missing"
                raise BadInputError(msg)
            continue
        var = schema.VARIABLES[str(name)]
        lo, hi = float(values.min()), float(values.max())  # NaN when any value is: one pass, no mask
        nan = np.isnan(values) if np.isnan(lo) or np.isnan(hi) else np.zeros((), dtype=bool)
        if nan.any() and not var.missing_over_land:
            _missing_slices(da, source)
            where = {
                d: plausibility.label(da[d].values[i])
                for d, i in zip(da.dims, np.argwhere(nan)[0], strict=True)
                if d in da.coords and d not in (schema.LAT, schema.LON)
            }
            msg = f"{source}: {int(nan.sum())} NaN values in {name!r} (first at {where}); only sst may be missing"
            raise BadInputError(msg)
        if nan.all():
            msg = f"{source}: {name!r} is entirely missing"
            raise BadInputError(msg)
        _check_plausible(da, source)
        if name in _SUMMED:
            _check_accumulating(da, source)
        if nan.any():
            lo, hi = float(np.nanmin(values)), float(np.nanmax(values))
        if lo < var.valid_min or hi > var.valid_max:
            msg = (
                f"{source}: {name!r} spans {lo:.4g}..{hi:.4g} {var.units}, outside the plausible "
                f"{var.valid_min:g}..{var.valid_max:g}: {_range_fix(var, lo, hi)}"
            )
            raise BadInputError(msg)


def _range_fix(var: Variable, lo: float, hi: float) -> str:
    """The likely cause of values outside a variable's range: an amount in mm labelled as m, else unknown."""
    if var.units == "m" and var.valid_min <= lo / 1000 and hi / 1000 <= var.valid_max:
        return "looks like mm labelled as m: set units 'mm'"
    return "wrong units or corrupt data?"


# the accumulations a target's amount is taken from (tp for tp24): the difference of two steps
_SUMMED = {
    t.derive.variables[0]
    for t in schema.derived_targets()
    if t.derive and t.derive.kind is schema.DeriveKind.ACCUMULATION
}
ACCUMULATION_NOISE = 1e-4  # canonical units (tp: m, 0.1 mm): GRIB packing noise of an accumulation between steps


def _check_accumulating(da: xr.DataArray, source: str) -> None:
    """An accumulation from the forecast's start never shrinks from one step to the next (beyond packing
    noise): one that does is amounts per interval, or steps out of order, and a 24 h amount from it
    (clipped at 0) would be dry everywhere."""
    if schema.STEP not in da.dims or da.sizes[schema.STEP] < 2:
        return
    change = da.diff(schema.STEP)  # (..., step - 1, ...)
    shrinks = change < -ACCUMULATION_NOISE
    if bool(shrinks.any()):
        worst = change.where(shrinks).min(skipna=True)
        per_step = shrinks.any([d for d in da.dims if d != schema.STEP])  # (step - 1,)
        at = per_step[schema.STEP].values[int(per_step.values.argmax())]  # the later step of the first fall
        msg = (
            f"{source}: {da.name!r} decreases from one step to the next at {int(shrinks.sum())} values (by up to "
            f"{-float(worst):.4g} {da.attrs.get('units', '')}, first at step {pd.Timedelta(at)}): not an "
            f"accumulation from the forecast's start; give the running accumulation (the sum of the amounts up "
            f"to each step)"
        )
        raise BadInputError(msg)


def _check_plausible(da: xr.DataArray, source: str) -> None:
    levels = [int(x) for x in da[schema.LEVEL].values] if schema.LEVEL in da.dims else [None]
    for lv in levels:
        part = da.sel({schema.LEVEL: lv}) if lv is not None else da
        bad = plausibility.problem(str(da.name), lv, np.asarray(part.values))
        if bad:
            msg = f"{source}: {bad}"
            raise BadInputError(msg)


class ForecastSource(ABC):
    """A raw forecast source; see the module docstring."""

    path: Path

    @abstractmethod
    def plan(self, expect: Expectation) -> Plan: ...

    @abstractmethod
    def load(self, init_time: pd.Timestamp, plan: Plan, variables: Sequence[str] | None = None) -> xr.Dataset:
        """Init date ``init_time`` of ``variables`` (None: the plan's), each (1, member, step[, level], lat, lon)
        float32 on the plan's grid, checked (:func:`check_values`); only those variables are read."""

    @property
    def kind(self) -> str:
        return type(self).__name__.removesuffix("Source").lower()


def is_pressure_level(v: str) -> bool:
    return schema.VARIABLES[v].on_levels


def _unambiguous(names: tuple[str, ...]) -> None:
    """Refuse a name the schema gives to more than one variable (the CF standard name air_temperature: t and
    t2m) instead of looking it up in the file as an unknown parameter."""
    for name in names:
        sharing = [v.name for v in schema.VARIABLES.values() if (v.standard_name or "").lower() == name.strip().lower()]
        if schema.resolve(name) is None and len(sharing) > 1:
            msg = (
                f"--variables {name}: ambiguous, the CF standard name of {' and '.join(sharing)}; "
                f"give one of them, e.g. --variables {sharing[0]}"
            )
            raise ConfigError(msg)


def pick_variables(expect: Expectation, have: set[str], source: str) -> tuple[str, ...]:
    """The variables asked for (all must be there) or, by default, every ENS-10 variable the source has."""
    if expect.variables is None:
        if not have:
            raise_missing(["variables (no ENS-10 variable found)"], source, "items")
        return tuple(v for v in schema.VARIABLES if v in have)
    lacking = [v for v in expect.variables if v not in have]
    if lacking:
        hint = (
            f"the source has {', '.join(v for v in schema.VARIABLES if v in have) or 'none'}: pass --variables "
            f"{','.join(v for v in schema.VARIABLES if v in have)}"
        )
        raise_missing([f"variable {v} ({hint})" for v in lacking], source, "items")
    return tuple(expect.variables)


def target_grid(
    src: regrid.SourceGrid, expect: Expectation, source: str
) -> tuple[schema.Grid, regrid.SourceGrid | None]:
    """The grid to write (a checkpoint's exact grid, the asked resolution over the source's area, or
    the source's own grid) and the source grid to regrid from (None: no regridding)."""
    if expect.exact_grid is not None:
        grid = expect.exact_grid
        if not src.covers(grid):
            msg = (
                f"{source}: the input covers {regrid.coverage(src)} only; the model reads "
                f"{grid.describe()}: give an input that covers it, or train on a store of this area"
            )
            raise BadInputError(msg)
    else:
        try:
            grid = regrid.grid_at(src, expect.grid) if expect.grid is not None else regrid.default_grid(src)
        except ValueError as err:  # (its message says which --grid would do)
            msg = f"{source}: {err}"
            raise BadInputError(msg) from err
    if not src.is_grid(grid):
        log.info("%s: %s is not %s: regridding (%s)", source, src.name, grid.describe(), expect.method)
    return grid, (None if src.is_grid(grid) else src)


def regridded(ds: xr.Dataset, plan: Plan) -> xr.Dataset:
    """Every variable of one loaded date from ``plan.source_grid`` onto ``plan.grid``."""
    assert plan.source_grid is not None
    lead = [d for d in ds.dims if d not in (schema.LAT, schema.LON, conventions.POINTS)]
    coords = {d: ds[d].values for d in lead if d in ds.coords}
    coords |= {schema.LAT: plan.grid.latitudes(), schema.LON: plan.grid.longitudes()}
    out = {}
    for name, da in ds.data_vars.items():
        keep = [d for d in da.dims if d in lead]
        horiz = [conventions.POINTS] if conventions.POINTS in da.dims else [schema.LAT, schema.LON]
        values = regrid.to_grid(da.transpose(*keep, *horiz).values, plan.source_grid, plan.grid, plan.method)
        out[name] = xr.Variable((*keep, schema.LAT, schema.LON), values, da.attrs)
    return xr.Dataset(out, coords={k: v for k, v in coords.items()})


# cfgrib stepType (eccodes; GRIB2 typeOfStatisticalProcessing, GRIB1 timeRangeIndicator) -> CF cell method
CELL_METHODS = {
    "avg": "mean",
    "accum": "sum",
    "max": "maximum",
    "min": "minimum",
    "diff": "range",
    "rms": "root_mean_square",
    "sd": "standard_deviation",
}


def cell_method(step_type: str) -> str | None:
    """The CF ``cell_methods`` entry of a GRIB stepType ('time: mean' for avg and ECMWF's avgfc/avgua/...);
    None for instantaneous fields."""
    if step_type == "instant":
        return None
    base = "avg" if step_type.startswith("avg") else step_type
    return f"time: {CELL_METHODS.get(base, step_type)}"


def generic_variable(
    name: str,
    short_name: str,
    param_id: int,
    units: str,
    long_name: str,
    standard_name: str | None,
    type_of_level: str,
    step_type: str,
    window: str,
) -> Variable:
    """A parameter beyond the schema, described by its GRIB keys (eccodes' cfVarName, shortName, paramId,
    units, name, cfName, typeOfLevel, stepType); ``window`` says over what a time-processed field is taken."""
    extra = [("GRIB_typeOfLevel", type_of_level), ("GRIB_stepType", step_type)]
    method = cell_method(step_type)
    if method:
        extra += [("cell_methods", method), ("time_window", window)]
    level = LevelType.PRESSURE if type_of_level == LevelType.PRESSURE else LevelType.SURFACE
    return Variable(
        name,
        short_name,
        param_id,
        units,
        long_name,
        standard_name,
        level,
        -np.inf,
        np.inf,
        accumulated=step_type == "accum",
        generic=True,
        extra_attrs=tuple(extra),
    )
