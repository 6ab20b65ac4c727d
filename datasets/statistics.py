"""Normalisation statistics of a training store, from the training years only.

:func:`compute_statistics` is a pure ``xr.Dataset -> xr.Dataset`` function (one pass over the
data on the active dask scheduler; numpy- or dask-backed input); :func:`from_partials` builds the
same group from partial moments merged elsewhere (ingest). For every field
``F`` (member fields ``z``..``skt``, per-sample ``ens_mean_F`` / ``ens_std_F``, and ``truth_*``):

* ``F_mean``, ``F_std``, ``F_min``, ``F_max``: per variable and level (and step), over training
  init times, members and all grid points (unweighted, as ENS-10 and anemoi do);
* ``F_point_mean`` .. ``F_point_max`` (float32, accumulated in float64): per grid point (and level,
  step), over training init times and members (ENS-10 normalises per grid point).

Per-variable statistics are float64 (mergeable partial moments in float64, see :func:`combine`).
NaNs (SST over land) are skipped; a grid point that is never valid stays NaN. Ingest accumulates the
partials in the tasks that write each date (:func:`dataset_partials`), so it never reads the store
back; :func:`compute_statistics` is the same computation over a dataset in hand.
The statistics period is recorded in the attributes, so a model can prove it never saw test years.
"""

from __future__ import annotations

from typing import Any

import dask
import dask.array
import numpy as np
import xarray as xr

from postcast.datasets import contract, schema
from postcast.datasets.core.errors import ConfigError

STAT_KINDS = ("mean", "std", "min", "max")


def statistic_fields(ds: xr.Dataset) -> list[str]:
    """Fields of a store that get statistics (every float data variable except the oracle)."""
    return [
        str(n)
        for n, v in ds.data_vars.items()
        if np.issubdtype(v.dtype, np.floating) and not str(n).startswith("oracle_")
    ]


# Mergeable partial moments (Chan, Golub & LeVeque 1979): count ``n``, mean and ``m2`` (the sum of
# squared deviations from the mean) in float64, with min/max in the data's dtype; keys without a
# prefix are per variable/level (over init times, members and grid points), keys with ``p`` per
# grid point (over init times and members). The merge is exact in real arithmetic and associative
# to float64 round-off, so a dask tree, a chain of merges as dates finish, or per-date partials
# saved by an interrupted ingest all give the same figures. The empty partial (n = 0) has mean 0,
# m2 0, min +inf and max -inf: the merge's identity.
Partial = dict[str, np.ndarray]
FieldPartials = dict[str, Partial]  # field name -> its partial
PREFIXES = ("", "p")


Moments = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # n, mean, m2, min, max


def _moments(x: np.ndarray, ok: np.ndarray | None, axes: tuple[int, ...]) -> Moments:
    """(n, mean, m2, min, max) of ``x`` over ``axes``: moments in float64 (two passes over the block,
    which is in memory), min/max in ``x``'s dtype; NaNs are skipped where ``ok`` (the finite mask) is given."""
    if all(x.shape[i] == 1 for i in axes):  # one value per output (a date of a field without members)
        v = x.squeeze(axes)
        valid = np.isfinite(v) if ok is not None else np.ones(v.shape, dtype=bool)
        lo, hi = (np.where(valid, v, fill).astype(x.dtype) for fill in (np.inf, -np.inf))
        return valid.astype(np.int64), np.where(valid, v, 0).astype(np.float64), np.zeros(v.shape), lo, hi
    if ok is None:  # the common case: no masks, no extra copies
        kept = tuple(n for i, n in enumerate(x.shape) if i not in axes)
        count = int(np.prod([x.shape[i] for i in axes]))
        mean = np.asarray(np.sum(x, axis=axes, dtype=np.float64, keepdims=True)) / max(count, 1)
        d = np.subtract(x, mean, dtype=np.float64)
        m2 = np.sum(np.square(d, out=d), axis=axes)
        return np.full(kept, count, dtype=np.int64), mean.squeeze(axes), m2, x.min(axes), x.max(axes)
    n = ok.sum(axes, dtype=np.int64)
    mean = np.sum(np.where(ok, x, 0), axis=axes, dtype=np.float64, keepdims=True) / np.expand_dims(
        np.maximum(n, 1), axes
    )
    d = np.where(ok, np.subtract(x, mean, dtype=np.float64), 0.0)
    lo = np.where(ok, x, np.inf).min(axes).astype(x.dtype)
    hi = np.where(ok, x, -np.inf).max(axes).astype(x.dtype)
    return n, mean.squeeze(axes), np.sum(np.square(d, out=d), axis=axes), lo, hi


