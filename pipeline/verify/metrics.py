"""Verification as data: metrics and regions as small objects, results as an ``xarray.Dataset``.

WeatherBench 2's ``Metric`` / ``Region`` / ``_metric_and_region_loop`` are the model. A
:class:`Metric` turns one forecast on one lead (a :class:`Chunk`: arrays ``(T, lat, lon)``, members
``(T, M, lat, lon)``) into pointwise *statistics*; :func:`aggregate` averages each statistic over a
:class:`Region` (area weights or none) per date, and the metric's ``finalize`` makes the score
from those means (RMSE = sqrt(mean squared error); spread/skill = a ratio of two means). Per-date
values and the all-dates value come from the same means, so the area-weighted mean is always
``sum_t sum_p w_p s_tp / (T sum_p w_p)``. Adding a metric is one entry in :data:`METRICS`: the
results Dataset, ``metrics.json`` and the report's tables loop over it.

A forecast is a Gaussian (``mu``, ``sigma``: closed forms, the numbers of every release so far), a
predictive distribution of any other family (``dist``: a :class:`Predictive`, numpy in and out; its
CRPS, mean and variance in closed form) or raw members. Tail scores at the
evaluation thresholds (:data:`EVENTS`, per grid point): the Brier score of the event and the
threshold-weighted CRPS (members: chained fair CRPS; a distribution: its quantile ensemble).

Diagnostics beside the scores: the CRPS decomposition of Hersbach (2000) (:func:`hersbach`),
reliability diagrams of tail events at climatological thresholds (:func:`reliability`), PIT and
rank histograms. Formulas: docs/verification.md. numpy/scipy/xarray only (no torch).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from postcast.datasets.core.geo import latitude_weights
from postcast.pipeline.verify import scores
from postcast.pipeline.verify.chunk import ENSEMBLE, PREDICTIVE, Chunk

QUANTILE_EVENTS = ("below_q10", "above_q90")  # y below / above the training climate's 10 / 90 % quantile, per point
THRESHOLD_EVENTS = ("above_t1", "above_t2")  # y above the target's 1st / 2nd threshold (tp24: 1, 10 mm)
EVENTS = QUANTILE_EVENTS + THRESHOLD_EVENTS
WEIGHTINGS = ("none", "area")
PIT_BINS = 10
PROB_BINS = 10
DECOMPOSITION = ("crps", "reliability", "resolution", "uncertainty", "crps_potential")
QUANTILE_MEMBERS = 50  # a Gaussian is decomposed as the ensemble of its 50 quantiles (i - 1/2)/50


# --- regions ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Region:
    """A latitude band; ``weights`` are the area weights (mean 1 on the globe) inside it, 0 outside."""

    name: str
    lat_min: float = -90.0
    lat_max: float = 90.0

    def mask(self, lat: np.ndarray, lon: np.ndarray) -> np.ndarray:
        inside = (lat >= self.lat_min) & (lat <= self.lat_max)  # (lat,)
        return np.repeat(inside[:, None], lon.size, axis=1)  # (lat, lon)

    def weights(self, lat: np.ndarray, lon: np.ndarray, weighting: str) -> np.ndarray:
        w = latitude_weights(lat) if weighting == "area" else np.ones(lat.size)  # (lat,)
        return np.where(self.mask(lat, lon), w[:, None], 0.0)  # (lat, lon)


REGIONS: tuple[Region, ...] = (
    Region("global"),
    Region("n_extratropics", 20.0, 90.0),
    Region("tropics", -20.0, 20.0),
    Region("s_extratropics", -90.0, -20.0),
)


# --- metrics ----------------------------------------------------------------------------------
Stats = dict[str, np.ndarray]


@dataclass(frozen=True)
class Metric:
    """A score: pointwise ``statistics`` of a chunk (each (T, lat, lon)) and ``finalize`` from their
    region means (any shape), for the forecast ``kinds`` it applies to (NaN for the others).

    How it is shown (``results.nc``, ``metrics.json``, the report's tables, all from this registry):
    ``label`` and ``description`` name it, ``units`` says whether it is in the target's units (else
    dimensionless), ``weighted`` adds its area-weighted value to ``metrics.json``
    (``<name>_weighted``) and to the score table (``<label>, area-w.``), ``fmt`` formats its values."""

    name: str
    label: str
    description: str
    statistics: Callable[[Chunk], Stats]
    finalize: Callable[[Stats], np.ndarray] = lambda s: s["value"]
    kinds: tuple[str, ...] = (PREDICTIVE, ENSEMBLE)
    units: bool = True  # False: dimensionless
    weighted: bool = False
    fmt: str = ".4g"
    event: str = ""  # the event of EVENTS a tail score is of ("": none); shown only for targets that have it


def _brier(chunk: Chunk, event: str) -> np.ndarray:
    """(P(event) - 1{event})^2 (T, lat, lon) at the event's thresholds; NaN without them."""
    t = chunk.thresholds.get(event)
    if t is None:
        return np.full(chunk.truth.shape, np.nan)
    above = event.startswith("above")
    happened = (chunk.truth > t) if above else (chunk.truth < t)
    return np.asarray((exceedance(chunk, t, above) - happened) ** 2)


