"""The one place postcast opens raw data: ENS-10 GRIB, netCDF and zarr forecasts, ERA5-like truth.

:func:`discover` looks at a path and returns a :class:`ForecastSource` plus optional truth and
oracle sources. Every source answers two questions:

* :meth:`ForecastSource.plan`: what does it hold, and is it complete? (metadata only; raises
  :class:`MissingInputError` listing *every* missing member x step x level x variable per date);
* :meth:`ForecastSource.load`: one init time as a canonical, numpy-backed dataset
  (dims ``init_time=1, member, step, [level], latitude, longitude``), values checked.

Sources are small and picklable, so dask workers can load dates in parallel.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from postcast.datasets import conventions, grib, plausibility, regrid, schema
from postcast.datasets.errors import BadInputError, ConfigError, MissingInputError

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
                msg = (f"--grid {self.grid}: give a resolution between {MIN_GRID_DEG} and 90 degrees (finer grids "
                       f"exceed {MIN_GRID_BYTES / 1e6:.0f} MB per float32 field)")
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
                _raise_missing(["members (no ensemble members found)"], source, "items")
            return tuple(have)
        if kind == "count":
            if len(have) < a:
                _raise_missing([f"members {_span(have)} found{ctrl}, {a} expected: pass --members "
                                f"{len(have)} or --members all"], source, "items")
            return tuple(have[:a])
        want = list(range(a, b + 1))
        lacking = [m for m in want if m not in have]
        if lacking:
            _raise_missing([f"members {_span(have)} found{ctrl}, {a}-{b} expected: {fix}"], source, "items")
        return tuple(want)

    def pick(self, what: str, asked: tuple[int, ...] | None, have: list[int], unit: str,
             source: str) -> tuple[int, ...]:
        """Levels or steps: those asked (all must be there) or, by default, those the source has."""
        if asked is None:
            return tuple(sorted(have))
        lacking = [x for x in asked if x not in have]
        if lacking:
            hint = (f"the source has {', '.join(map(str, sorted(have))) or 'none'} {unit}: pass --{what} "
                    f"{','.join(map(str, sorted(have)))} or omit it")
            _raise_missing([f"{what.removesuffix('s')} {x} {unit} ({hint})" for x in lacking], source, "items")
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
        return {"init_times": [str(t) for t in self.init_times], "variables": list(self.variables),
                "levels": list(self.levels), "members": list(self.members), "steps_h": list(self.steps_h),
                "resolution": self.grid.resolution, "area": self.grid.area, "files": self.files, **self.regridding,
                **(generic if self.generic else {})}


def _raise_missing(missing: list[str], source: str, what: str = "forecast fields") -> None:
    if not missing:
        return
    shown = "; ".join(missing[:MAX_REPORTED])
    more = f" ... and {len(missing) - MAX_REPORTED} more" if len(missing) > MAX_REPORTED else ""
    msg = f"{source}: {len(missing)} {what} missing: {shown}{more}"
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
            msg = (f"{source}: {dim} {', '.join(labels)} of {da.name!r} missing on this date (another date or file has "
                   f"it); add the file that holds it or pass --{dim}s without {labels[0]}")
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
            where = {d: str(da[d].values[i]) for d, i in zip(da.dims, np.argwhere(nan)[0], strict=True)
                     if d in da.coords and d not in (schema.LAT, schema.LON)}
            msg = f"{source}: {int(nan.sum())} NaN values in {name!r} (first at {where}); only sst may be missing"
            raise BadInputError(msg)
        if nan.all():
            msg = f"{source}: {name!r} is entirely missing"
            raise BadInputError(msg)
        _check_plausible(da, source)
        if nan.any():
            lo, hi = float(np.nanmin(values)), float(np.nanmax(values))
        if lo < var.valid_min or hi > var.valid_max:
            msg = (f"{source}: {name!r} spans {lo:.4g}..{hi:.4g} {var.units}, outside the plausible "
                   f"{var.valid_min:g}..{var.valid_max:g}: wrong units or corrupt data?")
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
    def load(self, init_time: pd.Timestamp, plan: Plan) -> xr.Dataset: ...

    @property
    def kind(self) -> str:
        return type(self).__name__.removesuffix("Source").lower()


# --- GRIB ----------------------------------------------------------------------------------------
class GribSource(ForecastSource):
    """ENS-10 GRIB1 files (``output.pl.2018MMDD``, ``output.sfc.2018MMDD`` or any GRIB files)."""

    def __init__(self, files: list[Path], index: pd.DataFrame | None = None):
        self.files = sorted(files)
        self.path = self.files[0] if len(self.files) == 1 else self.files[0].parent  # names the input in messages
        self._index = index

    @property
    def index(self) -> pd.DataFrame:
        if self._index is None:
            self.set_index([grib.index_file(p) for p in self.files])
        assert self._index is not None
        return self._index

    def set_index(self, parts: list[pd.DataFrame]) -> None:
        """Install per-file indices (computed elsewhere, e.g. in parallel on dask workers)."""
        frames = [p.assign(file=str(f)) for p, f in zip(parts, self.files, strict=True)]
        self._index = pd.concat(frames, ignore_index=True)

    def plan(self, expect: Expectation) -> Plan:
        src = self.path
        ens10 = self._ens10_named()
        if ens10:
            expect = replace(expect, variables=expect.variables or tuple(schema.VARIABLES),
                             steps_h=expect.steps_h or schema.STEPS_H)
            self._only_schema(expect.variables or ())
        # ENS-10 files: what is lost is listed per message below, with the file it belongs in
        variables, generic = (expect.variables, {}) if ens10 and expect.variables else _grib_variables(
            self.index, expect, str(src))
        idx = self.index[self.index["var"].isin(variables)]
        _check_time_processing(idx, variables, str(src))
        if expect.steps_h is None:
            _check_same_steps(idx, str(src))
        grids = {f: grib.grid_of(g, f) for f, g in (idx if len(idx) else self.index).groupby("file")}
        if len({g.name for g in grids.values()}) > 1:
            detail = ", ".join(f"{Path(f).name}: {g.name}" for f, g in grids.items())
            msg = f"{self.path}: files on different grids ({detail}); ingest them separately"
            raise BadInputError(msg)
        dup = idx.duplicated(["var", "level", "member", "init_time", "step_h"])
        if dup.any():
            r = idx[dup].iloc[0]
            msg = (f"{r.file}: {int(dup.sum())} duplicate messages, e.g. {r['var']} level {r.level} member "
                   f"{r.member} {r.init_time:%Y-%m-%d} step {r.step_h} h")
            raise BadInputError(msg)
        on_levels = [v for v in variables if (generic[v] if v in generic else schema.VARIABLES[v]).on_levels]
        pl_rows = idx[idx["var"].isin(on_levels)]
        levels = expect.pick("levels", expect.levels, sorted(int(x) for x in set(pl_rows.level)), "hPa", str(src))
        members = expect.pick_members(sorted(int(m) for m in set(idx.member)), str(src))
        steps = expect.pick("steps", expect.steps_h, sorted(int(x) for x in set(idx.step_h)), "h", str(src))
        grid, source_grid = _target_grid(next(iter(grids.values())), expect, str(src))
        plan = Plan(sorted(pd.Timestamp(t) for t in idx.init_time.unique()), variables, levels, members, steps, grid,
                    [str(f) for f in self.files], source_grid, expect.method, generic)
        present = set(zip(idx["init_time"], idx["var"], idx["level"], idx["member"], idx["step_h"], strict=True))
        file_of = dict(zip(zip(idx["init_time"], idx["var"], strict=True), idx["file"], strict=True))

        def where(t: pd.Timestamp, v: str, lv: int) -> str:  # the ENS-10 file it belongs in, else the one read
            return grib.file_name("pl" if lv else "sfc", t.month, t.day) if ens10 else Path(
                file_of.get((t, v), str(src))).name

        missing = [
            f"{t:%Y-%m-%d} {v}{'' if lv == 0 else f' {lv} hPa'} member {m} step {s} h ({where(t, v, lv)})"
            for t in plan.init_times
            for v, lv in self._fields(plan)
            for m, s in itertools.product(plan.members, plan.steps_h)
            if (t, v, lv, m, s) not in present
        ]
        _raise_missing(missing, str(self.path))
        return plan

    def _ens10_named(self) -> bool:
        """Files named as ENS-10's (``output.pl.2018MMDD``) are defined to hold all 18 variables and steps
        0/24/48 h: for them that is the default expectation, so a lost file, variable or step is reported;
        any other source is expected to hold what it has."""
        return all(re.fullmatch(r"output\.(pl|sfc)\.2018\d{4}", Path(f).name) for f in self.files)

    def _only_schema(self, asked: tuple[str, ...]) -> None:
        """ENS-10 files hold its 18 variables only: another parameter there is a damaged message, and
        another name asked for is not there."""
        beyond = [v for v in asked if v not in schema.VARIABLES]
        if beyond:
            _raise_missing([f"variable {v} (ENS-10 files hold {', '.join(schema.VARIABLES)} only)" for v in beyond],
                           str(self.path), "items")
        idx = self.index
        bad = idx[~idx["var"].isin(list(schema.VARIABLES))]
        if len(bad):
            r = bad.iloc[0]
            i = int((idx.loc[: bad.index[0], "file"] == r.file).sum()) - 1
            msg = (f"{r.file}: message {i} holds {r.short_name!r} (paramId {r.param_id}), not an ENS-10 variable "
                   "(ENS-10 files hold its 18 variables only: a damaged message? re-fetch the file)")
            raise BadInputError(msg)

    @staticmethod
    def _fields(plan: Plan) -> list[tuple[str, int]]:
        out = []
        for v in plan.variables:
            out += [(v, lv) for lv in plan.levels] if plan.variable(v).on_levels else [(v, 0)]
        return out

    def load(self, init_time: pd.Timestamp, plan: Plan) -> xr.Dataset:
        idx = self.index
        rows = idx[idx.init_time == init_time].set_index(["var", "level", "member", "step_h"]).sort_index()
        shape = plan.source_grid.shape if plan.source_grid is not None else plan.grid.shape
        data = {}
        for v in plan.variables:
            pl = plan.variable(v).on_levels
            levels = plan.levels if pl else (0,)
            keys = list(itertools.product([v], levels, plan.members, plan.steps_h))
            sel = rows.loc[keys]
            flat = np.empty((len(keys), *shape), dtype=np.float32)  # (fields, *source grid)
            files = sel.file.to_numpy()
            for f in pd.unique(files):
                at = np.flatnonzero(files == f)
                msgs = zip(sel.offset.to_numpy()[at].tolist(), sel.length.to_numpy()[at].tolist(), strict=True)
                grib.decode_into(str(f), msgs, flat, at.tolist())
            if plan.source_grid is not None:  # (fields, *source) -> (fields, lat, lon)
                flat = regrid.to_grid(flat, plan.source_grid, plan.grid, plan.method)
            # keys are (level, member, step): reorder to (member, step, level)
            arr = flat.reshape(len(levels), len(plan.members), len(plan.steps_h), *plan.grid.shape)
            arr = np.moveaxis(arr, 0, 2)[None]  # (1, member, step, level, lat, lon)
            data[v] = arr if pl else arr[:, :, :, 0]
        ds = _assemble(data, init_time, plan)
        check_values(ds, f"{self.path} {init_time:%Y-%m-%d}", frozenset(plan.generic))
        return ds


def _is_pl(v: str) -> bool:
    return schema.VARIABLES[v].on_levels


def _describe_param(rows: pd.DataFrame, name: str) -> str:
    """'2d (paramId 168)', or with the postcast name: '2t (paramId 167, t2m)'."""
    r = rows.iloc[0]
    return f"{r.short_name} (paramId {r.param_id}{'' if name == r.short_name else f', {name}'})"


def _match(asked: str, params: pd.DataFrame) -> str | None:
    """The index name of the parameter a user named by any of its names (postcast/cfgrib name, GRIB
    shortName, paramId), or None."""
    key = asked.strip().lower()
    for name, rows in params.groupby("var", sort=False):
        r = rows.iloc[0]
        if key in {str(name).lower(), str(r.short_name).lower(), str(r.param_id), str(r.cf_var).lower()}:
            return str(name)
    return None


def _grib_variables(index: pd.DataFrame, expect: Expectation, source: str
                    ) -> tuple[tuple[str, ...], dict[str, schema.Variable]]:
    """The parameters to take from GRIB files: those asked for (by any name; beyond the schema as generic
    variables described by their GRIB keys) or, by default, every one the schema knows. The others are
    skipped with one INFO line; an asked-for parameter the files lack is :class:`MissingInputError`."""
    params = index.drop_duplicates("var")
    holds = ", ".join(_describe_param(r, str(n)) for n, r in params.groupby("var", sort=False))
    if expect.variables is None:
        taken = tuple(v for v in schema.VARIABLES if v in set(params["var"]))
        if not taken:
            _raise_missing([f"variables (no ENS-10 variable found; the files hold {holds}: pass --variables to "
                            "take them)"], source, "items")
    else:
        found = {v: _match(v, params) for v in expect.variables}
        lacking = [v for v, n in found.items() if n is None]
        if lacking:
            _raise_missing([f"variable {v} (the files hold {holds})" for v in lacking], source, "items")
        taken = tuple(str(n) for n in found.values())
    generic = {n: _generic(index[index["var"] == n], n) for n in taken if n not in schema.VARIABLES}
    skipped = params[~params["var"].isin(taken)]
    if len(skipped):
        log.info("%s: %d parameters not taken: %s (not read; `postcast ingest --variables` takes them)", source,
                 len(skipped), ", ".join(_describe_param(r, str(n)) for n, r in skipped.groupby("var", sort=False)))
    if generic:
        log.info("%s: %s beyond the ENS-10 schema: taken as generic variables from their GRIB keys; their values "
                 "are not checked for plausibility (no known range)", source, ", ".join(generic))
    return taken, generic


def _window(rows: pd.DataFrame) -> str:
    """Over what a time-processed parameter is taken: 'from step 0 to the step', 'the 6 h before the step',
    or the windows' span ('0-744 h .. 744-1416 h')."""
    lengths = set((rows.step_h - rows.start_step).tolist()) - {0} or {0}  # (a step-0 field is an empty window)
    if set(rows.start_step.tolist()) == {0}:
        return "from step 0 to the step"
    if len(lengths) == 1:
        return f"the {lengths.pop()} h before the step"
    first, last = rows.sort_values("step_h").iloc[[0, -1]].itertuples()
    return (f"windows of {min(lengths)}..{max(lengths)} h ({first.start_step}-{first.step_h} h .. "
            f"{last.start_step}-{last.step_h} h)")


