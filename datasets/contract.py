"""The training store's contract: field names, split codes, format version, the ``.partial`` convention
and the one way to open a store.

A postcast store (zarr 3, written by :mod:`postcast.datasets.ingest.run`; layout in docs/store.md) holds

* member fields ``F`` (``z, t, ...``: init_time, member, step[, level], latitude, longitude);
* per-sample ensemble statistics :func:`ens_mean` / :func:`ens_std` of each member field;
* the verifying analysis :func:`truth_name` per target and, for synthetic data, the oracle
  :func:`oracle_mean` / :func:`oracle_std` (init_time, step, latitude, longitude), or for a target of
  another predictive family its parameters :func:`oracle_parameters`;
* the coordinate ``split`` (int8 :data:`SPLIT_CODES` per init time);
* the group :data:`STATISTICS_GROUP` with per-grid-point training statistics
  (:func:`point_mean` / :func:`point_std` of each field);
* the attributes :data:`VERSION_ATTR` (:data:`FORMAT_VERSION`) and :data:`COMPLETE_ATTR`.

A store under construction lives at :func:`partial_path` (``OUT.partial``); only a complete store is
ever renamed to ``OUT``. Every reader opens stores with :func:`open_store`, which checks the format
version and completeness and names the fix.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

from postcast.datasets import io, laws, schema
from postcast.datasets.core.errors import BadInputError, ConfigError, MissingInputError

FORMAT_VERSION = 1
VERSION_ATTR = "postcast_store_version"
COMPLETE_ATTR = "postcast_complete"
STATISTICS_GROUP = "statistics"
SPLIT = "split"  # the per-init-time split coordinate
# Truth chunks (one init date each, every step, the whole grid) that split_rows decodes at once to read their
# first point: zarr decodes a selection's chunks all together, so one read of every date peaked with the dates
# (+215 MB at 64 dates of 0.5 deg, 68 MB at 16).
ROWS_PER_READ = 8
SPLITS = ("train", "val", "test")
SPLIT_CODES: dict[str | None, int] = {None: -1, "train": 0, "val": 1, "test": 2}
SPLIT_FLAG_MEANINGS = "none train val test"


# --- field names ---------------------------------------------------------------------------------
# Each is ``name(variable_or_target) -> str``, e.g. ens_mean("t") == "ens_mean_t".
ens_mean = "ens_mean_{}".format  # per-sample ensemble mean of a member field
ens_std = "ens_std_{}".format  # per-sample ensemble std (population, ddof 0) of a member field


def truth_name(name: str) -> str:
    """The verifying analysis of the target called ``name`` (``Target.name``), e.g. truth_t850."""
    return f"truth_{name}"


def oracle_mean(name: str) -> str:
    """The true predictive mean of the target called ``name`` (synthetic data), e.g. oracle_mean_t850."""
    return f"oracle_mean_{name}"


def oracle_std(name: str) -> str:
    return f"oracle_std_{name}"


def oracle_parameters(target: schema.Target) -> dict[str, str]:
    """The store names of the oracle's parameters of ``target`` (synthetic data), by the parameter names
    of its family: ``oracle_<stem>_T`` with the parameter's oracle stem (:attr:`laws.Parameter.oracle_stem`):
    a Gaussian target's are ``oracle_mean_T`` / ``oracle_std_T``; another family's are its parameters' names
    (``oracle_shape_tp24``), so no reader takes them for a Gaussian's."""
    return {p.name: f"oracle_{p.oracle_stem}_{target.name}" for p in laws.get(target.family).parameters}


point_mean = "{}_point_mean".format  # per-grid-point training mean of a field (statistics group)
point_std = "{}_point_std".format


def split_code(split: str | None) -> int:
    if split not in SPLIT_CODES:
        msg = f"split {split!r}: use one of {list(SPLITS)}"
        raise ConfigError(msg)
    return SPLIT_CODES[split]


# --- the .partial convention -----------------------------------------------------------------------
def partial_path(out: str | os.PathLike[str]) -> Path:
    """Where a store under construction lives until it is complete (``OUT.partial``)."""
    p = Path(out)
    return p.with_name(p.name + ".partial")


def missing_report_path(out: str | os.PathLike[str]) -> Path:
    """The completeness report an ingest that found missing inputs writes (``OUT.missing.json``)."""
    p = Path(out)
    return p.with_name(p.name + ".missing.json")


def attributes(path: str | os.PathLike[str]) -> dict[str, object] | None:
    """The store's root attributes, read from its metadata alone (None: not a zarr 3 group)."""
    meta = Path(path) / "zarr.json"
    if not meta.is_file():
        return None
    try:
        attrs = json.loads(meta.read_text()).get("attributes", {})
    except (OSError, ValueError):
        return None
    return attrs if isinstance(attrs, dict) else None


