"""``postcast inspect STORE``: dims, variables, dates, splits, completeness and statistics at a glance;
``postcast inspect FILE`` (a raw GRIB or netCDF file): the parameters, levels, members, steps, step types
and grid it holds, and which of them the ENS-10 schema knows."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from postcast.datasets import contract, integrity, schema, sources
from postcast.datasets.sources import messages as grib


def summary(path: str | os.PathLike[str], *, verify: bool = False) -> dict[str, Any]:
    """A JSON-able description of a training store (complete or interrupted). With ``verify``, every
    chunk is read back and checked (:func:`postcast.datasets.integrity.verify`): ``verify`` holds the
    report, and a store with a missing or damaged chunk is not ``complete``."""
    p = Path(path)
    if p.is_file() and sources.kind_of(p) in ("grib", "netcdf"):
        return file_summary(p)
    partial = contract.partial_path(p)
    if contract.attributes(p) is None and (partial / "store.zarr").exists():
        return _partial_summary(partial)
    ds = contract.open_store(p, require_complete=False)
    times = pd.DatetimeIndex(ds[schema.INIT_TIME].values)
    codes = ds[contract.SPLIT].values if contract.SPLIT in ds.coords else np.full(len(times), -9)
    out: dict[str, Any] = {
        "store": str(p),
        "complete": bool(ds.attrs.get(contract.COMPLETE_ATTR)),
        "format_version": ds.attrs.get(contract.VERSION_ATTR),
        "dims": {str(k): int(v) for k, v in ds.sizes.items()},
        "grid": _grid(ds),
        "init_times": {"first": f"{times.min():%Y-%m-%d}", "last": f"{times.max():%Y-%m-%d}", "n": len(times)},
        "levels_hPa": [int(x) for x in ds[schema.LEVEL].values],
        "steps_h": [int(pd.Timedelta(s).total_seconds() // 3600) for s in ds[schema.STEP].values],
        "splits": {s: int((codes == c).sum()) for s, c in (("train", 0), ("val", 1), ("test", 2), ("none", -1))},
        "split_years": ds.attrs.get("splits"),
        "variables": _variables(ds),
        "truth_missing_at_48h": {k: len(v) for k, v in ds.attrs.get("truth_missing_at_48h", {}).items()},
        "sources": ds.attrs.get("sources", {}),
        "code_version": ds.attrs.get("code_version"),
        "created": ds.attrs.get("created"),
        "size_on_disk_MB": round(sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) / 2**20, 1),
    }
    stats = contract.open_statistics(p)
    out["statistics"] = _stats_table(stats) if stats is not None else "missing"
    if verify:
        report = integrity.verify(p)
        out["verify"] = {**report.to_dict(), "problem": report.problem()}
        out["complete"] = out["complete"] and report.ok
    return out


def _variables(ds: xr.Dataset) -> dict[str, dict[str, Any]]:
    out = {}
    for name, v in ds.data_vars.items():
        enc_chunks = v.encoding.get("chunks") or v.encoding.get("preferred_chunks")
        out[str(name)] = {
            "dims": list(v.dims),
            "units": v.attrs.get("units", ""),
            "chunks": list(enc_chunks) if isinstance(enc_chunks, tuple | list) else None,
        }
    return out


def _shown_step(stats: xr.Dataset) -> pd.Timedelta | None:
    """The step the statistics are shown at: the 48 h target lead when the store has it, else its longest
    (a +78 h store); None when the statistics have no step."""
    if schema.STEP not in stats.coords:
        return None
    hours = [int(pd.Timedelta(s).total_seconds() // 3600) for s in stats[schema.STEP].values]
    return pd.Timedelta(hours=schema.target_step_h(hours))


def _number(v: Any) -> float | None:
    """A statistic as JSON holds it: a finite float, else None (JSON has no NaN or Infinity)."""
    x = float(v)
    return x if np.isfinite(x) else None


def _stats_table(stats: xr.Dataset) -> dict[str, Any]:
    """Global statistics at one step (:func:`_shown_step`) for each field and level; a non-finite one as
    None, so ``inspect --json`` is always valid JSON."""
    step = _shown_step(stats)
    rows: dict[str, Any] = {
        "period": [stats.attrs.get("statistics_start"), stats.attrs.get("statistics_end")],
        "n_init_times": stats.attrs.get("statistics_n_init_times"),
        "fields": {},
        "step_h": None if step is None else int(step.total_seconds() // 3600),
    }
    for name in stats.data_vars:
        key = str(name)
        if not key.endswith("_mean") or key.endswith("_point_mean"):
            continue
        field = key[: -len("_mean")]
        sel = {schema.STEP: step} if schema.STEP in stats[key].dims else {}
        vals = {k: stats[f"{field}_{k}"].sel(sel).values for k in ("mean", "std", "min", "max")}
        if schema.LEVEL in stats[key].dims:
            for i, lv in enumerate(stats[schema.LEVEL].values):
                rows["fields"][f"{field}@{int(lv)}"] = {k: _number(v[i]) for k, v in vals.items()}
        else:
            rows["fields"][field] = {k: _number(v) for k, v in vals.items()}
    return rows


def _partial_summary(partial: Path) -> dict[str, Any]:
    plan = json.loads((partial / "plan.json").read_text()) if (partial / "plan.json").exists() else {}
    n_total = len(plan.get("plan", {}).get("init_times", []))
    n_done = len(list((partial / "done").iterdir())) if (partial / "done").exists() else 0
    return {
        "store": str(partial),
        "complete": False,
        "dates_done": n_done,
        "dates_total": n_total,
        "hint": "interrupted ingest: rerun `postcast ingest` with the same arguments to resume",
    }


def _verify_lines(rep: dict[str, Any] | None) -> list[str]:
    if rep is None:
        return []
    how = "against the checksums recorded at ingest" if rep["checksums_recorded"] else "decoded (no checksums recorded)"
    if rep["ok"]:
        return [f"verify     ok: {rep['chunks_checked']} chunks read, {how}"]
    lines = [
        f"verify     FAILED ({how}): {len(rep['missing'])} missing, {len(rep['damaged'])} damaged, "
        f"{len(rep['undecodable'])} undecodable chunks, {len(rep.get('infinite', {}))} arrays with infinite values"
    ]
    lines += [f"  {kind:<12}{key}" for kind in ("missing", "damaged", "undecodable") for key in rep[kind]]
    lines += [f"  {'infinite':<12}{name}: {n} values" for name, n in rep.get("infinite", {}).items()]
    return lines


def render(info: dict[str, Any]) -> str:
    """Human-readable text for ``postcast inspect``."""
    if "kind" in info:
        return render_file(info)
    if not info.get("complete") and "dates_done" in info:
        return (
            f"{info['store']}: INCOMPLETE ({info['dates_done']}/{info['dates_total']} init dates written)\n"
            f"  {info['hint']}"
        )
    lines = [
        f"store      {info['store']}  ({info['size_on_disk_MB']} MB, format v{info['format_version']})",
        f"complete   {'yes' if info['complete'] else 'NO'}",
        f"dims       {', '.join(f'{k}={v}' for k, v in info['dims'].items())}",
        f"grid       {info['grid']}",
        f"init times {info['init_times']['first']} .. {info['init_times']['last']} ({info['init_times']['n']})",
        f"levels     {info['levels_hPa']} hPa;  steps {info['steps_h']} h",
        f"splits     {info['splits']}  years {info['split_years']}",
        f"truth      missing at {schema.target_step_h(info['steps_h'])} h: {info['truth_missing_at_48h'] or 'none'}",
        f"code       {info['code_version']}  created {info['created']}",
        f"sources    {len(info['sources'])} files",
        *_verify_lines(info.get("verify")),
        "",
        f"{'variable':<18}{'units':<14}{'dims':<52}chunks",
    ]
    for name, v in info["variables"].items():
        lines.append(f"{name:<18}{v['units']:<14}{','.join(v['dims']):<52}{v['chunks']}")
    stats = info.get("statistics")
    if isinstance(stats, dict):
        lines += [
            "",
            f"statistics (train {stats['period'][0]} .. {stats['period'][1]}, "
            f"{stats['n_init_times']} init times; shown at {stats['step_h']} h)",
            f"{'field':<22}{'mean':>14}{'std':>14}{'min':>14}{'max':>14}",
        ]
        for name, s in stats["fields"].items():
            shown = "".join(f"{'-' if s[k] is None else f'{s[k]:.5g}':>14}" for k in ("mean", "std", "min", "max"))
            lines.append(f"{name:<22}{shown}")
    else:
        lines.append("statistics none (no init date in the training years)")
    return "\n".join(lines)


def _grid(ds: xr.Dataset) -> str:
    """'regular_ll 1 deg lat 30..70 lon 340..400 41x61' (or 'global'), else the bare size."""
    try:
        return schema.Grid.from_coords(ds[schema.LAT].values, ds[schema.LON].values, regional=True).describe()
    except ValueError:
        return f"{ds.sizes[schema.LAT]} x {ds.sizes[schema.LON]}"


# --- raw files -----------------------------------------------------------------------------------
def _hours(values: Any) -> list[int]:
    return sorted({int(pd.Timedelta(v).total_seconds() // 3600) for v in np.atleast_1d(values)})


def file_summary(path: Path) -> dict[str, Any]:
    """What a raw GRIB or netCDF file holds, JSON-able (``kind`` says which)."""
    if sources.kind_of(path) == "grib":
        return _grib_summary(path)
    return _netcdf_summary(path)


def _grib_summary(path: Path) -> dict[str, Any]:
    """From the headers only (:func:`grib.index_file`): one entry per parameter, the starts, members, steps
    and grids of the whole file."""
    idx = grib.index_file(path)
    params = []
    for name, rows in idx.groupby("var", sort=False):
        r = rows.iloc[0]
        params.append(
            {
                "short_name": r.short_name,
                "param_id": int(r.param_id),
                "postcast": name if name in schema.VARIABLES else "not in schema",
                "name": r.long_name,
                "units": r.units,
                "type_of_level": r.type_of_level,
                "levels": sorted(int(x) for x in set(rows.level)),
                "step_type": r.step_type,
                "steps_h": sorted(int(x) for x in set(rows.step_h)),
                "members": int(rows.member.nunique()),
                "messages": len(rows),
            }
        )
    keys = ["grid_type", "ni", "nj", "n_values", "lat_first", "lat_last", "lon_first", "lon_last"]
    grids = [grib.grid_of(g, path).name for _, g in idx.groupby(keys)]
    return {
        "file": str(path),
        "kind": "grib",
        "messages": len(idx),
        "parameters": params,
        "starts": [f"{pd.Timestamp(t):%Y-%m-%d %H}" for t in sorted(idx.init_time.unique())],
        "members": sorted(int(m) for m in set(idx.member)),
        "data_types": sorted(set(idx.data_type)),
        "steps_h": sorted(int(x) for x in set(idx.step_h)),
        "grids": grids,
    }


def _netcdf_summary(path: Path) -> dict[str, Any]:
    """From the file's variables and their attributes (cfgrib's GRIB_* where present). The variables are
    read as they are stored (``ds.variables``): ``ds[name]`` builds a DataArray by scanning every variable
    of the file for its coordinates, quadratic in their number (20 000 variables: minutes)."""
    ds = sources.open_raw(path)
    params = []
    for name, da in ds.variables.items():
        if name in ds.coords:
            continue
        known = schema.resolve(str(name)) or schema.resolve(str(da.attrs.get("GRIB_paramId", "")))
        params.append(
            {
                "name": str(name),
                "short_name": da.attrs.get("GRIB_shortName", ""),
                "param_id": da.attrs.get("GRIB_paramId", ""),
                "postcast": known or "not in schema",
                "units": da.attrs.get("units", ""),
                "dims": {str(d): int(n) for d, n in da.sizes.items()},
                "step_type": da.attrs.get("GRIB_stepType", da.attrs.get("cell_methods", "instant")),
            }
        )
    coords = {str(c): _coord_text(ds[c]) for c in ds.coords if ds[c].ndim <= 1}
    return {
        "file": str(path),
        "kind": "netcdf",
        "parameters": params,
        "coords": coords,
        "dims": {str(k): int(v) for k, v in ds.sizes.items()},
    }


def _coord_text(c: xr.DataArray) -> str:
    values = np.atleast_1d(c.values)
    if np.issubdtype(values.dtype, np.timedelta64):
        text = [f"{h} h" for h in _hours(values)]
    elif np.issubdtype(values.dtype, np.datetime64):
        text = [f"{pd.Timestamp(v):%Y-%m-%d %H}" for v in values]
    else:
        text = [f"{v:g}" if isinstance(v, float | np.floating) else str(v) for v in values]
    return ", ".join(text) if len(text) <= 6 else f"{text[0]} .. {text[-1]} ({len(text)})"


def _span(values: list[int]) -> str:
    """'0-50 (51)' for consecutive numbers, else the list (long lists shortened)."""
    if len(values) > 2 and values == list(range(values[0], values[-1] + 1)):
        return f"{values[0]}-{values[-1]} ({len(values)})"
    return ",".join(map(str, values)) if len(values) <= 12 else f"{values[0]} .. {values[-1]} ({len(values)})"


def render_file(info: dict[str, Any]) -> str:
    """Human-readable text for ``postcast inspect FILE``."""
    if info["kind"] == "netcdf":
        lines = [
            f"file       {info['file']}  (netCDF)",
            f"dims       {', '.join(f'{k}={v}' for k, v in info['dims'].items())}",
            *(f"{'coord':<11}{k}: {v}" for k, v in info["coords"].items()),
            "",
            f"{'variable':<14}{'shortName':<11}{'paramId':<9}{'postcast':<15}{'step type':<11}{'units':<12}dims",
        ]
        lines += [
            f"{p['name']:<14}{p['short_name']:<11}{p['param_id']!s:<9}{p['postcast']:<15}{p['step_type']:<11}"
            f"{p['units']:<12}{','.join(p['dims'])}"
            for p in info["parameters"]
        ]
        return "\n".join(lines)
    lines = [
        f"file       {info['file']}  (GRIB, {info['messages']} messages, dataType {','.join(info['data_types'])})",
        f"grid       {'; '.join(info['grids'])}",
        f"starts     {', '.join(info['starts'][:4])}"
        f"{' ...' if len(info['starts']) > 4 else ''} ({len(info['starts'])})",
        f"members    {_span(info['members'])}",
        f"steps      {_span(info['steps_h'])} h",
        "",
        f"{'shortName':<11}{'paramId':<9}{'postcast':<15}{'level type':<19}{'levels':<14}{'step type':<11}"
        f"{'steps h':<18}{'members':<9}name",
    ]
    for p in info["parameters"]:
        levels = _span(p["levels"]) if p["type_of_level"] == schema.LevelType.PRESSURE else "-"
        lines.append(
            f"{p['short_name']:<11}{p['param_id']:<9}{p['postcast']:<15}{p['type_of_level']:<19}{levels:<14}"
            f"{p['step_type']:<11}{_span(p['steps_h']):<18}{p['members']:<9}{p['name']} ({p['units']})"
        )
    return "\n".join(lines)
