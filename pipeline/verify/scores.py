"""Probabilistic scores on numpy arrays (float64): Gaussian CRPS and ensemble CRPS estimators.

Definitions (docs/ens10.md: the Gaussian and ensemble CRPS), for members x_1..x_M and outcome y:

* **standard** (empirical CDF, "ecdf"/"NRG", what properscoring computes):
  ``mean_i |x_i - y| - 1/(2 M^2) sum_ij |x_i - x_j|``
* **fair** (Ferro 2014, unbiased for the law the members are drawn from; what WeatherBench 2 and
  scoringrules' ``estimator="fair"`` compute):
  ``mean_i |x_i - y| - 1/(2 M (M - 1)) sum_ij |x_i - x_j|``
* **Gaussian** closed form: ``sigma [z (2 Phi(z) - 1) + 2 phi(z) - 1/sqrt(pi)]``, ``z = (y - mu)/sigma``.

With sorted members x_(1) <= .. <= x_(M), ``sum_ij |x_i - x_j| = 2 sum_i (2 i - M - 1) x_(i)``,
so both estimators come from one O(M) pass over sorted members (:func:`crps_ensemble_pair`). The
numba kernels sort with Batcher's sorting network, branch-free: for small M one row at a time in
registers with the network unrolled, for larger M on blocks of points with members outermost,
vectorised across points (which is faster was measured, ``UNROLLED_MAX_MEMBERS``); the numpy
kernel (np.sort + a matrix-vector product) serves calls too small to repay numba's compilation
(:func:`numba_pays`) and machines without numba. Always state the
estimator: the two differ by a factor M/(M-1) on the spread term, which matters when comparing
10- and 50-member ensembles.

numpy/scipy only at import: torch (and :mod:`postcast.models.kernels`) is imported only when
:func:`crps_ensemble` takes the torch engine (``engine="torch"``, or ``"auto"`` with a CUDA GPU).
Latitude weights are :func:`postcast.datasets.core.geo.latitude_weights`, re-exported here.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Literal

import numpy as np
from scipy import special

from postcast.datasets.core.errors import BadInputError
from postcast.datasets.core.geo import latitude_weights as latitude_weights  # re-exported: one implementation

Estimator = Literal["fair", "standard"]
NUMBA_MIN_VALUES = 20_000_000  # member values in one call from which the "auto" engine compiles numba (numba_pays)
_INV_SQRT_PI = 1.0 / math.sqrt(math.pi)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def crps_gaussian(mu: np.ndarray, sigma: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Closed-form CRPS of N(mu, sigma^2) at y, elementwise, float64. sigma must be > 0."""
    mu, sigma, y = (np.asarray(a, dtype=np.float64) for a in (mu, sigma, y))
    if np.any(sigma <= 0):
        msg = "crps_gaussian: sigma must be positive (floor the spread, e.g. sigma = max(s, 1e-6))"
        raise ValueError(msg)
    z = (y - mu) / sigma
    return sigma * (z * (2.0 * special.ndtr(z) - 1.0) + 2.0 * _INV_SQRT_2PI * np.exp(-0.5 * z * z) - _INV_SQRT_PI)


def _crps_rows_numpy(xs: np.ndarray, y: np.ndarray, fair: bool) -> np.ndarray:
    """Vectorised kernel on a C-contiguous float64 (N, M) copy (sorted and overwritten in place)."""
    m = xs.shape[-1]
    xs.sort(axis=-1)
    weights = 2.0 * np.arange(1, m + 1) - m - 1.0  # (2i - M - 1), i = 1..M
    spread = xs @ weights  # (N,) = 1/2 sum_ij |x_i - x_j|
    xs -= y[:, None]  # reuse the buffer for |x_i - y|
    np.abs(xs, out=xs)
    skill = xs.sum(axis=-1) / m  # (N,) = E|X - y|
    return skill - spread / (m * (m - 1) if fair else m * m)