def _generic(rows: pd.DataFrame, name: str) -> schema.Variable:
    """A parameter beyond the schema as a variable, from the GRIB keys of its messages."""
    r = rows.iloc[0]
    std = None if r.cf_name in ("", "unknown") else str(r.cf_name)
    return schema.generic_variable(name, str(r.short_name), int(r.param_id), str(r.units), str(r.long_name), std,
                                   str(r.type_of_level), str(r.step_type), _window(rows))


def _check_time_processing(index: pd.DataFrame, variables: tuple[str, ...], source: str) -> None:
    """A schema variable is an instantaneous value (tp, cp: accumulated from step 0): one held as a mean,
    maximum, ... (GRIB2 typeOfStatisticalProcessing, GRIB1 timeRangeIndicator: eccodes' stepType), or
    accumulated over other windows, is refused in one line saying what the file holds. One parameter holds
    one kind of time processing."""
    for name in variables:
        rows = index[index["var"] == name]
        kinds = sorted(set(rows.step_type))
        if len(kinds) > 1:
            msg = (f"{source}: {_describe_param(rows, name)} comes with several kinds of time processing "
                   f"(stepType {', '.join(kinds)}): split the file by stepType (grib_copy -w stepType=instant)")
            raise BadInputError(msg)
        var = schema.VARIABLES.get(name)
        if var is None or not kinds:  # (a variable the files lack is reported as missing)
            continue
        want = "accum" if var.accumulated else "instant"
        if kinds == [want] and (want == "instant" or set(rows.start_step.tolist()) == {0}):
            continue
        method = schema.cell_method(kinds[0]) or "instantaneous"
        starts = rows.init_time.nunique()
        own = ", each with its own steps" if rows.groupby("init_time").step_h.agg(frozenset).nunique() > 1 else ""
        want_text = "accumulated from step 0" if var.accumulated else "an instantaneous value"
        msg = (f"{source}: {_describe_param(rows, name)} holds time-processed fields ({method}, stepType {kinds[0]}, "
               f"{_window(rows)}; {rows.member.nunique()} members, {starts} start{'s' if starts > 1 else ''}{own}); "
               f"postcast's {name} is {want_text}: give {rows.short_name.iloc[0]} as that (time-processed parameters "
               "beyond the schema, e.g. mx2t6, are taken with --variables, labelled with their cell_methods)")
        raise BadInputError(msg)


