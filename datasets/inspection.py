"""``postcast inspect STORE``: dims, variables, dates, splits, completeness and statistics at a glance."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from postcast.datasets import integrity, schema
from postcast.datasets import store as contract


def summary(path: str | os.PathLike[str], *, verify: bool = False) -> dict[str, Any]:
    """A JSON-able description of a training store (complete or interrupted). With ``verify``, every
    chunk is read back and checked (:func:`postcast.datasets.integrity.verify`): ``verify`` holds the
    report, and a store with a missing or damaged chunk is not ``complete``."""
    p = Path(path)
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
        out[str(name)] = {"dims": list(v.dims), "units": v.attrs.get("units", ""),
                          "chunks": list(enc_chunks) if isinstance(enc_chunks, tuple | list) else None}
    return out


def _stats_table(stats: xr.Dataset) -> dict[str, Any]:
    """Global statistics at the 48 h step for each field and level."""
    rows: dict[str, Any] = {"period": [stats.attrs.get("statistics_start"), stats.attrs.get("statistics_end")],
                            "n_init_times": stats.attrs.get("statistics_n_init_times"), "fields": {}}
    step = pd.Timedelta(hours=schema.TARGET_STEP_H)
    for name in stats.data_vars:
        key = str(name)
        if not key.endswith("_mean") or key.endswith("_point_mean"):
            continue
        field = key[: -len("_mean")]
        sel = {schema.STEP: step} if schema.STEP in stats[key].dims else {}
        vals = {k: stats[f"{field}_{k}"].sel(sel).values for k in ("mean", "std", "min", "max")}
        if schema.LEVEL in stats[key].dims:
            for i, lv in enumerate(stats[schema.LEVEL].values):
                rows["fields"][f"{field}@{int(lv)}"] = {k: float(v[i]) for k, v in vals.items()}
        else:
            rows["fields"][field] = {k: float(v) for k, v in vals.items()}
    return rows


def _partial_summary(partial: Path) -> dict[str, Any]:
    plan = json.loads((partial / "plan.json").read_text()) if (partial / "plan.json").exists() else {}
    n_total = len(plan.get("plan", {}).get("init_times", []))
    n_done = len(list((partial / "done").iterdir())) if (partial / "done").exists() else 0
    return {"store": str(partial), "complete": False, "dates_done": n_done, "dates_total": n_total,
            "hint": "interrupted ingest: rerun `postcast ingest` with the same arguments to resume"}


def _verify_lines(rep: dict[str, Any] | None) -> list[str]:
    if rep is None:
        return []
    how = "against the checksums recorded at ingest" if rep["checksums_recorded"] else "decoded (no checksums recorded)"
    if rep["ok"]:
        return [f"verify     ok: {rep['chunks_checked']} chunks read, {how}"]
    lines = [f"verify     FAILED ({how}): {len(rep['missing'])} missing, {len(rep['damaged'])} damaged, "
             f"{len(rep['undecodable'])} undecodable"]
    lines += [f"  {kind:<12}{key}" for kind in ("missing", "damaged", "undecodable") for key in rep[kind]]
    return lines


def render(info: dict[str, Any]) -> str:
    """Human-readable text for ``postcast inspect``."""
    if not info.get("complete") and "dates_done" in info:
        return (f"{info['store']}: INCOMPLETE ({info['dates_done']}/{info['dates_total']} init dates written)\n"
                f"  {info['hint']}")
    lines = [
        f"store      {info['store']}  ({info['size_on_disk_MB']} MB, format v{info['format_version']})",
        f"complete   {'yes' if info['complete'] else 'NO'}",
        f"dims       {', '.join(f'{k}={v}' for k, v in info['dims'].items())}",
        f"grid       {info['grid']}",
        f"init times {info['init_times']['first']} .. {info['init_times']['last']} ({info['init_times']['n']})",
        f"levels     {info['levels_hPa']} hPa;  steps {info['steps_h']} h",
        f"splits     {info['splits']}  years {info['split_years']}",
        f"truth      missing at 48 h: {info['truth_missing_at_48h'] or 'none'}",
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
        lines += ["", f"statistics (train {stats['period'][0]} .. {stats['period'][1]}, "
                      f"{stats['n_init_times']} init times; shown at 48 h)",
                  f"{'field':<22}{'mean':>14}{'std':>14}{'min':>14}{'max':>14}"]
        for name, s in stats["fields"].items():
            lines.append(f"{name:<22}{s['mean']:>14.5g}{s['std']:>14.5g}{s['min']:>14.5g}{s['max']:>14.5g}")
    else:
        lines.append("statistics none (no init date in the training years)")
    return "\n".join(lines)


def _grid(ds: xr.Dataset) -> str:
    """'regular_ll 1 deg lat 30..70 lon 340..400 41x61' (or 'global'), else the bare size."""
    try:
        return schema.Grid.from_coords(ds[schema.LAT].values, ds[schema.LON].values, regional=True).describe()
    except ValueError:
        return f"{ds.sizes[schema.LAT]} x {ds.sizes[schema.LON]}"