def _twcrps(chunk: Chunk, event: str) -> np.ndarray:
    """twCRPS (T, lat, lon) of one event; NaN without its thresholds."""
    return chunk.tail_scores.get(f"twcrps_{event}", np.full(chunk.truth.shape, np.nan))


def _tail_metrics(event: str) -> tuple[Metric, Metric]:
    """Brier score and twCRPS of one event of EVENTS: y above / below a quantile q of the training climate
    (``above_q90``), or above the target's k-th own threshold (``above_t1``)."""
    side, q = event.split("_")
    op, weight = (">", ">=") if side == "above" else ("<", "<=")
    what = (
        f"the training truth's {q[1:]} % quantile at each point"
        if q.startswith("q")
        else f"the target's threshold {q[1:]} (tp24: 1, 10 mm; ws10: 10, 20 m/s)"
    )
    return (
        Metric(
            f"brier_{event}",
            f"Brier y {op} {q}",
            f"Brier score of P(y {op} t), t {what}",
            lambda c: {"value": _brier(c, event)},
            units=False,
            fmt=".4f",
            event=event,
        ),
        Metric(
            f"twcrps_{event}",
            f"twCRPS y {op} {q}",
            f"threshold-weighted CRPS, weight 1{{z {weight} t}}, "
            f"t {what} (members: fair; a distribution: its quantile ensemble)",
            lambda c: {"value": _twcrps(c, event)},
            weighted=True,
            event=event,
        ),
    )


METRICS: tuple[Metric, ...] = (
    Metric(
        "crps",
        "CRPS",
        "continuous ranked probability score (a family's closed form; members: fair estimator)",
        lambda c: {"value": c.crps},
        weighted=True,
    ),
    Metric(
        "crps_standard",
        "CRPS standard",
        "the members' standard (empirical CDF) CRPS",
        lambda c: {"value": c.ensemble_crps["standard"]},
        kinds=(ENSEMBLE,),
        weighted=True,
    ),
    Metric(
        "eecrps",
        "EECRPS",
        "extreme-event CRPS, |EFI| x CRPS",
        lambda c: {"value": np.abs(c.efi) * c.crps},
        weighted=True,
    ),
    Metric("bias", "bias", "mean of (forecast mean - truth)", lambda c: {"value": c.mean - c.truth}, fmt="+.3g"),
    Metric(
        "rmse",
        "RMSE",
        "root mean squared error of the forecast mean",
        lambda c: {"se": (c.mean - c.truth) ** 2},
        lambda s: np.sqrt(s["se"]),
    ),
    Metric(
        "spread",
        "spread",
        "square root of the mean predictive variance",
        lambda c: {"var": c.variance},
        lambda s: np.sqrt(s["var"]),
    ),
    Metric(
        "spread_skill",
        "spread/skill",
        "spread / RMSE (1 = calibrated)",
        lambda c: {"var": c.variance, "se": (c.mean - c.truth) ** 2},
        lambda s: np.sqrt(s["var"] / s["se"]),
        units=False,
        fmt=".2f",
    ),
    Metric(
        "coverage_80",
        "coverage 80 %",
        "fraction of outcomes inside the central 80 % interval [Q(0.1), Q(0.9)] (0.8 = calibrated)",
        lambda c: {"value": ((c.quantile(0.1) <= c.truth) & (c.truth <= c.quantile(0.9))).astype(np.float64)},
        kinds=(PREDICTIVE,),
        units=False,
        fmt=".3f",
    ),
    *(m for e in EVENTS for m in _tail_metrics(e)),
)


