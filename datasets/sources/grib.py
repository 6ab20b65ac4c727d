"""GRIB forecasts (ECMWF conventions, ENS-10's files and any GRIB1/GRIB2 ensemble) as a :class:`ForecastSource`;
the messages are decoded by :mod:`postcast.datasets.sources.messages`."""

from __future__ import annotations

import itertools
import logging
import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from postcast.datasets import schema
from postcast.datasets.core.errors import BadInputError
from postcast.datasets.sources import base, conventions, regrid
from postcast.datasets.sources import messages as grib
from postcast.datasets.sources.base import (
    Expectation,
    ForecastSource,
    Plan,
    cell_method,
    generic_variable,
    raise_missing,
    target_grid,
)

log = logging.getLogger(__name__)


class GribSource(ForecastSource):
    """ENS-10 GRIB1 files (``output.pl.2018MMDD``, ``output.sfc.2018MMDD`` or any GRIB files)."""

    def __init__(self, files: list[Path], index: pd.DataFrame | None = None):
        self.files = sorted(files)
        self.path = self.files[0] if len(self.files) == 1 else self.files[0].parent  # names the input in messages
        self._index = index
        self._dates: dict[pd.Timestamp, pd.DataFrame] | None = None  # built where dates are loaded (a worker)

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
        self._dates = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_dates": None}  # the index travels once, not twice

    def _date_rows(self, init_time: pd.Timestamp) -> pd.DataFrame:
        """The messages of one init date, indexed by (var, level, member, step_h): the index split by date once
        per source, not filtered again for each variable an ingest task loads."""
        if self._dates is None:
            key = ["var", "level", "member", "step_h"]
            self._dates = {pd.Timestamp(t): g.set_index(key).sort_index() for t, g in self.index.groupby("init_time")}
        return self._dates[pd.Timestamp(init_time)]

    def plan(self, expect: Expectation) -> Plan:
        src = self.path
        ens10 = self._ens10_named()
        if ens10:
            expect = replace(
                expect, variables=expect.variables or tuple(schema.VARIABLES), steps_h=expect.steps_h or schema.STEPS_H
            )
            self._only_schema(expect.variables or ())
        # ENS-10 files: what is lost is listed per message below, with the file it belongs in
        variables, generic = (
            (expect.variables, {}) if ens10 and expect.variables else _grib_variables(self.index, expect, str(src))
        )
        idx = self.index[self.index["var"].isin(variables)]
        _check_time_processing(idx, variables, str(src))
        _conversions(idx, str(src))  # units the table cannot convert: refused now, not in a worker
        if expect.steps_h is None:
            _check_same_steps(idx, str(src))
        grids = {f: grib.grid_of(g, f) for f, g in (idx if len(idx) else self.index).groupby("file")}
        _check_one_grid(grids, str(self.path))
        _check_no_duplicates(idx)
        on_levels = [v for v in variables if (generic[v] if v in generic else schema.VARIABLES[v]).on_levels]
        pl_rows = idx[idx["var"].isin(on_levels)]
        levels = expect.pick("levels", expect.levels, sorted(int(x) for x in set(pl_rows.level)), "hPa", str(src))
        members = expect.pick_members(sorted(int(m) for m in set(idx.member)), str(src))
        steps = expect.pick("steps", expect.steps_h, sorted(int(x) for x in set(idx.step_h)), "h", str(src))
        grid, source_grid = target_grid(next(iter(grids.values())), expect, str(src))
        plan = Plan(
            sorted(pd.Timestamp(t) for t in idx.init_time.unique()),
            variables,
            levels,
            members,
            steps,
            grid,
            [str(f) for f in self.files],
            source_grid,
            expect.method,
            generic,
        )
        self._check_complete(plan, idx, ens10)
        return plan

    def _check_complete(self, plan: Plan, idx: pd.DataFrame, ens10: bool) -> None:
        """MissingInputError listing every message of ``plan`` the index ``idx`` lacks, each with the file it
        belongs in (an ENS-10 file's name), else the file read."""
        src = self.path
        present = set(zip(idx["init_time"], idx["var"], idx["level"], idx["member"], idx["step_h"], strict=True))
        file_of = dict(zip(zip(idx["init_time"], idx["var"], strict=True), idx["file"], strict=True))

        def where(t: pd.Timestamp, v: str, lv: int) -> str:  # the ENS-10 file it belongs in, else the one read
            return (
                grib.file_name("pl" if lv else "sfc", t.month, t.day)
                if ens10
                else Path(file_of.get((t, v), str(src))).name
            )

        lost = [
            (t, v, lv, m, s)
            for t in plan.init_times
            for v, lv in self._fields(plan)
            for m, s in itertools.product(plan.members, plan.steps_h)
            if (t, v, lv, m, s) not in present
        ]
        missing = [
            f"{t:%Y-%m-%d} {v}{'' if lv == 0 else f' {lv} hPa'} member {m} step {s} h ({where(t, v, lv)})"
            for t, v, lv, m, s in lost
        ]
        raise_missing(missing, str(self.path), fix=_steps_fix(plan.steps_h, {s for *_, s in lost}))

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
            raise_missing(
                [f"variable {v} (ENS-10 files hold {', '.join(schema.VARIABLES)} only)" for v in beyond],
                str(self.path),
                "items",
            )
        idx = self.index
        bad = idx[~idx["var"].isin(list(schema.VARIABLES))]
        if len(bad):
            r = bad.iloc[0]
            i = int((idx.loc[: bad.index[0], "file"] == r.file).sum()) - 1
            msg = (
                f"{r.file}: message {i} holds {r.short_name!r} (paramId {r.param_id}), not an ENS-10 variable "
                "(ENS-10 files hold its 18 variables only: a damaged message? re-fetch the file)"
            )
            raise BadInputError(msg)

    @staticmethod
    def _fields(plan: Plan) -> list[tuple[str, int]]:
        out = []
        for v in plan.variables:
            out += [(v, lv) for lv in plan.levels] if plan.variable(v).on_levels else [(v, 0)]
        return out

    def load(self, init_time: pd.Timestamp, plan: Plan, variables: Sequence[str] | None = None) -> xr.Dataset:
        rows = self._date_rows(init_time)
        shape = plan.source_grid.shape if plan.source_grid is not None else plan.grid.shape
        data = {}
        for v in plan.variables if variables is None else variables:
            pl = plan.variable(v).on_levels
            levels = plan.levels if pl else (0,)
            # the fields in the store's order, (member, step, level): decoded where they belong, so the array is
            # the store's layout as it is (a strided view was copied again by every write: 406 MB a 0.5 deg date)
            keys = [(v, lv, m, h) for m, h, lv in itertools.product(plan.members, plan.steps_h, levels)]
            sel = rows.loc[keys]
            flat = np.empty((len(keys), *shape), dtype=np.float32)  # (fields, *source grid)
            files, offsets = sel.file.to_numpy(), sel.offset.to_numpy()
            for f in pd.unique(files):
                at = np.flatnonzero(files == f)
                at = at[np.argsort(offsets[at], kind="stable")]  # the file read front to back
                msgs = zip(offsets[at].tolist(), sel.length.to_numpy()[at].tolist(), strict=True)
                grib.decode_into(str(f), msgs, flat, at.tolist())
            _to_canonical(flat, sel, str(self.path))
            if plan.source_grid is not None:  # (fields, *source) -> (fields, lat, lon)
                flat = regrid.to_grid(flat, plan.source_grid, plan.grid, plan.method)
            arr = flat.reshape(1, len(plan.members), len(plan.steps_h), len(levels), *plan.grid.shape)
            data[v] = arr if pl else arr[:, :, :, 0]  # (1, member, step[, level], lat, lon)
        ds = _assemble(data, init_time, plan)
        base.check_values(ds, f"{self.path} {init_time:%Y-%m-%d}", frozenset(plan.generic))
        return ds