def _check_same_steps(index: pd.DataFrame, source: str) -> None:
    """Every start holds the same steps, or at least one start holds all the files' steps (then what the
    others lack is reported as missing). Starts each with their own steps (a lagged or seasonal ensemble) are
    refused naming the fix: a store holds one set of steps for every start."""
    per_start = index.groupby("init_time")["step_h"].agg(lambda s: frozenset(s.tolist()))
    union = frozenset().union(*per_start)
    if any(steps == union for steps in per_start):
        return
    common = sorted(frozenset.intersection(*per_start))
    shown = "; ".join(f"{t:%Y-%m-%d %H} UTC: {','.join(map(str, sorted(s)))} h" for t, s in per_start.iloc[:3].items())
    fix = (f"pass --steps {','.join(map(str, common))} (the steps every start has)" if common else
           "no step is common to all starts: ingest each start on its own (e.g. grib_copy -w dataDate=YYYYMMDD)")
    msg = (f"{source}: its {len(per_start)} starts have different steps (a lagged ensemble? {shown}"
           f"{' ...' if len(per_start) > 3 else ''}); a store holds one set of steps for every start: {fix}")
    raise BadInputError(msg)


def _pick_variables(expect: Expectation, have: set[str], source: str) -> tuple[str, ...]:
    """The variables asked for (all must be there) or, by default, every ENS-10 variable the source has."""
    if expect.variables is None:
        if not have:
            _raise_missing(["variables (no ENS-10 variable found)"], source, "items")
        return tuple(v for v in schema.VARIABLES if v in have)
    lacking = [v for v in expect.variables if v not in have]
    if lacking:
        hint = (f"the source has {', '.join(v for v in schema.VARIABLES if v in have) or 'none'}: pass --variables "
                f"{','.join(v for v in schema.VARIABLES if v in have)}")
        _raise_missing([f"variable {v} ({hint})" for v in lacking], source, "items")
    return tuple(expect.variables)