def aggregate(stat: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Per-date weighted spatial means (T,) of a (T, lat, lon) statistic; weights (lat, lon)."""
    return np.asarray(np.tensordot(stat, weights, axes=([1, 2], [0, 1])) / weights.sum())


Means = dict[int, Stats]  # metric index -> statistic -> per-date region means (region, weighting, T)


def chunk_means(chunk: Chunk, lat: np.ndarray, lon: np.ndarray) -> Means:
    """The per-date region means (region, weighting, T) of every statistic of every metric that applies
    to the chunk's kind: what :func:`finalize_means` makes the scores from, concatenated over dates."""
    out: Means = {}
    weights = [[r.weights(lat, lon, w) for w in WEIGHTINGS] for r in REGIONS]  # (lat, lon) each
    for i, metric in enumerate(METRICS):
        if chunk.kind not in metric.kinds:
            continue
        stats = metric.statistics(chunk)
        out[i] = {name: np.stack([[aggregate(s, w) for w in ws] for ws in weights]) for name, s in stats.items()}
    return out


def finalize_means(means: Means) -> tuple[np.ndarray, np.ndarray]:
    """Scores from the per-date means (:func:`chunk_means`) of all dates: (metric, region, weighting) over
    all dates and per date (metric, region, weighting, T). NaN where a metric does not apply."""
    t = next(iter(next(iter(means.values())).values())).shape[-1]
    total = np.full((len(METRICS), len(REGIONS), len(WEIGHTINGS)), np.nan)
    per_date = np.full((*total.shape, t), np.nan)
    for i, stats in means.items():
        finalize = METRICS[i].finalize
        for j, k in np.ndindex(len(REGIONS), len(WEIGHTINGS)):
            m = {name: s[j, k] for name, s in stats.items()}  # each (T,)
            with np.errstate(invalid="ignore", divide="ignore"):  # 0/0 (a perfect forecast): NaN
                per_date[i, j, k] = finalize(m)
                total[i, j, k] = finalize({n: v.mean(keepdims=True) for n, v in m.items()})[0]
    return total, per_date


def score_chunk(chunk: Chunk, lat: np.ndarray, lon: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every metric on every region and weighting: (metric, region, weighting) over all dates, and
    per date (metric, region, weighting, T). NaN where a metric does not apply."""
    return finalize_means(chunk_means(chunk, lat, lon))


# --- diagnostics ------------------------------------------------------------------------------
def hersbach_sums(sorted_x: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The additive part of the Hersbach (2000) decomposition over K cases, (2 (N + 1) + 3,): the weighted
    sums of the bin widths alpha_i (part of bin i below the outcome) and beta_i (above), of 1{y < x_1} and
    1{y > x_N}, and of the weights. ``sorted_x`` (K, N) sorted members, ``y`` (K,), ``w`` (K,) case weights.
    Sums of disjoint sets of cases add up (:func:`hersbach_terms` makes the components)."""
    k, n = sorted_x.shape
    lo, hi = sorted_x[:, :-1], sorted_x[:, 1:]  # (K, N-1)
    alpha = np.zeros((k, n + 1))
    beta = np.zeros((k, n + 1))
    alpha[:, 1:n] = np.clip(y[:, None] - lo, 0.0, hi - lo)
    beta[:, 1:n] = np.clip(hi - y[:, None], 0.0, hi - lo)
    beta[:, 0] = np.maximum(sorted_x[:, 0] - y, 0.0)
    alpha[:, n] = np.maximum(y - sorted_x[:, -1], 0.0)
    outliers = [w @ (y < sorted_x[:, 0]), w @ (y > sorted_x[:, -1]), w.sum()]
    return np.concatenate([w @ alpha, w @ beta, outliers])


def hersbach_terms(sums: np.ndarray, uncertainty: float) -> dict[str, float]:
    """CRPS = reliability - resolution + uncertainty from :func:`hersbach_sums` of all cases and the
    CRPS of the outcomes' weighted climatology: with a, b the bin widths averaged over cases,
    g_i = a_i + b_i, o_i = b_i / g_i (outliers: o_0 = freq(y < x_1), 1 - o_N = freq(y > x_N));
    reliability = sum g_i (o_i - p_i)^2, CRPS_pot = sum g_i o_i (1 - o_i), p_i = i/N; resolution =
    uncertainty - CRPS_pot."""
    n = (sums.size - 3) // 2 - 1
    total = sums[-1]
    a, b = sums[: n + 1] / total, sums[n + 1 : 2 * n + 2] / total  # (N+1,)
    p = np.arange(n + 1) / n
    crps = float((a * p**2 + b * (1 - p) ** 2).sum())
    g = a + b
    with np.errstate(invalid="ignore", divide="ignore"):
        o = np.where(g > 0, b / g, 0.0)
    o[0] = sums[-3] / total
    o[n] = 1.0 - sums[-2] / total
    g[0] = b[0] / o[0] if o[0] > 0 else 0.0
    g[n] = a[n] / (1 - o[n]) if o[n] < 1 else 0.0
    reli = float((g * (o - p) ** 2).sum())
    pot = float((g * o * (1 - o)).sum())
    unc = uncertainty
    return {"crps": crps, "reliability": reli, "resolution": unc - pot, "uncertainty": unc, "crps_potential": pot}


def hersbach(sorted_x: np.ndarray, y: np.ndarray, w: np.ndarray) -> dict[str, float]:
    """CRPS = reliability - resolution + uncertainty (Hersbach 2000) of the standard ensemble CRPS of
    K cases: ``sorted_x`` (K, N) sorted members, ``y`` (K,), ``w`` (K,) case weights; uncertainty =
    the CRPS of the outcomes' (weighted) climatology."""
    return hersbach_terms(hersbach_sums(sorted_x, y, w), climatological_crps(y, w))


ValueWeights = tuple[np.ndarray, np.ndarray]  # distinct values, sorted; the total weight of each


def value_weights(y: np.ndarray, w: np.ndarray) -> ValueWeights:
    """The weighted sample of ``y`` as its distinct values (sorted) and the summed weight of each: what
    the climatological CRPS needs, mergeable (:func:`merge_value_weights`), and no larger than the
    number of distinct values (a float32 truth has a bounded number in its range)."""
    values, inverse = np.unique(y, return_inverse=True)
    return values, np.bincount(inverse.reshape(-1), w.reshape(-1), values.size)


def merge_value_weights(a: ValueWeights, b: ValueWeights) -> ValueWeights:
    return value_weights(np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1]]))