ROWS = 16  # latitude rows per sweep of ensemble_moments: the float64 temporaries stay in the CPU cache


def ensemble_moments(x: np.ndarray, *, with_partial: bool = True) -> tuple[np.ndarray, np.ndarray, Partial | None]:
    """One init date of a member field, ``x`` (1, member, *outer, lat, lon) float32, in one sweep per
    (step, level) slice and band of latitude rows: its ensemble mean and population std (float32,
    (1, *outer, lat, lon), NaN where any member is) and, with ``with_partial``, the field's partial
    moments (per grid point over the members, per variable/level over members and grid points). Mean and
    std are numpy's ``mean``/``std(ddof=0)`` with ``dtype=float64``, operation for operation (the same
    sum order over members), cast to float32: the bits
    :func:`ensemble_statistics` gives at forecast time."""
    nm, outer, (ny, nx) = x.shape[1], x.shape[2:-2], x.shape[-2:]
    ens_mean = np.empty((1, *outer, ny, nx), dtype=np.float32)
    ens_std = np.empty_like(ens_mean)
    point = (
        {
            "pmean": np.empty((*outer, ny, nx)),
            "pm2": np.empty((*outer, ny, nx)),
            "pmin": np.empty((*outer, ny, nx), dtype=x.dtype),
            "pmax": np.empty((*outer, ny, nx), dtype=x.dtype),
        }
        if with_partial
        else {}
    )
    dev = np.empty((nm, min(ROWS, ny), nx))  # float64 scratch, reused
    counts: dict[tuple[int, ...], np.ndarray] = {}
    for idx in np.ndindex(*outer):
        block = x[(0, slice(None), *idx)]  # (member, lat, lon)
        for r0 in range(0, ny, ROWS):
            rows = slice(r0, min(r0 + ROWS, ny))
            b, d = block[:, rows], dev[:, : min(ROWS, ny - r0)]
            mean = np.add.reduce(b, axis=0, dtype=np.float64)
            mean /= nm  # numpy's mean, operation for operation
            np.subtract(b, mean, out=d)
            m2 = np.add.reduce(np.multiply(d, d, out=d), axis=0)
            ens_mean[(0, *idx, rows)] = mean
            ens_std[(0, *idx, rows)] = np.sqrt(m2 / nm)
            if with_partial:
                point["pmean"][(*idx, rows)], point["pm2"][(*idx, rows)] = mean, m2
                np.minimum.reduce(b, axis=0, out=point["pmin"][(*idx, rows)])
                np.maximum.reduce(b, axis=0, out=point["pmax"][(*idx, rows)])
        if with_partial and np.isnan(point["pmin"][idx]).any():  # SST over land: NaN-aware moments
            n, pm, pm2, lo, hi = _moments(block, np.isfinite(block), (0,))
            counts[idx] = n
            point["pmean"][idx], point["pm2"][idx], point["pmin"][idx], point["pmax"][idx] = pm, pm2, lo, hi
    if not with_partial:
        return ens_mean, ens_std, None
    if counts:
        n_all = np.full((*outer, ny, nx), nm, dtype=np.int64)
        for idx, n in counts.items():
            n_all[idx] = n
    else:  # the common case: no NaN, one count for every point (a view: no memory)
        n_all = np.broadcast_to(np.int64(nm), (*outer, ny, nx))
    moments = (n_all, point["pmean"], point["pm2"], point["pmin"], point["pmax"])
    spatial = (len(outer), len(outer) + 1)
    keys = ("pn", "pmean", "pm2", "pmin", "pmax")
    return ens_mean, ens_std, dict(zip(keys, moments, strict=True)) | _merge_over(*moments, spatial)


