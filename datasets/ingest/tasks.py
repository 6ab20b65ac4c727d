"""The per-date task of ingest, run on the dask workers: load a few consecutive init dates, check them,
compute their ensemble statistics (and, for training dates, their partial statistics) in one sweep, write
them as whole chunks and leave a done-marker per date (docs/ingest.md, *The engine*)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from postcast.datasets import contract, integrity, io, plausibility, schema, sources, statistics
from postcast.datasets.core import moments
from postcast.datasets.core.cluster import keep_freed_memory
from postcast.datasets.core.errors import BadInputError
from postcast.datasets.ingest import budget as ingest_budget


def ingest_dates(
    forecast: sources.ForecastSource,
    truth: sources.TruthSource | None,
    oracle: sources.TruthSource | None,
    plan: sources.Plan,
    indices: list[int],
    store_path: str,
    done_dir: str,
    train: frozenset[int] = frozenset(),
) -> moments.FieldPartials | None:
    """Load, check and write consecutive init dates ``indices`` one group of forecast variables at a time (the
    truth and oracle with the last), each group with one region write of whole chunks, then mark each date done
    (the marker holds the checksums of the date's chunk files). Returns the merged partial statistics of this
    batch's training dates (in ``train``; None: none of them), computed from the values in hand in the same sweep
    as the ensemble statistics. A group holds about ``budget.TASK_BYTES`` of member data: a 0.5 deg date held
    whole was 0.8 GB of fresh memory per task, whose first touch cost more than its decoding (docs/ingest.md)."""
    keep_freed_memory()
    region = {schema.INIT_TIME: slice(indices[0], indices[-1] + 1)}
    parts: dict[int, moments.FieldPartials] = {i: {} for i in indices if i in train}
    arrays: list[str] = []
    groups = ingest_budget.variable_groups(plan, len(indices))
    for k, group in enumerate(groups):
        last = k == len(groups) - 1  # with the truth and oracle
        loaded = [
            load_date(forecast, truth, oracle, plan, i, partials=i in train, variables=group, extras=last)
            for i in indices
        ]
        days = [day for day, _ in loaded]
        io.write_region(xr.concat(days, dim=schema.INIT_TIME) if len(days) > 1 else days[0], store_path, region)
        arrays += [str(n) for n in days[0].data_vars]
        for i, (_, mine) in zip(indices, loaded, strict=True):
            if mine is not None:
                parts[i] |= mine
        del loaded, days
    merged: moments.FieldPartials | None = None
    for i in indices:
        merged = moments.combine_fields(merged, parts.pop(i, None))
        chunks = integrity.date_chunks(store_path, arrays, i)  # hashed now, while in the page cache
        io.write_json(Path(done_dir) / marker_name(plan.init_times[i]), {"chunks": chunks})
    return merged


def load_date(
    forecast: sources.ForecastSource,
    truth: sources.TruthSource | None,
    oracle: sources.TruthSource | None,
    plan: sources.Plan,
    i: int,
    *,
    partials: bool = False,
    variables: tuple[str, ...] | None = None,
    extras: bool = True,
) -> tuple[xr.Dataset, moments.FieldPartials | None]:
    """One init date as the store holds it (members, their ensemble statistics, truth and oracle) and, with
    ``partials``, the partial statistics of its fields (from the float32 values the store gets). ``variables``:
    only these forecast variables (None: the plan's); ``extras``: with the truth and oracle."""
    t = plan.init_times[i]
    ds = forecast.load(t, plan, variables)
    ens: dict[str, xr.Variable] = {}
    parts: moments.FieldPartials = {}
    for name, x in ds.data_vars.items():
        name = str(name)
        if x.dims[1] != schema.MEMBER or x.dims[-2:] != (schema.LAT, schema.LON):
            msg = f"{name}: dims {x.dims}, expected (init_time, member, ..., latitude, longitude)"
            raise AssertionError(msg)
        # x (1, member, step[, level], lat, lon) -> mean, std (1, step[, level], lat, lon)
        mean, std, p = moments.ensemble_moments(np.asarray(x.values, dtype=np.float32), with_partial=partials)
        dims = tuple(d for d in x.dims if d != schema.MEMBER)
        ens[contract.ens_mean(name)] = xr.Variable(dims, mean)
        ens[contract.ens_std(name)] = xr.Variable(dims, std)
        if p is not None:
            parts |= {
                name: p,
                contract.ens_mean(name): moments.value_partial(mean),
                contract.ens_std(name): moments.value_partial(std),
            }
    pieces = [ds, xr.Dataset(ens)]
    if extras:
        pieces += [extra.load(t, plan) for extra in (truth, oracle) if extra is not None]
    day = xr.merge(pieces, compat="override", join="override")
    _refuse_infinite(day, t, forecast, truth, oracle)
    if partials:
        parts |= statistics.date_partials(day[[n for n in statistics.statistic_fields(day) if n not in parts]])
    return day, parts if partials else None


def _refuse_infinite(
    day: xr.Dataset,
    t: pd.Timestamp,
    forecast: sources.ForecastSource,
    truth: sources.TruthSource | None,
    oracle: sources.TruthSource | None,
) -> None:
    """Every value the store gets is finite or NaN (missing): :class:`BadInputError` naming the file and
    the variable holding an infinity (truth and oracle included; a forecast's are refused earlier, as out
    of their range, unless beyond the schema)."""
    found = plausibility.infinite(day)
    if found is None:
        return
    name, bad = found
    extra = truth if name.startswith("truth_") else oracle if name.startswith("oracle_") else None
    where = extra.paths[0] if extra is not None else str(forecast.path)
    msg = f"{where} {t:%Y-%m-%d}: {bad}: a store holds finite values (NaN where missing): fix them in the file"
    raise BadInputError(msg)


def marker_name(t: Any) -> str:
    """The name of an init date's done-marker (and the date's name in merged.npz)."""
    return f"{pd.Timestamp(t):%Y%m%dT%H}"


def task_keys(n: int) -> list[str]:
    """The dask keys of a run's ``n`` date tasks, in date order, unique to the run (a scheduler may serve several
    runs at once)."""
    run = uuid.uuid4().hex
    return [f"ingest_dates-{run}-{k}" for k in range(n)]


def batches(todo: list[int], size: int) -> list[list[int]]:
    """Split sorted indices into runs of consecutive indices of at most ``size`` (one task each)."""
    out: list[list[int]] = []
    for i in todo:
        if out and out[-1][-1] == i - 1 and len(out[-1]) < size:
            out[-1].append(i)
        else:
            out.append([i])
    return out
