"""The layout of the training store ingest writes: its empty template and its chunk shapes.

Layout of the store (see docs/store.md for the reasoning; the names are :mod:`postcast.datasets.contract`'s):

* member fields ``z, t, q, w, d, u, v`` (init_time, member, step, level, latitude, longitude) and
  ``sst .. skt`` (init_time, member, step, latitude, longitude), float32, one chunk per
  (init time, step, level, variable) holding all members and the whole grid (10 MB at 0.5 deg);
  on coarse grids levels and steps join the chunk while it stays under ~4 MB;
* per-sample ensemble statistics ``ens_mean_F`` / ``ens_std_F`` (population std, ddof 0), chunked
  the same way without the member axis;
* ``truth_<target>`` and, for synthetic data, ``oracle_mean_<target>`` / ``oracle_std_<target>``,
  (init_time, step, latitude, longitude), one chunk per init time;
* coordinate ``split`` (train/val/test/none) per init time; group ``statistics`` (training years
  only); attributes: format version, plan, provenance (sources, SHA-256, code version), completeness.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import dask.array as da
import numpy as np
import pandas as pd
import xarray as xr

from postcast.datasets import contract, io, schema, sources


def chunk_shapes(plan: sources.Plan) -> dict[str, tuple[int, ...]]:
    """Chunk shape of every store array: one init date per chunk (whole-chunk region writes), all members
    and the whole grid; levels, then steps, merged in while a chunk stays under ~4 MB (coarse grids)."""
    ny, nx = plan.grid.shape
    nm, ns, nl = len(plan.members), len(plan.steps_h), len(plan.levels)
    out: dict[str, tuple[int, ...]] = {}
    grow = (schema.LEVEL, schema.STEP)
    for v in plan.variables:
        pl = plan.variable(v).level_type is schema.LevelType.PRESSURE
        dims = schema.PL_DIMS if pl else schema.SFC_DIMS
        shape = (1, nm, ns, nl, ny, nx) if pl else (1, nm, ns, ny, nx)
        out[v] = io.chunk_shape(dims, shape, whole=(schema.MEMBER, schema.LAT, schema.LON), grow=grow)
        edims = tuple(d for d in dims if d != schema.MEMBER)
        eshape = tuple(n for d, n in zip(dims, shape, strict=True) if d != schema.MEMBER)
        out[contract.ens_mean(v)] = out[contract.ens_std(v)] = io.chunk_shape(
            edims, eshape, whole=(schema.LAT, schema.LON), grow=grow
        )
    for tg in schema.TARGETS.values():
        for name in (contract.truth_name(tg.name), *contract.oracle_parameters(tg).values()):
            out[name] = (1, ns, ny, nx)
    return out


def template(plan: sources.Plan, *, truth: Sequence[str], oracle: Sequence[str], splits: schema.Splits) -> xr.Dataset:
    """The empty store: every variable as lazy NaNs with the store's chunking (metadata only)."""
    n_t, nm, ns, nl = len(plan.init_times), len(plan.members), len(plan.steps_h), len(plan.levels)
    ny, nx = plan.grid.shape
    chunks = chunk_shapes(plan)
    data: dict[str, xr.Variable] = {}

    def empty(shape: tuple[int, ...], name: str) -> da.Array:
        return da.full(shape, np.nan, dtype=np.float32, chunks=chunks[name])

    for v in plan.variables:
        var = plan.variable(v)
        attrs = schema.cf_attrs(var)
        shape: tuple[int, ...]
        dims: tuple[str, ...]
        if var.level_type is schema.LevelType.PRESSURE:
            dims, shape = schema.PL_DIMS, (n_t, nm, ns, nl, ny, nx)
        else:
            dims, shape = schema.SFC_DIMS, (n_t, nm, ns, ny, nx)
        edims = tuple(d for d in dims if d != schema.MEMBER)  # the ensemble statistics: no member axis
        eshape = tuple(s for d, s in zip(dims, shape, strict=True) if d != schema.MEMBER)
        data[v] = xr.Variable(dims, empty(shape, v), attrs)
        data[contract.ens_mean(v)] = xr.Variable(
            edims, empty(eshape, contract.ens_mean(v)), {**attrs, "long_name": f"ensemble mean of {var.long_name}"}
        )
        data[contract.ens_std(v)] = xr.Variable(
            edims,
            empty(eshape, contract.ens_std(v)),
            {**attrs, "long_name": f"ensemble std (ddof=0) of {var.long_name}"},
        )
    tdims = (schema.INIT_TIME, schema.STEP, schema.LAT, schema.LON)
    for name in [*truth, *oracle]:
        tg = schema.target(name.split("_")[-1])  # truth_<target>, oracle_<parameter>_<target>
        data[name] = xr.Variable(tdims, empty((n_t, ns, ny, nx), name), {"units": tg.units, "target": tg.name})
    return xr.Dataset(data, coords=_coordinates(plan, splits))


def _coordinates(plan: sources.Plan, splits: schema.Splits) -> dict[str, Any]:
    """The store's coordinates, with ``valid_time`` (init_time, step) and the ``split`` code of each init time."""
    times = pd.DatetimeIndex(plan.init_times)
    steps = pd.to_timedelta(list(plan.steps_h), unit="h")
    return {
        schema.INIT_TIME: times,
        schema.MEMBER: np.array(plan.members),
        schema.STEP: steps,
        schema.LEVEL: (schema.LEVEL, np.array(plan.levels, dtype=np.int64), {"units": "hPa"}),
        schema.LAT: (schema.LAT, plan.grid.latitudes(), {"units": "degrees_north", "standard_name": "latitude"}),
        schema.LON: (schema.LON, plan.grid.longitudes(), {"units": "degrees_east", "standard_name": "longitude"}),
        schema.VALID_TIME: ((schema.INIT_TIME, schema.STEP), times.values[:, None] + steps.values[None, :]),
        contract.SPLIT: (
            schema.INIT_TIME,
            np.array([contract.split_code(splits.split_of(t.year)) for t in times], dtype=np.int8),
            {
                "long_name": "data split of the init time",
                "flag_values": sorted(contract.SPLIT_CODES.values()),
                "flag_meanings": contract.SPLIT_FLAG_MEANINGS,
            },
        ),
    }