def value_partial(values: np.ndarray) -> Partial:
    """The partial of one init date of a field without members, ``values`` (1, *outer, lat, lon): one value
    per point, so count 1 (0 where NaN), mean = min = max = the value and m2 zero, held as views of
    ``values`` (float32; :func:`combine` computes in float64) wherever no value is NaN."""
    v = values[0]
    shape = v.shape
    if np.isnan(v).any():
        valid = np.isfinite(v)
        n = valid.astype(np.int64)
        mean = np.where(valid, v, 0).astype(v.dtype)
        lo, hi = np.where(valid, v, np.inf).astype(v.dtype), np.where(valid, v, -np.inf).astype(v.dtype)
    else:
        n, mean, lo, hi = np.broadcast_to(np.int64(1), shape), v, v, v
    moments = (n, mean, np.broadcast_to(np.float64(0.0), shape), lo, hi)
    out = dict(zip(("pn", "pmean", "pm2", "pmin", "pmax"), moments, strict=True))
    return out | _merge_over(*moments, (v.ndim - 2, v.ndim - 1))


def partial(block: np.ndarray, global_axes: tuple[int, ...], point_axes: tuple[int, ...]) -> Partial:
    """The partial moments of one block of a field (float32 or float64), per variable/level over
    ``global_axes`` and per grid point over ``point_axes``. Computed one (step, level) slice at a time
    when those axes lead (the store's layouts), so the float64 temporaries stay a slice's size."""
    outer = tuple(i for i in range(block.ndim) if i not in global_axes)
    spatial = tuple(i for i in global_axes if i not in point_axes)
    if not outer or max(outer) > min(spatial, default=block.ndim):
        return _partial_block(block, global_axes, point_axes)
    rest = [i for i in range(block.ndim) if i not in outer]
    sub_point = tuple(rest.index(i) for i in point_axes)
    outer_shape = tuple(block.shape[i] for i in outer)
    out: Partial = {}
    for idx in np.ndindex(*outer_shape):
        one = _partial_block(block[_select(outer, idx, block.ndim)], tuple(range(len(rest))), sub_point)
        for k, v in one.items():
            if k not in out:
                out[k] = np.empty(outer_shape + v.shape, dtype=v.dtype)
            out[k][idx] = v
    return out


def _select(axes: tuple[int, ...], idx: tuple[int, ...], ndim: int) -> tuple[Any, ...]:
    """An index picking position ``idx[j]`` on axis ``axes[j]`` and everything on the others."""
    out: list[Any] = [slice(None)] * ndim
    for a, i in zip(axes, idx, strict=True):
        out[a] = i
    return tuple(out)


def _partial_block(block: np.ndarray, global_axes: tuple[int, ...], point_axes: tuple[int, ...]) -> Partial:
    """Per-point moments from the data (one pass), then the per-variable ones from the per-point ones
    (Chan's merge over the grid: no second pass over the data)."""
    finite = np.isfinite(block)
    moments = _moments(block, None if finite.all() else finite, point_axes)
    out: Partial = dict(zip(("pn", "pmean", "pm2", "pmin", "pmax"), moments, strict=True))
    kept = [i for i in range(block.ndim) if i not in point_axes]
    spatial = tuple(kept.index(i) for i in global_axes if i not in point_axes)
    return out | _merge_over(*moments, spatial)


def _merge_over(
    n: np.ndarray, mean: np.ndarray, m2: np.ndarray, lo: np.ndarray, hi: np.ndarray, axes: tuple[int, ...]
) -> Partial:
    """Merge partial moments laid out along ``axes`` into one (the global keys)."""
    const = _constant(n)
    if const is not None and const > 0:  # one count everywhere: plain means, no weights
        points = int(np.prod([n.shape[i] for i in axes]))
        grand: np.ndarray = np.asarray(np.sum(mean, axis=axes, keepdims=True, dtype=np.float64)) / points
        dev = np.subtract(mean, grand, dtype=np.float64)
        dev *= dev
        return {
            "n": np.full(grand.squeeze(axes).shape, const * points, dtype=np.int64),
            "mean": grand.squeeze(axes),
            "m2": np.sum(m2, axis=axes) + const * np.sum(dev, axis=axes),
            "min": lo.min(axes),
            "max": hi.max(axes),
        }
    total = n.sum(axes, keepdims=True)
    grand = np.sum(np.multiply(n, mean, dtype=np.float64), axis=axes, keepdims=True) / np.maximum(total, 1)
    dev = np.subtract(mean, grand, dtype=np.float64)
    return {
        "n": total.squeeze(axes),
        "mean": grand.squeeze(axes),
        "m2": np.sum(m2 + n * dev * dev, axis=axes),
        "min": lo.min(axes),
        "max": hi.max(axes),
    }