def _target_grid(src: regrid.SourceGrid, expect: Expectation, source: str) -> tuple[schema.Grid,
                                                                                    regrid.SourceGrid | None]:
    """The grid to write (a checkpoint's exact grid, the asked resolution over the source's area, or
    the source's own grid) and the source grid to regrid from (None: no regridding)."""
    if expect.exact_grid is not None:
        grid = expect.exact_grid
        if not src.covers(grid):
            msg = (f"{source}: the input covers {regrid.coverage(src)} only; the model reads "
                   f"{grid.describe()}: give an input that covers it, or train on a store of this area")
            raise BadInputError(msg)
    else:
        try:
            grid = regrid.grid_at(src, expect.grid) if expect.grid is not None else regrid.default_grid(src)
        except ValueError as err:
            msg = f"{source}: {err}; choose another --grid"
            raise BadInputError(msg) from err
    if not src.is_grid(grid):
        log.info("%s: %s is not %s: regridding (%s)", source, src.name, grid.describe(), expect.method)
    return grid, (None if src.is_grid(grid) else src)


def _assemble(data: dict[str, np.ndarray], init_time: pd.Timestamp, plan: Plan) -> xr.Dataset:

    coords = {
        schema.INIT_TIME: [init_time], schema.MEMBER: list(plan.members),
        schema.STEP: pd.to_timedelta(list(plan.steps_h), unit="h"), schema.LEVEL: list(plan.levels),
        schema.LAT: plan.grid.latitudes(), schema.LON: plan.grid.longitudes(),
    }
    out = {}
    for v, arr in data.items():
        var = plan.variable(v)
        out[v] = xr.Variable(var.dims, arr, schema.cf_attrs(var))
    return xr.Dataset(out, coords=coords)