def _conversions(rows: pd.DataFrame, source: str) -> tuple[np.ndarray, np.ndarray]:
    """Per message (row), the scale and offset taking its values from the units its own message states
    (eccodes' ``units`` key: TIGGE's tp, paramId 228228, is in kg m**-2, ECMWF's 228 in m) to the store's units
    of its variable (:func:`conventions.conversion`, the one table); a parameter beyond the schema keeps its
    own units (1, 0)."""
    scale, offset = np.ones(len(rows)), np.zeros(len(rows))
    for (name, units), at in rows.groupby(["var", "units"], sort=False).indices.items():
        var = schema.VARIABLES.get(str(name))
        if var is not None:
            scale[at], offset[at] = conventions.conversion(str(units) or None, var, source)
    return scale, offset


def _to_canonical(flat: np.ndarray, rows: pd.DataFrame, source: str) -> None:
    """``flat`` (fields, *grid) decoded from the messages ``rows``, in place into the store's units."""
    scale, offset = _conversions(rows, source)
    if (scale != 1.0).any() or (offset != 0.0).any():
        shape = (-1,) + (1,) * (flat.ndim - 1)
        flat *= scale.astype(np.float32).reshape(shape)
        flat += offset.astype(np.float32).reshape(shape)


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


def _grib_variables(
    index: pd.DataFrame, expect: Expectation, source: str
) -> tuple[tuple[str, ...], dict[str, schema.Variable]]:
    """The parameters to take from GRIB files: those asked for (by any name; beyond the schema as generic
    variables described by their GRIB keys) or, by default, every one the schema knows. The others are
    skipped with one INFO line; an asked-for parameter the files lack is :class:`MissingInputError`."""
    params = index.drop_duplicates("var")
    holds = ", ".join(_describe_param(r, str(n)) for n, r in params.groupby("var", sort=False))
    if expect.variables is None:
        taken = tuple(v for v in schema.VARIABLES if v in set(params["var"]))
        if not taken:
            names = ",".join(str(n) for n in params["var"])
            none = f"no ENS-10 variable found; the files hold {holds}"
            raise_missing(
                [f"variables ({none}: pass --variables {names} to take them)"],
                source,
                "items",
            )
    else:
        found = {v: _match(v, params) for v in expect.variables}
        lacking = [v for v, n in found.items() if n is None]
        if lacking:
            raise_missing([f"variable {v} (the files hold {holds})" for v in lacking], source, "items")
        taken = tuple(str(n) for n in found.values())
    generic = {n: _generic(index[index["var"] == n], n) for n in taken if n not in schema.VARIABLES}
    skipped = params[~params["var"].isin(taken)]
    if len(skipped):
        log.info(
            "%s: %d parameters not taken: %s (not read; `postcast ingest --variables` takes them)",
            source,
            len(skipped),
            ", ".join(_describe_param(r, str(n)) for n, r in skipped.groupby("var", sort=False)),
        )
    if generic:
        log.info(
            "%s: %s beyond the ENS-10 schema: taken as generic variables from their GRIB keys; their values "
            "are not checked for plausibility (no known range)",
            source,
            ", ".join(generic),
        )
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
    return (
        f"windows of {min(lengths)}..{max(lengths)} h ({first.start_step}-{first.step_h} h .. "
        f"{last.start_step}-{last.step_h} h)"
    )