def _constant(a: np.ndarray) -> Any:
    """The value of an array that is one number broadcast (every stride 0: a view), else None."""
    return a.flat[0] if a.size and not any(a.strides) else None


def combine(a: Partial, b: Partial) -> Partial:
    """Merge two partials of disjoint data (Chan et al.'s pairwise update), in float64. Counts that are one
    number per slice (no NaN anywhere) stay one number, so the shares are scalars and a merge costs a few
    passes over the means and m2."""
    out: Partial = {}
    for pre in PREFIXES:
        na, nb = a[pre + "n"], b[pre + "n"]
        ca, cb = _constant(na), _constant(nb)
        if ca is not None and cb is not None and na.shape == nb.shape:
            n = np.broadcast_to(np.int64(ca + cb), na.shape)
            w: Any = cb / (ca + cb) if ca + cb > 0 else 0.0  # share of b in the merged count
            share: Any = ca * w  # na * nb / n
        else:
            n = na + nb
            w = np.where(n > 0, nb / np.maximum(n, 1), 0.0)
            share = na * w
        delta = np.subtract(b[pre + "mean"], a[pre + "mean"], dtype=np.float64)
        mean = np.multiply(delta, w)
        mean += a[pre + "mean"]
        m2 = np.multiply(delta, delta, out=delta)
        m2 *= share
        m2 += a[pre + "m2"]
        if _constant(b[pre + "m2"]) != 0:
            m2 += b[pre + "m2"]
        out[pre + "n"], out[pre + "mean"], out[pre + "m2"] = n, mean, m2
        out[pre + "min"] = np.minimum(a[pre + "min"], b[pre + "min"])
        out[pre + "max"] = np.maximum(a[pre + "max"], b[pre + "max"])
    return out


def combine_fields(a: FieldPartials | None, b: FieldPartials | None) -> FieldPartials | None:
    """Merge two {field: partial} maps (None is the empty map); both must cover the same fields."""
    if a is None or b is None:
        return b if a is None else a
    if set(a) != set(b):
        msg = f"partials of different fields cannot merge: {sorted(set(a) ^ set(b))}"
        raise ValueError(msg)
    return {name: combine(a[name], b[name]) for name in a}