def is_complete(path: str | os.PathLike[str]) -> bool:
    attrs = attributes(path)
    return bool(attrs and attrs.get(COMPLETE_ATTR))


# --- opening ---------------------------------------------------------------------------------------
def open_store(path: str | os.PathLike[str], *, require_complete: bool = True) -> xr.Dataset:
    """Open a training store (lazy); refuses a missing, foreign, newer-format or incomplete store
    (unless ``require_complete=False``) with an error that names the fix."""
    p = Path(path)
    attrs = attributes(p)
    if attrs is None:
        partial = partial_path(p)
        hint = ""
        if partial.exists():
            hint = f" (an interrupted ingest is in {partial}: rerun `postcast ingest` to finish it)"
        msg = f"{p}: not a postcast store{hint}; build one with `postcast ingest SOURCE --out {p}`"
        raise MissingInputError(msg)
    version = attrs.get(VERSION_ATTR)
    if not isinstance(version, int):
        msg = f"{p}: a zarr store without a postcast format version; build a store with `postcast ingest`"
        raise BadInputError(msg)
    if version > FORMAT_VERSION:
        msg = f"{p}: store format {version} is newer than this postcast reads ({FORMAT_VERSION}); upgrade postcast"
        raise BadInputError(msg)
    if require_complete and not attrs.get(COMPLETE_ATTR):
        msg = f"{p}: the store is incomplete; rerun `postcast ingest` to finish it"
        raise MissingInputError(msg)
    return io.open_zarr(p)


def open_statistics(path: str | os.PathLike[str]) -> xr.Dataset | None:
    """The per-grid-point training statistics, or None when the store has none (no training years)."""
    try:
        return io.open_zarr(path, group=STATISTICS_GROUP)
    except (FileNotFoundError, KeyError, ValueError):
        return None


CLIMATE_QUANTILES = (0.1, 0.5, 0.9)  # default exceedance thresholds of forecasts


def truth_quantiles(
    ds: xr.Dataset, target: schema.Target, step_h: int, quantiles: tuple[float, ...] = CLIMATE_QUANTILES
) -> tuple[float, ...]:
    """Quantiles of the training split's truth of ``target`` at ``step_h``, pooled over dates and grid
    points, in the target's units, to 4 significant digits (a forecast's default exceedance thresholds:
    cold/dry, typical, warm/wet); () when the training split has no truth."""
    rows = split_rows(ds, "train", target=target, step_h=step_h)
    if not rows.size:
        return ()
    da = ds[truth_name(target.name)].isel({schema.STEP: step_position(ds.get_index(schema.STEP), step_h)})
    if schema.LEVEL in da.dims:
        da = da.sel({schema.LEVEL: target.level})
    y = da.isel({schema.INIT_TIME: rows}).values
    return tuple(float(f"{q:.4g}") for q in np.nanquantile(y, quantiles))


MODEL_LEAD = "--data.cfg.sample.step_h"  # the option that sets a model's lead (SampleSpec.step_h)


def step_position(steps: pd.Index, step_h: int, option: str = MODEL_LEAD) -> int:
    """Position of the lead ``step_h`` among a store's ``steps`` (timedeltas); ConfigError naming the
    leads the store holds and ``option`` (the flag that asked for the lead) when it lacks it."""
    want = pd.Timedelta(hours=step_h)
    if want in steps:
        return int(steps.get_loc(want))
    held = sorted(int(pd.Timedelta(s) / pd.Timedelta(hours=1)) for s in steps)
    holds = f"the data holds {', '.join(f'+{h}' for h in held)} h: pass {option} {schema.target_step_h(held)}"
    msg = (
        f"this model predicts +{step_h} h; {holds} to train at that lead, or give data at +{step_h} h"
        if option == MODEL_LEAD
        else f"{option} {step_h}: {holds}"
    )
    raise ConfigError(msg)


def split_rows(
    ds: xr.Dataset, split: str, *, target: schema.Target | None = None, step_h: int = schema.TARGET_STEP_H
) -> np.ndarray:
    """Row indices (along init_time) of ``split``; with ``target``, only rows with its truth at
    ``step_h`` (checked at the first grid point, :data:`ROWS_PER_READ` dates at a time)."""
    rows = np.flatnonzero(ds[SPLIT].values == split_code(split))
    if target is None:
        return rows
    step = step_position(ds.get_index(schema.STEP), step_h)
    point = ds[truth_name(target.name)].isel({schema.STEP: step, schema.LAT: 0, schema.LON: 0})  # (init_time,)
    finite = [
        np.isfinite(point.isel({schema.INIT_TIME: rows[i : i + ROWS_PER_READ]}).values)
        for i in range(0, rows.size, ROWS_PER_READ)
    ]  # ROWS_PER_READ dates' chunks at a time: memory that does not grow with the dates
    return rows[np.concatenate(finite)] if finite else rows