def climatological_crps(y: np.ndarray, w: np.ndarray) -> float:
    """Mean CRPS of the weighted sample climatology of y (:func:`sample_crps`)."""
    return sample_crps(value_weights(y, w))


def sample_crps(sample: ValueWeights) -> float:
    """Mean CRPS of a weighted sample's climatology: 1/2 sum_kl w_k w_l |y_k - y_l| (w sums to 1), from
    sorted y: sum_k w_k y_(k) (C_{k-1} - (1 - C_k)), C the cumulative weights (tied values merged: the
    sum is the same)."""
    ys, w = sample
    ws = w / w.sum()
    c = np.cumsum(ws)
    return float((ws * ys * (c - ws - (1.0 - c))).sum())


DECOMPOSITION_BLOCK = 1 << 15  # cases per block of the decomposition sums: (block, N + 1) float64 temporaries


def sorted_ensembles(chunk: Chunk) -> Callable[[int], np.ndarray]:
    """date t -> the sorted ensemble (N, lat, lon) the decomposition scores on that date: the members, or a
    Gaussian's or another family's QUANTILE_MEMBERS quantile ensemble (levels (i - 1/2)/N)."""
    if chunk.members is not None:
        return lambda t: chunk.sorted_members[t]
    levels = (np.arange(QUANTILE_MEMBERS) + 0.5) / QUANTILE_MEMBERS
    xs = np.stack([chunk.quantile(tau) for tau in levels], axis=1)  # (T, N, lat, lon)
    return lambda t: xs[t]