# --- source kinds: one registry, for forecasts and truth alike -----------------------------------
NETCDF_MAGIC = (b"CDF\x01", b"CDF\x02", b"\x89HDF\r\n\x1a\n")  # netCDF classic, 64-bit offset, netCDF-4/HDF5
GRIB_SUFFIXES = (".grib", ".grb", ".grib1", ".grb1", ".grib2", ".grb2")


def _head(p: Path, n: int = 8) -> bytes:
    try:
        with p.open("rb") as f:
            return f.read(n)
    except OSError:
        return b""


def _is_zarr(p: Path) -> bool:
    return p.is_dir() and ((p / "zarr.json").exists() or (p / ".zgroup").exists() or p.suffix == ".zarr")


def _is_netcdf(p: Path) -> bool:
    return p.is_file() and (p.suffix in (".nc", ".nc4") or _head(p).startswith(NETCDF_MAGIC))


def _is_grib(p: Path) -> bool:
    """By name (ENS-10's ``output.pl.2018MMDD``, GRIB suffixes), else by the leading ``GRIB`` of its
    first message; a damaged file with a GRIB name is GRIB (and refused as corrupt when decoded)."""
    if not p.is_file() or p.suffix in (".nc", ".nc4", ".idx", ".json"):
        return False
    named = p.suffix in GRIB_SUFFIXES or p.name.startswith("output.")
    return named or _head(p).startswith(b"GRIB")


# name -> whether a path is a source of that kind (checked in this order: a zarr store is a folder)
SOURCE_KINDS: dict[str, Callable[[Path], bool]] = {"zarr": _is_zarr, "netcdf": _is_netcdf, "grib": _is_grib}
KIND_NAMES = {"zarr": "a zarr store", "netcdf": "netCDF files", "grib": "GRIB files"}


def kind_of(path: str | Path) -> str | None:
    """The source kind of one path (a file or a zarr store), or None."""
    p = Path(path)
    return next((name for name, test in SOURCE_KINDS.items() if test(p)), None)


def find_sources(path: str | Path) -> tuple[str | None, list[Path]]:
    """The sources at ``path``: itself when it is one, else the entries of a folder of the first kind
    (registry order) that it holds, sorted; (None, []) when there are none."""
    p = Path(path)
    kind = kind_of(p)
    if kind is not None:
        return kind, [p]
    entries = sorted(p.iterdir()) if p.is_dir() else []
    for name, test in SOURCE_KINDS.items():
        found = [q for q in entries if not q.name.startswith(".") and test(q)]
        if found:
            return name, found
    return None, []


