"""Training partials on disk: one .npz of every field's merged partial moments and the dates they cover,
written atomically, so a resumed ingest takes over what an earlier run merged."""

from __future__ import annotations

import os

import numpy as np

from postcast.datasets.core.moments import PREFIXES, FieldPartials, Partial


def save_partials(parts: FieldPartials, path: str | os.PathLike[str], *, dates: list[str] | None = None) -> None:
    """Write partials as one uncompressed .npz (numbers only: loading runs no code), losslessly
    compacted: a constant count as one number, other counts in the smallest unsigned type, an all-zero
    ``m2`` as one zero, a float32-exact mean as float32, and min/max left out where they equal the mean
    (one value per point: a single date of a field without members). Not atomic by itself: callers
    write to a temporary name and rename (``io.atomic_path``). ``dates`` (names of the init dates the
    partials cover) are stored with them (:func:`partial_dates`)."""
    arrays: dict[str, np.ndarray] = {} if dates is None else {"dates": np.array(dates, dtype=str)}
    for name, p in parts.items():
        for pre in PREFIXES:
            arrays.update({f"{name}/{k}": v for k, v in _compact(p, pre).items()})
    with open(path, "wb") as f:
        np.savez(f, allow_pickle=False, **arrays)


def _compact(p: Partial, pre: str) -> dict[str, np.ndarray]:
    n, mean, m2, lo, hi = (p[pre + k] for k in ("n", "mean", "m2", "min", "max"))
    out: dict[str, np.ndarray] = {}
    if n.size and (n == n.flat[0]).all():
        out[f"{pre}n@const"] = np.asarray(n.flat[0], dtype=np.int64)
    else:
        out[f"{pre}n"] = n.astype(np.min_scalar_type(int(n.max(initial=0))))
    out[f"{pre}m2@zero" if not m2.any() else f"{pre}m2"] = np.zeros((), m2.dtype) if not m2.any() else m2
    m32 = mean.astype(np.float32)
    out[f"{pre}mean"] = m32 if np.array_equal(m32, mean) else mean
    valid = n > 0
    if np.array_equal(lo[valid], mean[valid]) and np.array_equal(hi[valid], mean[valid]):
        out[f"{pre}minmax@mean"] = np.zeros((), lo.dtype)  # min = max = mean where n > 0; +-inf elsewhere
    else:
        out[f"{pre}min"], out[f"{pre}max"] = lo, hi
    return out


def load_partials(path: str | os.PathLike[str]) -> FieldPartials:
    """Read partials written by :func:`save_partials` (``allow_pickle=False``: data only)."""
    raw: dict[str, dict[str, np.ndarray]] = {}
    with np.load(path, allow_pickle=False) as z:
        for key in z.files:
            if "/" not in key:  # the covered dates
                continue
            name, kind = key.rsplit("/", 1)
            raw.setdefault(name, {})[kind] = z[key]
    return {name: _expand(r) for name, r in raw.items()}


def partial_dates(path: str | os.PathLike[str]) -> list[str]:
    """The init dates a partials file covers (empty when it was saved without them)."""
    with np.load(path, allow_pickle=False) as z:
        return [str(d) for d in z["dates"]] if "dates" in z.files else []


def _expand(r: dict[str, np.ndarray]) -> Partial:
    out: Partial = {}
    for pre in PREFIXES:
        mean = r[f"{pre}mean"].astype(np.float64)
        n = (
            np.full(mean.shape, r[f"{pre}n@const"], dtype=np.int64)
            if f"{pre}n@const" in r
            else r[f"{pre}n"].astype(np.int64)
        )
        m2 = np.zeros(mean.shape) if f"{pre}m2@zero" in r else r[f"{pre}m2"]
        if f"{pre}minmax@mean" in r:
            dtype = r[f"{pre}minmax@mean"].dtype
            lo = np.where(n > 0, mean, np.inf).astype(dtype)
            hi = np.where(n > 0, mean, -np.inf).astype(dtype)
        else:
            lo, hi = r[f"{pre}min"], r[f"{pre}max"]
        out.update({pre + "n": n, pre + "mean": mean, pre + "m2": m2, pre + "min": lo, pre + "max": hi})
    return out