def field_axes(dims: tuple[str, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(global axes, point axes) of a field with dimensions ``dims``."""
    sample = tuple(i for i, d in enumerate(dims) if d in (schema.INIT_TIME, schema.MEMBER))
    spatial = tuple(i for i, d in enumerate(dims) if d in (schema.LAT, schema.LON))
    return tuple(sorted(sample + spatial)), sample


def dataset_partials(ds: xr.Dataset) -> FieldPartials:
    """The partials of every statistics field of an in-memory dataset (one or a few init dates), with
    each field cast to the store's float32 first, so they equal the partials of what the store holds."""
    out: FieldPartials = {}
    for name in statistic_fields(ds):
        da = ds[name]
        out[name] = partial(np.asarray(da.values, dtype=np.float32), *field_axes(tuple(map(str, da.dims))))
    return out


def date_partials(ds: xr.Dataset) -> FieldPartials:
    """The partials of every statistics field of one init date (``init_time`` of length 1, the store's
    layout: member second, latitude and longitude last), by the kernels ingest uses
    (:func:`ensemble_moments`, :func:`value_partial`) on the float32 values; equal to
    :func:`dataset_partials` to float64 round-off."""
    out: FieldPartials = {}
    for name in statistic_fields(ds):
        da = ds[name]
        values = np.asarray(da.values, dtype=np.float32)
        if da.sizes.get(schema.INIT_TIME) != 1 or da.dims[-2:] != (schema.LAT, schema.LON):
            msg = f"{name}: date_partials takes one init date laid out as the store's, got {dict(da.sizes)}"
            raise ValueError(msg)
        if schema.MEMBER in da.dims:
            out[name] = ensemble_moments(values)[2] or {}
        else:
            out[name] = value_partial(values)
    return out


def _tree(parts: list[Any]) -> Any:
    while len(parts) > 1:
        parts = [
            dask.delayed(combine)(parts[i], parts[i + 1]) if i + 1 < len(parts) else parts[i]
            for i in range(0, len(parts), 2)
        ]
    return parts[0]


def _finish(n: np.ndarray, mean: np.ndarray, m2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mean, std) from partial moments; NaN where nothing was counted."""
    const = _constant(n)
    if const is not None and const > 0:  # one count everywhere (no NaN): no masks
        return mean, np.sqrt(m2 / const)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, mean, np.nan), np.sqrt(m2 / n)


def _valid(n: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``x`` where something was counted, NaN elsewhere (min/max of a never-valid point: land for SST)."""
    const = _constant(n)
    return x if const is not None and const > 0 else np.where(n > 0, x, np.nan)


def field_partials(da: xr.DataArray) -> Any:
    """A delayed Partial for one field, reading each block once: a pairwise tree of merges over the blocks in
    order (a fixed tree: the same bits on any scheduler), run where the blocks are."""
    data = da.data if isinstance(da.data, dask.array.Array) else dask.array.from_array(da.values, chunks=-1)
    data = data.rechunk({i: -1 for i in range(data.ndim) if i != 0})
    axes = field_axes(tuple(map(str, da.dims)))
    blocks = [dask.delayed(partial)(b, *axes) for b in data.to_delayed().ravel()]
    return _tree(blocks)


def field_variables(name: str, dims: tuple[str, ...], p: Partial) -> dict[str, xr.Variable]:
    """The statistics variables of field ``name`` (dimensions ``dims``) from its merged partial ``p``."""
    gdims = [d for d in dims if d not in (schema.INIT_TIME, schema.MEMBER, schema.LAT, schema.LON)]
    mean, std = _finish(p["n"], p["mean"], p["m2"])
    lo, hi = (np.where(p["n"] > 0, p[k], np.nan).astype(np.float64) for k in ("min", "max"))  # per slice: small
    out = {f"{name}_{k}": xr.Variable(gdims, v) for k, v in (("mean", mean), ("std", std), ("min", lo), ("max", hi))}
    pdims = [d for d in dims if d not in (schema.INIT_TIME, schema.MEMBER)]
    pmean, pstd = _finish(p["pn"], p["pmean"], p["pm2"])
    pmin, pmax = _valid(p["pn"], p["pmin"]), _valid(p["pn"], p["pmax"])  # never-valid points stay NaN
    for k, v in (("mean", pmean), ("std", pstd), ("min", pmin), ("max", pmax)):
        out[f"{name}_point_{k}"] = xr.Variable(pdims, v.astype(np.float32, copy=False))
    return out


def template(ds: xr.Dataset) -> tuple[xr.Dataset, dict[str, tuple[int, ...]]]:
    """The statistics group :func:`from_partials` makes from ``ds``, as lazy NaN arrays (metadata only:
    written with ``compute=False`` before the data exist, so the arrays are created while the dates are
    still being ingested), and its chunk shapes: one 2-D field per chunk per grid point, whole arrays per
    variable/level."""
    out: dict[str, xr.Variable] = {}
    chunks: dict[str, tuple[int, ...]] = {}
    lazy: dict[tuple[Any, ...], dask.array.Array] = {}
    dims: set[str] = set()
    for name in statistic_fields(ds):
        da = ds[name]
        dims |= {str(d) for d in da.dims}
        for kinds, drop, dtype in (
            (STAT_KINDS, (schema.INIT_TIME, schema.MEMBER, schema.LAT, schema.LON), np.float64),
            (tuple(f"point_{k}" for k in STAT_KINDS), (schema.INIT_TIME, schema.MEMBER), np.float32),
        ):
            vdims = [str(d) for d in da.dims if d not in drop]
            shape = tuple(ds.sizes[d] for d in vdims)
            chunk = tuple(
                n if d in (schema.LAT, schema.LON) or dtype is np.float64 else 1
                for d, n in zip(vdims, shape, strict=True)
            )
            key = (shape, np.dtype(dtype).str, chunk)
            if key not in lazy:  # one lazy array per layout, shared (a dask array per variable: ~3 ms each)
                lazy[key] = dask.array.full(shape, np.nan, dtype=dtype, chunks=chunk or -1)
            for k in kinds:
                out[f"{name}_{k}"] = xr.Variable(vdims, lazy[key])
                chunks[f"{name}_{k}"] = chunk
    coords = {d: ds[d].variable for d in sorted(dims - {schema.INIT_TIME, schema.MEMBER}) if d in ds.coords}
    return xr.Dataset(out, coords=coords), chunks


def from_partials(ds: xr.Dataset, parts: FieldPartials, train_times: np.ndarray, splits: schema.Splits) -> xr.Dataset:
    """The statistics group from merged partials. ``ds`` supplies each field's dimensions and
    coordinates only (a lazily opened store: no data chunk is read); ``train_times`` are the training
    init times the partials cover (recorded in the attributes)."""
    out: dict[str, xr.Variable] = {}
    dims: set[str] = set()
    for name in statistic_fields(ds):
        if name not in parts:
            msg = f"no partial statistics for field {name!r}: the partials cover {sorted(parts)}"
            raise ValueError(msg)
        out.update(field_variables(name, tuple(map(str, ds[name].dims)), parts[name]))
        dims |= {str(d) for d in ds[name].dims}
    coords = {d: ds[d].variable for d in sorted(dims - {schema.INIT_TIME, schema.MEMBER}) if d in ds.coords}
    stats = xr.Dataset(out, coords=coords)  # variables and index coordinates only: no alignment per field
    stats.attrs.update(attributes(train_times, splits))
    return stats


def attributes(train_times: np.ndarray, splits: schema.Splits) -> dict[str, Any]:
    """The statistics group's attributes: the period its figures cover (a model proves it never saw test years)."""
    times = np.asarray(train_times, dtype="datetime64[ns]")
    return {
        "statistics_split": "train",
        "statistics_years": list(splits.train),
        "statistics_start": str(np.datetime_as_string(times.min(), unit="D")),
        "statistics_end": str(np.datetime_as_string(times.max(), unit="D")),
        "statistics_n_init_times": len(times),
    }


def training_dates(ds: xr.Dataset, splits: schema.Splits) -> xr.Dataset:
    """The init dates of ``ds`` in the training years (a ConfigError naming the years when there is none)."""
    mask = splits.mask(ds[schema.INIT_TIME].values, "train")
    if not mask.any():
        years = sorted(set(ds[schema.INIT_TIME].dt.year.values.tolist()))
        msg = f"no init time falls in the training years {splits.train}; the store holds years {years}"
        raise ConfigError(msg)
    return ds.isel({schema.INIT_TIME: np.flatnonzero(mask)})


def compute_statistics(ds: xr.Dataset, splits: schema.Splits) -> xr.Dataset:
    """Per-variable/level and per-grid-point statistics over the training split, in one pass over the
    data on the active dask scheduler (ingest does without it: each task hands in the partials of the
    dates it writes; this is the reference and the tool for stores and datasets in hand)."""
    train = training_dates(ds, splits)
    names = statistic_fields(ds)
    merged = dask.compute(*[field_partials(train[n]) for n in names])  # on the active scheduler
    return from_partials(train, dict(zip(names, merged, strict=True)), train[schema.INIT_TIME].values, splits)


def ensemble_statistics(ds: xr.Dataset) -> xr.Dataset:
    """Per-sample ensemble mean and population std (ddof 0) of every member field, as float32, lazily on
    dask: the one implementation, :func:`ensemble_moments` (float64 sums, numpy's operation
    order), which the ingest task runs too, so a model sees at forecast time what it trained on."""
    out = {}
    for name, x in ds.data_vars.items():
        mean, std = xr.apply_ufunc(
            _member_moments,
            x,
            input_core_dims=[[schema.MEMBER]],
            output_core_dims=[[], []],
            dask="parallelized",
            output_dtypes=[np.float32, np.float32],
        )
        out[contract.ens_mean(str(name))], out[contract.ens_std(str(name))] = mean, std
    return xr.Dataset(out)


def _member_moments(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(init_time, ..., lat, lon, member) -> mean, std (init_time, ..., lat, lon), one init date at a time."""
    x = np.moveaxis(np.asarray(a, dtype=np.float32), -1, 1)  # (T, M, ..., lat, lon)
    pairs = [ensemble_moments(x[t : t + 1], with_partial=False)[:2] for t in range(x.shape[0])]
    mean = np.concatenate([m for m, _ in pairs]).reshape(a.shape[:-1])
    std = np.concatenate([s for _, s in pairs]).reshape(a.shape[:-1])
    return mean, std