def truth_paths(truth: str | Path) -> list[Path]:
    """The truth files named by ``--truth`` (a zarr store, a netCDF file, or a folder of either).
    Nothing found, or GRIB, is refused naming what was searched: a store written without truth would
    only fail at training."""
    tp = Path(truth)
    if not tp.exists():
        msg = f"truth {tp}: no such file or directory"
        raise MissingInputError(msg)
    kind, found = find_sources(tp)
    if kind == "grib":
        msg = (f"truth {tp}: GRIB analyses are not read as truth: convert them to netCDF (e.g. eccodes' "
               "grib_to_netcdf) or give a zarr store")
        raise BadInputError(msg)
    if not found:
        msg = (f"truth {tp}: no truth found; searched for {KIND_NAMES['zarr']} and {KIND_NAMES['netcdf']} "
               f"(*.nc or netCDF/HDF5 content){' in this folder' if tp.is_dir() else ''}")
        raise MissingInputError(msg)
    return found


# --- netCDF / zarr via xarray --------------------------------------------------------------------
def _open_one(path: str) -> xr.Dataset:
    """One netCDF file or zarr store, lazily (dask chunks for netCDF, lazily indexed zarr)."""
    try:
        if kind_of(path) == "zarr":
            from postcast.datasets.io import open_zarr

            return open_zarr(path, chunks=None)  # lazily indexed: a date reads only its chunks
        return xr.open_dataset(path, engine="netcdf4", chunks={})
    except (OSError, ValueError, KeyError, TypeError) as err:
        msg = f"{path}: cannot open ({err}); is it a netCDF file or zarr store?"
        raise BadInputError(msg) from err


def open_raw(path: str | Path) -> xr.Dataset:
    """One netCDF file or zarr store as it is (lazily, conventions not normalised): for ``inspect FILE``."""
    return _open_one(str(path))


def combine(parts: list[xr.Dataset], label: str, names: list[str]) -> xr.Dataset:
    """Normalised pieces -> one dataset: pieces holding the same variables (e.g. the ENS-10 files of
    several month-days, each with many years) are joined along init_time and sorted; groups of other
    variables (pl and sfc files) are merged."""
    first = parts[0]
    for ds, name in zip(parts[1:], names[1:], strict=True):
        same = all(ds[c].shape == first[c].shape and np.allclose(ds[c].values, first[c].values)
                   for c in (schema.LAT, schema.LON))
        if not same:
            grids = [regrid.SourceGrid.regular(d[schema.LAT].values, d[schema.LON].values).name
                     if conventions.POINTS not in d[schema.LAT].dims else "a point grid" for d in (first, ds)]
            msg = (f"{label}: {Path(name).name} is on {grids[1]}, {Path(names[0]).name} on {grids[0]}; "
                   "one source holds one grid: ingest them separately")
            raise BadInputError(msg)
    groups: dict[tuple[str, ...], list[xr.Dataset]] = {}
    for ds in parts:
        groups.setdefault(tuple(sorted(str(v) for v in ds.data_vars)), []).append(ds)
    joined = []
    for group in groups.values():
        ds = group[0] if len(group) == 1 else xr.concat(group, dim=schema.INIT_TIME, data_vars="minimal",
                                                       coords="minimal", compat="override", join="outer")
        if schema.INIT_TIME in ds.dims:
            ds = ds.sortby(schema.INIT_TIME)
            dup = ds.indexes[schema.INIT_TIME].duplicated()
            if dup.any():
                msg = (f"{label}: init time {ds[schema.INIT_TIME].values[dup][0]} appears in more than one file; "
                       "remove the duplicate file")
                raise BadInputError(msg)
        joined.append(ds)
    try:
        return xr.merge(joined, compat="override", join="outer", combine_attrs="drop_conflicts")
    except ValueError as err:
        msg = f"{label}: the files do not fit together ({err})"
        raise BadInputError(msg) from err


@functools.lru_cache(maxsize=8)
def _open_normalised(paths: tuple[str, ...]) -> xr.Dataset:
    label = paths[0] if len(paths) == 1 else f"{Path(paths[0]).parent} ({len(paths)} files)"
    parts = [conventions.normalise(_open_one(p), source=p) for p in paths]
    return parts[0] if len(parts) == 1 else combine(parts, label, list(paths))