BLOCK = 64  # points per block of the block kernel: (M, BLOCK) float64 stays in L1
UNROLLED_MAX_MEMBERS = 16  # beyond, the unrolled network compiles too slowly (M = 50: over 10 minutes)


@functools.cache
def sorting_network(m: int) -> tuple[np.ndarray, np.ndarray]:
    """Batcher's odd-even merge sort for ``m`` inputs as compare-exchange pairs (lo, hi), lo < hi:
    the network for the next power of two with comparators touching padding dropped (padding
    would hold +inf, so those comparators never move a real value)."""
    n = 1 << max(0, (m - 1).bit_length())
    pairs = []
    p = 1
    while p < n:
        k = p
        while k >= 1:
            for j in range(k % p, n - k, 2 * k):
                for i in range(min(k, n - j - k)):
                    lo, hi = i + j, i + j + k
                    if lo // (2 * p) == hi // (2 * p) and hi < m:
                        pairs.append((lo, hi))
            k //= 2
        p *= 2
    arr = np.array(pairs, dtype=np.int64).reshape(-1, 2)
    return np.ascontiguousarray(arr[:, 0]), np.ascontiguousarray(arr[:, 1])


def _unrolled_source(m: int, presorted: bool) -> str:
    """Python source of a row kernel for exactly ``m`` members: the row in m locals (registers), the
    sorting network unrolled as branch-free min/max, then the O(M) pass for both estimators."""
    lo, hi = sorting_network(m)
    body = [f"        a{i} = x[r, {i}]" for i in range(m)]
    if not presorted:
        body += [
            f"        a{i}, a{j} = (a{i} if a{i} < a{j} else a{j}), (a{j} if a{i} < a{j} else a{i})"
            for i, j in zip(lo.tolist(), hi.tolist(), strict=True)
        ]
    body += [
        "        t = y[r]",
        "        skill = " + " + ".join(f"abs(a{i} - t)" for i in range(m)),  # sum_i |x_i - y|
        # 1/2 sum_ij |x_i - x_j| = sum_i (2i - M - 1) x_(i), i = 1..M
        "        spread = " + " + ".join(f"({2 * i + 1 - m}.0) * a{i}" for i in range(m)),
        f"        fair[r] = skill / {m}.0 - spread / {m * (m - 1)}.0",
        f"        std[r] = skill / {m}.0 - spread / {m * m}.0",
    ]
    head = [
        "def kernel(x, y):",
        "    n = x.shape[0]",
        "    fair = np.empty(n)",
        "    std = np.empty(n)",
        "    for r in numba.prange(n):",
    ]
    return "\n".join([*head, *body, "    return fair, std", ""])


@functools.cache
def _unrolled_kernel(m: int, presorted: bool) -> Any:
    """The row kernel of :func:`_unrolled_source`, compiled for ``m`` (the source is generated here
    from the network, never read from disk)."""
    import numba

    namespace: dict[str, Any] = {"np": np, "numba": numba}
    exec(compile(_unrolled_source(m, presorted), f"<crps_unrolled_m{m}>", "exec"), namespace)
    return numba.njit(parallel=True, cache=False, error_model="numpy")(namespace["kernel"])


