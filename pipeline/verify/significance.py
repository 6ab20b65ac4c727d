"""Significance of paired score differences d_t = S_A(t) - S_B(t) over init dates.

* :func:`diebold_mariano`: mean(d) / sqrt(var_HAC(d) / T), the long-run variance from statsmodels'
  Newey-West (Bartlett kernel) HAC covariance of an OLS of d on a constant, with the
  Harvey-Leybourne-Newbold (1997) small-sample factor sqrt((T + 1 - 2h + h (h - 1) / T) / T) and a
  Student-t reference with T - 1 degrees of freedom (h - 1 = the HAC lag).
* :func:`stationary_bootstrap`: a percentile interval of mean(d) from arch's stationary bootstrap
  (Politis and Romano 1994), the mean block length from ``arch.bootstrap.optimal_block_length``
  (Politis and White 2004) with 16 or more dates, else T^(1/3) (at least 1), so autocorrelated
  dates are resampled in runs.

WeatherBench-X's statistical inference is the model; nothing here is written by hand that these
libraries do.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

LEVEL = 0.95
MIN_DATES_FOR_BLOCK_ESTIMATE = 16


@dataclass(frozen=True)
class Paired:
    """A paired comparison: mean difference, its bootstrap interval and the DM p-value."""

    mean: float
    low: float
    high: float
    p_value: float

    @property
    def significant(self) -> bool:
        """Significant at 95 %: the DM p-value below 0.05."""
        return bool(self.p_value < 1 - LEVEL)


def hac_lag(t: int) -> int:
    """Newey-West's rule of thumb for the Bartlett lag: floor(4 (T / 100)^(2/9))."""
    return int(np.floor(4 * (t / 100.0) ** (2.0 / 9.0)))


def diebold_mariano(d: np.ndarray, lag: int | None = None) -> float:
    """Two-sided p-value of mean(d) = 0 (DM with HAC variance and the HLN correction)."""
    import statsmodels.api as sm

    d = np.asarray(d, dtype=np.float64)
    d = d[np.isfinite(d)]
    t = d.size
    if t < 3:
        return float("nan")
    if np.ptp(d) == 0:  # no variance: zero difference is no evidence, a constant non-zero one is certain
        return 1.0 if d[0] == 0 else 0.0
    lag = hac_lag(t) if lag is None else lag
    fit = sm.OLS(d, np.ones(t)).fit(cov_type="HAC", cov_kwds={"maxlags": lag, "use_correction": False})
    h = lag + 1
    dm = float(fit.tvalues[0]) * np.sqrt((t + 1 - 2 * h + h * (h - 1) / t) / t)
    return float(2 * stats.t.sf(abs(dm), df=t - 1))


def stationary_bootstrap(d: np.ndarray, n: int = 1000, seed: int = 0) -> tuple[float, float]:
    """95 % percentile interval of mean(d) from arch's stationary bootstrap."""
    from arch.bootstrap import StationaryBootstrap, optimal_block_length

    d = np.asarray(d, dtype=np.float64)
    d = d[np.isfinite(d)]
    if d.size < 3 or np.ptp(d) == 0:
        return float(d.mean()), float(d.mean())
    block = d.size ** (1 / 3)  # the usual rate; Politis-White's estimate once there are enough dates
    if d.size >= MIN_DATES_FOR_BLOCK_ESTIMATE:
        with np.errstate(all="ignore"):
            estimate = float(optimal_block_length(d)["stationary"].iloc[0])
        block = estimate if np.isfinite(estimate) else block
    block = max(1.0, block)
    bs = StationaryBootstrap(block, d, seed=np.random.default_rng(seed))
    ci = bs.conf_int(np.mean, reps=n, method="percentile", size=LEVEL)
    return float(ci[0, 0]), float(ci[1, 0])


def paired(a: np.ndarray, b: np.ndarray, n: int = 1000, seed: int = 0) -> Paired:
    """Per-date scores of A and B (T,): mean(A - B), bootstrap interval and DM p-value."""
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    d = d[np.isfinite(d)]
    if d.size == 0:
        return Paired(float("nan"), float("nan"), float("nan"), float("nan"))
    low, high = stationary_bootstrap(d, n, seed)
    return Paired(float(d.mean()), low, high, diebold_mariano(d))