class XarraySource(ForecastSource):
    """Forecasts in netCDF files or a zarr store, in any convention :mod:`conventions` knows."""

    def __init__(self, paths: list[Path]):
        self.paths = tuple(str(p) for p in sorted(paths))
        self.path = Path(self.paths[0]) if len(self.paths) == 1 else Path(self.paths[0]).parent

    @property
    def dataset(self) -> xr.Dataset:
        return _open_normalised(self.paths)

    def source_grid(self) -> regrid.SourceGrid:
        ds = self.dataset
        lat, lon = ds[schema.LAT].values, ds[schema.LON].values
        if conventions.POINTS in ds[schema.LAT].dims:
            return regrid.SourceGrid.points(lat, lon)
        return regrid.SourceGrid.regular(lat, lon)

    def plan(self, expect: Expectation) -> Plan:
        ds, src = self.dataset, str(self.path)
        variables = _pick_variables(expect, {str(v) for v in ds.data_vars}, src)
        have_levels = [int(x) for x in ds[schema.LEVEL].values] if schema.LEVEL in ds.coords else []
        if not any(_is_pl(v) for v in variables):
            have_levels = []
        levels = expect.pick("levels", expect.levels, have_levels, "hPa", src)
        have_members = [int(m) for m in ds[schema.MEMBER].values] if schema.MEMBER in ds.coords else []
        members = expect.pick_members(have_members, src)
        have_steps = [int(pd.Timedelta(s).total_seconds() // 3600) for s in ds[schema.STEP].values]
        steps = expect.pick("steps", expect.steps_h, have_steps, "h", src)
        grid, source_grid = _target_grid(self.source_grid(), expect, src)
        times = sorted(pd.Timestamp(t) for t in ds[schema.INIT_TIME].values)
        return Plan(times, variables, levels, members, steps, grid, list(self.paths), source_grid, expect.method)

    def load(self, init_time: pd.Timestamp, plan: Plan) -> xr.Dataset:
        ds = self.dataset[list(plan.variables)]
        sel: dict[str, Any] = {schema.INIT_TIME: [init_time], schema.MEMBER: list(plan.members),
                               schema.STEP: pd.to_timedelta(list(plan.steps_h), unit="h")}
        if plan.levels and schema.LEVEL in ds.dims:  # a surface-only selection (T2m) has no level dim
            sel[schema.LEVEL] = list(plan.levels)
        out = ds.sel(sel).load(scheduler="synchronous")  # in this task (no sub-tasks through a cluster)
        out = out.drop_vars([c for c in out.coords if c not in out.dims])
        if plan.source_grid is not None:
            out = _regridded(out, plan)
        out = out.astype(np.float32, copy=False)  # float32 sources as they are (a copy: ~1 s per 0.5 deg date)
        check_values(out, f"{self.path} {init_time:%Y-%m-%d}")
        return out

    def __getstate__(self) -> dict[str, Any]:
        return {"paths": self.paths, "path": self.path}


def _regridded(ds: xr.Dataset, plan: Plan) -> xr.Dataset:
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


# --- truth / oracle ------------------------------------------------------------------------------
class TruthSource:
    """ERA5-like truth (valid-time indexed, e.g. 48 h valid dates only) or paired truth/oracle
    (dims init_time x step). ``load`` returns (init_time=1, step, lat, lon) with NaN where absent."""

    def __init__(self, paths: list[Path], *, oracle: bool = False):
        self.paths = tuple(str(p) for p in sorted(paths))
        self.oracle = oracle

    @property
    def dataset(self) -> xr.Dataset:
        return _open_truth(self.paths, self.oracle)

    @property
    def paired(self) -> bool:
        return schema.STEP in self.dataset.dims

    def variables(self) -> list[str]:
        return sorted(str(v) for v in self.dataset.data_vars)  # zarr lists arrays in no fixed order

    def load(self, init_time: pd.Timestamp, plan: Plan) -> xr.Dataset:
        ds = self.dataset
        steps = pd.to_timedelta(list(plan.steps_h), unit="h")
        # select what exists lazily (reads only the needed chunks), then pad the small result with NaN
        if self.paired:
            out = _select_existing(ds, {schema.INIT_TIME: [init_time], schema.STEP: steps})
        else:
            valid = [init_time + s for s in steps]
            out = _select_existing(ds, {schema.VALID_TIME: valid}).rename({schema.VALID_TIME: schema.STEP})
            out = out.assign_coords({schema.STEP: steps}).expand_dims({schema.INIT_TIME: [init_time]})
        out = out.load(scheduler="synchronous").astype(np.float32, copy=False)
        out = out.drop_vars([c for c in out.coords if c not in out.dims])
        out = self._on_grid(out, plan)
        dims = (schema.INIT_TIME, schema.STEP, schema.LAT, schema.LON)
        return out.transpose(*dims)

    def _on_grid(self, out: xr.Dataset, plan: Plan) -> xr.Dataset:
        """Truth on the store's grid: as is when it is already, else regridded (the forecasts' method)."""
        lat, lon = out[schema.LAT].values, out[schema.LON].values
        if conventions.POINTS in out.dims:
            src = regrid.SourceGrid.points(lat, lon)
        else:
            src = regrid.SourceGrid.regular(lat, lon)
        if src.is_grid(plan.grid):
            return out
        if not src.covers(plan.grid):
            msg = (f"{self.paths[0]}: truth covers {regrid.coverage(src)} only; the store is on "
                   f"{plan.grid.describe()}: give truth that covers it")
            raise BadInputError(msg)
        return _regridded(out, replace(plan, source_grid=src))

    def coverage(self, plan: Plan) -> dict[str, list[str]]:
        """For each variable, the init times (ISO dates) lacking truth at the target step (48 h, or the
        store's longest step when it has no 48 h: :func:`schema.target_step_h`)."""
        ds = self.dataset
        target = pd.Timedelta(hours=schema.target_step_h(plan.steps_h))
        if self.paired:
            have = {pd.Timestamp(t) for t in ds[schema.INIT_TIME].values}
            lacking = [t for t in plan.init_times if t not in have]
        else:
            have = {pd.Timestamp(t) for t in ds[schema.VALID_TIME].values}
            lacking = [t for t in plan.init_times if t + target not in have]
        return {v: [f"{t:%Y-%m-%d}" for t in lacking] for v in self.variables()}


def _select_existing(ds: xr.Dataset, wanted: dict[str, Any]) -> xr.Dataset:
    """``ds.reindex(wanted)`` that touches only the existing labels of a lazily indexed dataset."""
    pos = {d: pd.Index(ds[d].values).get_indexer(pd.Index(v)) for d, v in wanted.items()}
    have = {d: p[p >= 0] for d, p in pos.items()}
    part = ds.isel(have).load(scheduler="synchronous")  # read here, inside a worker's task too
    return part.reindex({d: list(v) for d, v in wanted.items()})


# Truth read in chunks of 24 times (a file stored contiguous would be one chunk): a date's few valid times, and
# the derived truths computed from the hours before them (tp24), read those chunks only, not the whole file.
_TRUTH_CHUNKS = {"time": 24, "valid_time": 24}


@functools.lru_cache(maxsize=8)
def _open_truth(paths: tuple[str, ...], oracle: bool) -> xr.Dataset:
    from postcast.datasets.io import open_zarr

    try:
        if kind_of(paths[0]) == "zarr":
            raw = open_zarr(paths[0], chunks=None)
        else:
            raw = xr.merge([xr.open_dataset(p, engine="netcdf4", chunks=_TRUTH_CHUNKS) for p in paths],
                           compat="override", join="outer")
    except (OSError, ValueError) as err:
        msg = f"{paths[0]}: cannot open truth ({err})"
        raise BadInputError(msg) from err
    if oracle:
        names = [v for v in raw.data_vars if str(v).startswith("oracle_")]
        if not names:
            msg = f"{paths[0]}: no oracle_mean_* / oracle_std_* variables"
            raise BadInputError(msg)
        return conventions.normalise_oracle(raw[names], source=paths[0])
    return conventions.normalise_truth(raw, source=paths[0])


# --- discovery -----------------------------------------------------------------------------------
@dataclass
class Discovered:
    forecast: ForecastSource
    truth: TruthSource | None
    oracle: TruthSource | None


def discover(path: str | Path, *, truth: str | Path | None = None) -> Discovered:
    """Find the forecast, truth and oracle sources under ``path`` (a directory written by
    ``postcast synth``, a directory of ENS-10 GRIB/netCDF files, a zarr store or a single file)."""
    p = Path(path)
    if not p.exists():
        msg = f"{p}: no such file or directory"
        raise MissingInputError(msg)
    forecast: ForecastSource
    found_truth: list[Path] = []
    oracle = None
    if p.is_dir() and kind_of(p) != "zarr":
        gribs = sorted(q for q in p.iterdir() if _is_grib(q))
        ncs = sorted(q for q in p.iterdir() if q.name.startswith("output.") and _is_netcdf(q))
        if (p / "forecast.zarr").exists():
            forecast = XarraySource([p / "forecast.zarr"])
        elif gribs:
            forecast = GribSource(gribs)
        elif ncs:
            forecast = XarraySource(ncs)
        else:
            msg = (f"{p}: no forecasts found; expected GRIB files (ENS-10's output.pl.2018MMDD and "
                   f"output.sfc.2018MMDD, or {', '.join('*' + s for s in GRIB_SUFFIXES)}), output.*.nc files or "
                   "forecast.zarr")
            raise MissingInputError(msg)
        if (p / "era5.zarr").exists():
            found_truth = [p / "era5.zarr"]
        elif (p / "era5").is_dir():
            found_truth = sorted((p / "era5").glob("*.nc"))
        if (p / "oracle.zarr").exists():
            oracle = TruthSource([p / "oracle.zarr"], oracle=True)
    elif kind_of(p) in ("zarr", "netcdf"):
        forecast = XarraySource([p])
    else:
        forecast = GribSource([p])
    if truth is not None:
        found_truth = truth_paths(truth)
    return Discovered(forecast, TruthSource(found_truth) if found_truth else None, oracle)