def _generic(rows: pd.DataFrame, name: str) -> schema.Variable:
    """A parameter beyond the schema as a variable, from the GRIB keys of its messages."""
    r = rows.iloc[0]
    std = None if r.cf_name in ("", "unknown") else str(r.cf_name)
    return generic_variable(
        name,
        str(r.short_name),
        int(r.param_id),
        str(r.units),
        str(r.long_name),
        std,
        str(r.type_of_level),
        str(r.step_type),
        _window(rows),
    )


def _check_one_grid(grids: dict[str, regrid.SourceGrid], path: str) -> None:
    """BadInputError when the files (``grids``: each file's grid) are on different grids."""
    if len({g.name for g in grids.values()}) > 1:
        detail = ", ".join(f"{Path(f).name}: {g.name}" for f, g in grids.items())
        msg = f"{path}: files on different grids ({detail}); ingest them separately"
        raise BadInputError(msg)


def _check_no_duplicates(idx: pd.DataFrame) -> None:
    """BadInputError naming the first of the messages of the index ``idx`` that say the same field twice."""
    dup = idx.duplicated(["var", "level", "member", "init_time", "step_h"])
    if dup.any():
        r = idx[dup].iloc[0]
        msg = (
            f"{r.file}: {int(dup.sum())} duplicate messages, e.g. {r['var']} level {r.level} member "
            f"{r.member} {r.init_time:%Y-%m-%d} step {r.step_h} h"
        )
        raise BadInputError(msg)