def decomposition_sums(chunk: Chunk, lat: np.ndarray, lon: np.ndarray) -> np.ndarray:
    """:func:`hersbach_sums` of every region (region, 2 (N + 1) + 3), area weighted, over the chunk's dates
    and points, a date and a block of points at a time."""
    ensemble = sorted_ensembles(chunk)
    out = []
    for region in REGIONS:
        idx = np.flatnonzero(region.mask(lat, lon).reshape(-1))  # (P,)
        w = region.weights(lat, lon, "area").reshape(-1)[idx]
        sums = []
        for t in range(chunk.truth.shape[0]):
            xs = ensemble(t).reshape(-1, lat.size * lon.size)  # (N, lat * lon)
            y = chunk.truth[t].reshape(-1)
            for s in range(0, idx.size, DECOMPOSITION_BLOCK):
                block = idx[s : s + DECOMPOSITION_BLOCK]
                sums.append(hersbach_sums(xs[:, block].T, y[block], w[s : s + DECOMPOSITION_BLOCK]))
        out.append(np.sum(sums, axis=0))
    return np.stack(out)


def region_samples(truth: np.ndarray, lat: np.ndarray, lon: np.ndarray) -> list[ValueWeights]:
    """The area-weighted sample of the outcomes (T, lat, lon) in each region (:func:`value_weights`)."""
    out = []
    for region in REGIONS:
        mask = region.mask(lat, lon)
        w = np.broadcast_to(region.weights(lat, lon, "area")[mask], (truth.shape[0], int(mask.sum())))
        out.append(value_weights(truth[:, mask], w))
    return out


def decomposition(chunk: Chunk, region: Region, lat: np.ndarray, lon: np.ndarray) -> np.ndarray:
    """Hersbach components (DECOMPOSITION order) over all dates and points of ``region``, area
    weighted; a Gaussian or another family as its QUANTILE_MEMBERS quantile ensemble."""
    j = REGIONS.index(region)
    parts = hersbach_terms(
        decomposition_sums(chunk, lat, lon)[j], sample_crps(region_samples(chunk.truth, lat, lon)[j])
    )
    return np.array([parts[c] for c in DECOMPOSITION])


def exceedance(chunk: Chunk, threshold: np.ndarray, above: bool) -> np.ndarray:
    """Forecast probability (T, lat, lon) of y > threshold (above) or y < threshold (lat, lon)."""
    if chunk.dist is not None:
        return chunk.dist.sf(threshold) if above else chunk.dist.cdf_left(threshold)
    assert chunk.members is not None
    p_below = (chunk.members < threshold).mean(axis=1)
    return np.asarray(1.0 - p_below if above else p_below)


def reliability_sums(prob: np.ndarray, event: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Per probability bin (4, PROB_BINS): the summed weights, the weighted sums of the forecast probabilities
    and of the outcomes, and the count of cases; additive over cases (:func:`reliability_rows`)."""
    b = np.minimum((prob * PROB_BINS).astype(int), PROB_BINS - 1).reshape(-1)
    ww = np.broadcast_to(w, prob.shape).reshape(-1)
    return np.stack(
        [
            np.bincount(b, ww, PROB_BINS),
            np.bincount(b, ww * prob.reshape(-1), PROB_BINS),
            np.bincount(b, ww * event.reshape(-1), PROB_BINS),
            np.bincount(b, minlength=PROB_BINS).astype(float),
        ]
    )


def reliability_rows(sums: np.ndarray) -> np.ndarray:
    """Reliability diagram rows (3, PROB_BINS) from :func:`reliability_sums`: weighted mean forecast
    probability, weighted observed frequency and the count of cases per bin (NaN for empty bins)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.stack([sums[1] / sums[0], sums[2] / sums[0], sums[3]])


def reliability(prob: np.ndarray, event: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Reliability diagram rows (3, PROB_BINS): weighted mean forecast probability, weighted
    observed frequency and the count of cases per probability bin (NaN for empty bins)."""
    return reliability_rows(reliability_sums(prob, event, w))


def pit(chunk: Chunk, seed: int = 0, skip: int = 0) -> np.ndarray:
    """PIT values (T, lat, lon) of a distribution (at a point mass a uniform draw in [F(y-), F(y)], the
    draws of the generator seeded ``seed`` after its first ``skip``: a chunk of dates starting at date d
    of a split skips d * lat * lon); randomised rank / M for an ensemble is the rank histogram."""
    assert chunk.dist is not None
    u = scores.generator_after(seed, skip).uniform(size=chunk.truth.shape)
    low, high = chunk.dist.cdf_left(chunk.truth), chunk.dist.cdf(chunk.truth)
    return np.asarray(low + u * (high - low))