def _compile_numba() -> Any | None:
    """The block kernel (None without numba): blocks of BLOCK points with members outermost in an
    (M, BLOCK) buffer, so the sorting network's compare-exchanges and the O(M) pass run vectorised
    across points; fair and standard CRPS from one pass. Buffers are allocated once per thread."""
    try:
        import numba
    except ImportError:
        return None

    @numba.njit(parallel=True, cache=False, error_model="numpy")
    def block_kernel(
        x: np.ndarray, y: np.ndarray, lo: np.ndarray, hi: np.ndarray, presorted: bool, chunks: int
    ) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover - compiled
        n, m = x.shape
        n_blocks = (n + BLOCK - 1) // BLOCK
        per = (n_blocks + chunks - 1) // chunks
        fair, std = np.empty(n), np.empty(n)
        for ch in numba.prange(chunks):
            buf, yb = np.empty((m, BLOCK)), np.empty(BLOCK)  # (M, BLOCK), (BLOCK,)
            skill, spread = np.empty(BLOCK), np.empty(BLOCK)
            for blk in range(ch * per, min(n_blocks, (ch + 1) * per)):
                s = blk * BLOCK
                n_pts = min(n, s + BLOCK) - s
                for k in range(BLOCK):  # buf <- x[s:s + BLOCK].T, a ragged block padded with zeros
                    for i in range(m):
                        buf[i, k] = x[s + k, i] if k < n_pts else 0.0
                    yb[k] = y[s + k] if k < n_pts else 0.0
                if not presorted:
                    for c in range(lo.size):  # compare-exchange rows lo[c] < hi[c] across the block
                        a, b = lo[c], hi[c]
                        for k in range(BLOCK):
                            u, v = buf[a, k], buf[b, k]
                            buf[a, k] = u if u < v else v
                            buf[b, k] = v if u < v else u
                skill[:] = 0.0
                spread[:] = 0.0
                for i in range(m):  # one O(M) pass: sum |x_(i) - y| and sum (2i - M - 1) x_(i)
                    w = 2.0 * i + 1.0 - m
                    for k in range(BLOCK):
                        skill[k] += abs(buf[i, k] - yb[k])
                        spread[k] += w * buf[i, k]
                for k in range(n_pts):
                    fair[s + k] = skill[k] / m - spread[k] / (m * (m - 1))
                    std[s + k] = skill[k] / m - spread[k] / (m * m)
        return fair, std

    return block_kernel


_NUMBA_KERNEL: Any | None = None
_NUMBA_TRIED = False


def _numba_kernel() -> Any | None:
    global _NUMBA_KERNEL, _NUMBA_TRIED
    if not _NUMBA_TRIED:
        _NUMBA_TRIED, _NUMBA_KERNEL = True, _compile_numba()
    return _NUMBA_KERNEL


def numba_available() -> bool:
    """Whether the numba kernels compile here (else the numpy kernels serve)."""
    return _numba_kernel() is not None


def numba_pays(values: int) -> bool:
    """Whether the "auto" engine takes the numba kernels for ``values`` member values in one call: from
    NUMBA_MIN_VALUES on (where numba is installed). Compiling them takes 4 to 12 s on the 2-core machine, the
    numpy kernel's time for about 100 to 250 M values (0.047 ns per value for both estimators, numba's 3 ns),
    so a small evaluation (the targets world's: 0.4 M values a call) scores faster without them."""
    return values >= NUMBA_MIN_VALUES and numba_available()


def crps_ensemble_pair(
    x: np.ndarray, y: np.ndarray, *, presorted: bool = False, kernel: Literal["auto", "unrolled", "block"] = "auto"
) -> tuple[np.ndarray, np.ndarray]:
    """(fair, standard) ensemble CRPS of (N, M) members at (N,) outcomes in one pass (numba).

    ``presorted``: rows already sorted ascending (the sort is skipped). ``kernel``: "unrolled" (one
    row in registers, the network unrolled; compiled per M), "block" (members outermost, vectorised
    across points), or "auto": unrolled for M <= UNROLLED_MAX_MEMBERS, which measured fastest there
    (benchmarks/metrics.py), else block."""
    block = _numba_kernel()
    if block is None:
        msg = "crps_ensemble_pair needs numba (pip install numba); crps_ensemble(engine='numpy') works without"
        raise ValueError(msg)
    xs = np.ascontiguousarray(x, dtype=np.float64)  # (N, M), no copy when already so
    ys = np.ascontiguousarray(y, dtype=np.float64).reshape(-1)  # (N,)
    m = xs.shape[1]
    if m < 2:
        msg = f"{m} ensemble member(s): the fair CRPS needs at least 2"
        raise BadInputError(msg)
    if kernel == "unrolled" or (kernel == "auto" and m <= UNROLLED_MAX_MEMBERS):
        fair, std = _unrolled_kernel(m, presorted)(xs, ys)
    else:
        import numba

        lo, hi = sorting_network(m)
        fair, std = block(xs, ys, lo, hi, presorted, numba.get_num_threads())
    return np.asarray(fair), np.asarray(std)


