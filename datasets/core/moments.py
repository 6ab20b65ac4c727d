"""Mergeable partial moments (Chan, Golub and LeVeque 1979), numpy only: the count, mean and sum of squared
deviations of a block of a field, per variable/level and per grid point, their exact pairwise merge
(:func:`combine`), and one init date's ensemble mean and std with its partial in one sweep
(:func:`ensemble_moments`, which ingest runs and :func:`postcast.datasets.statistics.ensemble_statistics`
runs at forecast time). :mod:`postcast.datasets.statistics` turns merged partials into a store's
normalisation statistics; :mod:`postcast.datasets.ingest.partials` keeps them on disk.
"""

from __future__ import annotations

from typing import Any

import numpy as np

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
    const = constant(n)
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


def constant(a: np.ndarray) -> Any:
    """The value of an array that is one number broadcast (every stride 0: a view), else None."""
    return a.flat[0] if a.size and not any(a.strides) else None


def combine(a: Partial, b: Partial) -> Partial:
    """Merge two partials of disjoint data (Chan et al.'s pairwise update), in float64. Counts that are one
    number per slice (no NaN anywhere) stay one number, so the shares are scalars and a merge costs a few
    passes over the means and m2."""
    out: Partial = {}
    for pre in PREFIXES:
        na, nb = a[pre + "n"], b[pre + "n"]
        ca, cb = constant(na), constant(nb)
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
        if constant(b[pre + "m2"]) != 0:
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
