"""The per-date task of ingest, run on the dask workers: load a few consecutive init dates, check them,
compute their ensemble statistics (and, for training dates, their partial statistics) in one sweep, write
them as whole chunks and leave a done-marker per date (docs/ingest.md, *The engine*)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from postcast.datasets import integrity, io, schema, sources, statistics
from postcast.datasets import store as contract
from postcast.datasets.cluster import keep_freed_memory


def ingest_dates(forecast: sources.ForecastSource, truth: sources.TruthSource | None,
                 oracle: sources.TruthSource | None, plan: sources.Plan, indices: list[int], store: str,
                 done_dir: str, train: frozenset[int] = frozenset()) -> statistics.FieldPartials | None:
    """Load, check and write consecutive init dates ``indices`` with one region write (whole chunks), then
    mark each done (the marker holds the checksums of the date's chunk files). Returns the merged partial
    statistics of this batch's training dates (in ``train``; None: none of them), computed from the values
    in hand in the same sweep as the ensemble statistics."""
    keep_freed_memory()
    loaded = [load_date(forecast, truth, oracle, plan, i, partials=i in train) for i in indices]
    parts = [day for day, _ in loaded]
    full = xr.concat(parts, dim=schema.INIT_TIME) if len(parts) > 1 else parts[0]
    io.write_region(full, store, {schema.INIT_TIME: slice(indices[0], indices[-1] + 1)})
    merged: statistics.FieldPartials | None = None
    arrays = [str(n) for n in full.data_vars]
    for i, (_, mine) in zip(indices, loaded, strict=True):
        merged = statistics.combine_fields(merged, mine)
        chunks = integrity.date_chunks(store, arrays, i)  # hashed now, while in the page cache
        io.write_json(Path(done_dir) / marker_name(plan.init_times[i]), {"chunks": chunks})
    return merged


def load_date(forecast: sources.ForecastSource, truth: sources.TruthSource | None,
              oracle: sources.TruthSource | None, plan: sources.Plan, i: int, *, partials: bool = False,
              ) -> tuple[xr.Dataset, statistics.FieldPartials | None]:
    """One init date as the store holds it (members, their ensemble statistics, truth and oracle) and, with
    ``partials``, the partial statistics of its fields (from the float32 values the store gets)."""
    t = plan.init_times[i]
    ds = forecast.load(t, plan)
    ens: dict[str, xr.Variable] = {}
    parts: statistics.FieldPartials = {}
    for name, x in ds.data_vars.items():
        name = str(name)
        if x.dims[1] != schema.MEMBER or x.dims[-2:] != (schema.LAT, schema.LON):
            msg = f"{name}: dims {x.dims}, expected (init_time, member, ..., latitude, longitude)"
            raise AssertionError(msg)
        # x (1, member, step[, level], lat, lon) -> mean, std (1, step[, level], lat, lon)
        mean, std, p = statistics.ensemble_moments(np.asarray(x.values, dtype=np.float32), with_partial=partials)
        dims = tuple(d for d in x.dims if d != schema.MEMBER)
        ens[contract.ens_mean(name)] = xr.Variable(dims, mean)
        ens[contract.ens_std(name)] = xr.Variable(dims, std)
        if p is not None:
            parts |= {name: p, contract.ens_mean(name): statistics.value_partial(mean),
                      contract.ens_std(name): statistics.value_partial(std)}
    pieces = [ds, xr.Dataset(ens)]
    pieces += [extra.load(t, plan) for extra in (truth, oracle) if extra is not None]
    day = xr.merge(pieces, compat="override", join="override")
    if partials:
        parts |= statistics.date_partials(day[[n for n in statistics.statistic_fields(day) if n not in parts]])
    return day, parts if partials else None


def ensemble_statistics(ds: xr.Dataset) -> xr.Dataset:
    """Per-sample ensemble mean and population std (ddof 0) of every member field, as float32, lazily on
    dask: the one implementation, :func:`statistics.ensemble_moments` (float64 sums, numpy's operation
    order), which the ingest task runs too, so a model sees at forecast time what it trained on."""
    out = {}
    for name, x in ds.data_vars.items():
        mean, std = xr.apply_ufunc(_moments, x, input_core_dims=[[schema.MEMBER]], output_core_dims=[[], []],
                                   dask="parallelized", output_dtypes=[np.float32, np.float32])
        out[contract.ens_mean(str(name))], out[contract.ens_std(str(name))] = mean, std
    return xr.Dataset(out)


def _moments(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(init_time, ..., lat, lon, member) -> mean, std (init_time, ..., lat, lon), one init date at a time."""
    x = np.moveaxis(np.asarray(a, dtype=np.float32), -1, 1)  # (T, M, ..., lat, lon)
    pairs = [statistics.ensemble_moments(x[t:t + 1], with_partial=False)[:2] for t in range(x.shape[0])]
    mean = np.concatenate([m for m, _ in pairs]).reshape(a.shape[:-1])
    std = np.concatenate([s for _, s in pairs]).reshape(a.shape[:-1])
    return mean, std


def marker_name(t: Any) -> str:
    """The name of an init date's done-marker (and the date's name in merged.npz)."""
    return f"{pd.Timestamp(t):%Y%m%dT%H}"


def batches(todo: list[int], size: int) -> list[list[int]]:
    """Split sorted indices into runs of consecutive indices of at most ``size`` (one task each)."""
    out: list[list[int]] = []
    for i in todo:
        if out and out[-1][-1] == i - 1 and len(out[-1]) < size:
            out[-1].append(i)
        else:
            out.append([i])
    return out