def _cuda_available() -> bool:
    """Whether torch sees a CUDA GPU (imports torch; False when torch is not installed)."""
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _crps_rows_torch(xs: np.ndarray, y: np.ndarray, fair: bool) -> np.ndarray:
    """The kernel dispatch (:func:`postcast.models.kernels.crps_ensemble`) on (N, M) members and (N,)
    outcomes, float64, on the GPU when there is one; torch is imported here, not at module import."""
    import torch

    from postcast.models import kernels

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    xt = torch.as_tensor(np.ascontiguousarray(xs, dtype=np.float64), device=dev)
    yt = torch.as_tensor(np.ascontiguousarray(y), device=dev)
    return np.asarray(kernels.crps_ensemble(xt, yt, fair).cpu().numpy())


def crps_ensemble(
    x: np.ndarray,
    y: np.ndarray,
    *,
    axis: int = -1,
    estimator: Estimator = "fair",
    engine: Literal["auto", "numba", "numpy", "torch"] = "auto",
) -> np.ndarray:
    """Ensemble CRPS of members ``x`` (member axis ``axis``) at outcomes ``y`` (x's shape without
    that axis), float64. ``estimator``: "fair" (default) or "standard". ``engine``: "auto" uses the
    fused kernel on a CUDA GPU (:func:`postcast.models.kernels.crps_ensemble`, Triton), else the numba
    block kernels (:func:`crps_ensemble_pair`) for a call large enough to repay their compilation
    (:func:`numba_pays`), else the vectorised numpy kernel; "numba" / "numpy" / "torch" (the kernel
    dispatch, on the GPU when there is one) force one."""
    if estimator not in ("fair", "standard"):
        msg = f"estimator {estimator!r}: use 'fair' or 'standard'"
        raise ValueError(msg)
    xm = np.moveaxis(np.asarray(x), axis, -1)
    y = np.asarray(y, dtype=np.float64)
    m = xm.shape[-1]
    if xm.shape[:-1] != y.shape:
        msg = f"crps_ensemble: members {xm.shape[:-1]} + ({m},) do not match outcomes {y.shape}"
        raise ValueError(msg)
    if estimator == "fair" and m < 2:
        msg = f"{m} ensemble member(s): the fair CRPS needs at least 2"
        raise BadInputError(msg)
    fair = estimator == "fair"
    if engine == "torch" or (engine == "auto" and _cuda_available()):
        return _crps_rows_torch(xm.reshape(-1, m), y.reshape(-1), fair).reshape(y.shape)
    kernel = _numba_kernel() if engine == "numba" or (engine == "auto" and numba_pays(xm.size)) else None
    if engine == "numba" and kernel is None:
        msg = "engine='numba' needs numba installed (pip install numba), or use engine='numpy'"
        raise ValueError(msg)
    if kernel is not None and m >= 2:
        f, s = crps_ensemble_pair(xm.reshape(-1, m), y.reshape(-1))
        return (f if fair else s).reshape(y.shape)
    flat = np.array(xm.reshape(-1, m), dtype=np.float64, order="C", copy=True)  # (N, M) scratch
    return np.asarray(_crps_rows_numpy(flat, y.reshape(-1), fair)).reshape(y.shape)


def crps_ensemble_reference(
    x: np.ndarray, y: np.ndarray, *, axis: int = -1, estimator: Estimator = "fair"
) -> np.ndarray:
    """The O(M^2) definition, float64: the reference the fast kernel is tested against."""
    xm = np.moveaxis(np.asarray(x, dtype=np.float64), axis, -1)
    y = np.asarray(y, dtype=np.float64)
    m = xm.shape[-1]
    skill = np.abs(xm - y[..., None]).mean(-1)
    pair = np.abs(xm[..., :, None] - xm[..., None, :]).sum((-1, -2))
    denom = 2 * m * (m - 1) if estimator == "fair" else 2 * m * m
    return skill - pair / denom