def _check_time_processing(index: pd.DataFrame, variables: tuple[str, ...], source: str) -> None:
    """A schema variable is an instantaneous value (tp, cp: accumulated from step 0): one held as a mean,
    maximum, ... (GRIB2 typeOfStatisticalProcessing, GRIB1 timeRangeIndicator: eccodes' stepType), or
    accumulated over other windows, is refused in one line saying what the file holds. One parameter holds
    one kind of time processing."""
    for name in variables:
        rows = index[index["var"] == name]
        kinds = sorted(set(rows.step_type))
        if len(kinds) > 1:
            msg = (
                f"{source}: {_describe_param(rows, name)} comes with several kinds of time processing "
                f"(stepType {', '.join(kinds)}): split the file by stepType (grib_copy -w stepType=instant)"
            )
            raise BadInputError(msg)
        var = schema.VARIABLES.get(name)
        if var is None or not kinds:  # (a variable the files lack is reported as missing)
            continue
        want = "accum" if var.accumulated else "instant"
        if kinds == [want] and (want == "instant" or set(rows.start_step.tolist()) == {0}):
            continue
        method = cell_method(kinds[0]) or "instantaneous"
        starts = rows.init_time.nunique()
        own = ", each with its own steps" if rows.groupby("init_time").step_h.agg(frozenset).nunique() > 1 else ""
        want_text = "accumulated from step 0" if var.accumulated else "an instantaneous value"
        msg = (
            f"{source}: {_describe_param(rows, name)} holds time-processed fields ({method}, stepType {kinds[0]}, "
            f"{_window(rows)}; {rows.member.nunique()} members, {starts} start{'s' if starts > 1 else ''}{own}); "
            f"postcast's {name} is {want_text}: give {rows.short_name.iloc[0]} as that (time-processed parameters "
            "beyond the schema, e.g. mx2t6, are taken with --variables, labelled with their cell_methods)"
        )
        raise BadInputError(msg)


def _steps_fix(steps: tuple[int, ...], lacking: set[int]) -> str | None:
    """The fix when only some steps lack fields (e.g. an accumulation or a step-0 field a centre does not
    send): ingest the steps every field has, naming them; None when every step lacks some."""
    whole = [s for s in steps if s not in lacking]
    if not lacking or not whole:
        return None
    return f"pass --steps {','.join(map(str, whole))} to ingest the steps every field has"


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
    fix = (
        f"pass --steps {','.join(map(str, common))} (the steps every start has)"
        if common
        else "no step is common to all starts: ingest each start on its own (e.g. grib_copy -w dataDate=YYYYMMDD)"
    )
    msg = (
        f"{source}: its {len(per_start)} starts have different steps (a lagged ensemble? {shown}"
        f"{' ...' if len(per_start) > 3 else ''}); a store holds one set of steps for every start: {fix}"
    )
    raise BadInputError(msg)


def _assemble(data: dict[str, np.ndarray], init_time: pd.Timestamp, plan: Plan) -> xr.Dataset:

    coords = {
        schema.INIT_TIME: [init_time],
        schema.MEMBER: list(plan.members),
        schema.STEP: pd.to_timedelta(list(plan.steps_h), unit="h"),
        schema.LEVEL: list(plan.levels),
        schema.LAT: plan.grid.latitudes(),
        schema.LON: plan.grid.longitudes(),
    }
    out = {}
    for v, arr in data.items():
        var = plan.variable(v)
        out[v] = xr.Variable(var.dims, arr, schema.cf_attrs(var))
    return xr.Dataset(out, coords=coords)