def twcrps_ensemble(
    x: np.ndarray, y: np.ndarray, threshold: float | np.ndarray, *, axis: int = -1, estimator: Estimator = "fair"
) -> np.ndarray:
    """Threshold-weighted CRPS of members ``x`` at outcomes ``y`` with weight 1{z >= threshold}
    (Allen et al. 2023): the CRPS of the chained members max(x, t) against max(y, t), so only the
    part of both distributions above ``t`` counts (the tail an extreme-event user cares about).
    ``threshold``: one value, or one per point (broadcastable to ``y``, e.g. (lat, lon))."""
    if not np.isfinite(threshold).all():
        msg = f"twCRPS threshold {threshold}: give a finite value in the variable's units"
        raise ValueError(msg)
    return crps_ensemble(np.maximum(x, threshold), np.maximum(y, threshold), axis=axis, estimator=estimator)


def ensemble_exceedance(x: np.ndarray, threshold: float, *, axis: int = -1) -> np.ndarray:
    """P(Y > threshold) of an ensemble: the fraction of members above it."""
    return np.asarray(np.mean(np.asarray(x) > threshold, axis=axis), dtype=np.float64)


def brier_score(prob: np.ndarray, y: np.ndarray, threshold: float) -> np.ndarray:
    """Brier score (P(Y > t) - 1{y > t})^2 of exceedance probabilities ``prob`` at outcomes ``y``."""
    event = (np.asarray(y) > threshold).astype(np.float64)
    return (np.asarray(prob, dtype=np.float64) - event) ** 2


# --- weighting (latitude_weights: postcast.datasets.core.geo, re-exported above), calibration ----------
def spread_skill_ratio(ens_std: np.ndarray, ens_mean: np.ndarray, truth: np.ndarray) -> float:
    """Mean ensemble spread over the RMSE of the ensemble mean (1 for a calibrated ensemble; the
    spread is taken as sqrt(mean variance), as WeatherBench 2 does)."""
    ok = np.isfinite(truth)
    rmse = np.sqrt(np.mean((np.asarray(ens_mean)[ok] - np.asarray(truth)[ok]) ** 2))
    spread = np.sqrt(np.mean(np.asarray(ens_std)[ok] ** 2))
    return float(spread / rmse)


def generator_after(seed: int, skip: int = 0) -> np.random.Generator:
    """``np.random.default_rng(seed)`` after ``skip`` draws of a float64 uniform (one 64-bit output each)."""
    bits = np.random.PCG64(seed)  # default_rng's
    bits.advance(skip)
    return np.random.Generator(bits)


def rank_histogram(x: np.ndarray, y: np.ndarray, *, axis: int = -1, seed: int = 0, skip: int = 0) -> np.ndarray:
    """Counts of the rank of y among the M members (M + 1 bins); ties broken at random, one draw per finite
    outcome from the generator seeded ``seed`` after its first ``skip`` draws (a chunk of cases after
    ``skip`` finite ones draws what the whole sample would: the counts of the chunks add up)."""
    xm = np.moveaxis(np.asarray(x), axis, -1).reshape(-1, np.shape(x)[axis])
    yv = np.asarray(y).reshape(-1)
    ok = np.isfinite(yv)
    xm, yv = xm[ok], yv[ok]
    below = (xm < yv[:, None]).sum(-1)
    ties = (xm == yv[:, None]).sum(-1)
    rng = generator_after(seed, skip)
    rank = below + np.floor(rng.random(yv.size) * (ties + 1)).astype(int)
    return np.bincount(rank, minlength=xm.shape[-1] + 1)


# --- extreme forecast index and EECRPS (ENS-10, docs/ens10.md) ------------------------------------
EFI_LEVELS = np.linspace(0.0, 1.0, 21)  # p = 0, 0.05, ..., 1


def efi(clim_quantiles: np.ndarray, members: np.ndarray) -> np.ndarray:
    """Extreme Forecast Index from model-climate quantiles (21, ...) at EFI_LEVELS and members
    (M, ...): (2/pi) sum_p (p - F_ens(q_clim(p))) / sqrt(p (1 - p)) dp over the 19 interior levels,
    dp = 0.05, with F_ens the ensemble CDF interpolated linearly between the ensemble's own
    quantiles at EFI_LEVELS. In [-1, 1]; > 0 when the ensemble is above the model climate."""
    q_ens = np.quantile(np.asarray(members, dtype=np.float64), EFI_LEVELS, axis=0)  # (21, ...)
    q_clim = np.asarray(clim_quantiles, dtype=np.float64)
    shape = q_ens.shape[1:]
    qe = q_ens.reshape(21, -1)
    qc = q_clim.reshape(21, -1)
    total = np.zeros(qe.shape[1])
    dp = EFI_LEVELS[1] - EFI_LEVELS[0]
    for k in range(1, 20):
        p = EFI_LEVELS[k]
        # F_ens(q): fraction of ensemble quantile levels below q, linear between them
        below = (qe <= qc[k]).sum(0)  # 0..21 levels at or below the climate quantile
        lo = np.clip(below - 1, 0, 20)
        hi = np.clip(below, 0, 20)
        span = qe[hi, np.arange(qe.shape[1])] - qe[lo, np.arange(qe.shape[1])]
        with np.errstate(invalid="ignore", divide="ignore"):
            frac = np.where(span > 0, (qc[k] - qe[lo, np.arange(qe.shape[1])]) / span, 0.0)
        f_ens = np.where(below == 0, 0.0, np.where(below >= 21, 1.0, EFI_LEVELS[lo] + np.clip(frac, 0, 1) * dp))
        total += (p - f_ens) / np.sqrt(p * (1 - p)) * dp
    return np.clip(2.0 / np.pi * total, -1.0, 1.0).reshape(shape)


def climate_window(
    init_times: np.ndarray,
    target: np.datetime64,
    *,
    month_days: list[tuple[int, int]],
    window: int = 9,
    years_back: int = 18,
) -> np.ndarray:
    """Boolean mask of the init times pooled into the model climate of ``target`` (ENS-10): years
    ``Y - years_back .. Y`` and the ``window`` month-days centred on the target's month-day."""
    import pandas as pd

    times = pd.DatetimeIndex(init_times)
    t = pd.Timestamp(target)
    idx = {md: i for i, md in enumerate(month_days)}
    k = idx[(t.month, t.day)]
    half = window // 2
    near = {month_days[j] for j in range(max(0, k - half), min(len(month_days), k + half + 1))}
    mds = list(zip(times.month, times.day, strict=True))
    return np.array(
        [(md in near) and (t.year - years_back <= y <= t.year) for md, y in zip(mds, times.year, strict=True)]
    )


def eecrps(crps: np.ndarray, efi_field: np.ndarray) -> float:
    """Extreme-event CRPS of one date: mean over points of |EFI| * CRPS (not normalised by sum |EFI|,
    as in ENS-10, so it is smaller than the CRPS)."""
    ok = np.isfinite(crps) & np.isfinite(efi_field)
    return float(np.mean(np.abs(efi_field[ok]) * crps[ok]))


def paired_bootstrap(
    a: np.ndarray, b: np.ndarray, *, n: int = 1000, seed: int = 0, level: float = 0.95
) -> tuple[float, float, float]:
    """Mean of a - b over samples (e.g. per-date scores of a model and the raw ensemble) with a
    percentile bootstrap confidence interval: (mean, low, high)."""
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    d = d[np.isfinite(d)]
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, d.size, size=(n, d.size))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(d.mean()), float(lo), float(hi)
