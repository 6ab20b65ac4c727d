"""One forecast on one lead as scoring sees it: :class:`Chunk` holds the truth and the raw members or a predictive
distribution of any family (:class:`Predictive`; the Gaussian of a mean and spread is :class:`GaussianForecast`),
and computes each score, quantile and exceedance probability once."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Protocol

import numpy as np

from postcast.datasets import laws
from postcast.pipeline.verify import scores

PREDICTIVE, ENSEMBLE = "predictive", "ensemble"  # the kinds of forecast: a distribution, or members
TAIL_LEVELS = 400  # quantile levels (i - 1/2)/n of a distribution's twCRPS


# --- one forecast on one lead -----------------------------------------------------------------
class Predictive(Protocol):
    """A predictive distribution, parameters of shape S = (T, lat, lon), numpy float64 in and out
    (``postcast.pipeline.verify.forecasts.FamilyForecast`` wraps ``postcast.models.distributions``)."""

    @property
    def name(self) -> str: ...

    def crps(self, y: np.ndarray) -> np.ndarray: ...  # closed form at outcomes y (S)

    def twcrps_above(self, t: np.ndarray, y: np.ndarray) -> np.ndarray | None: ...  # closed form, weight 1{z >= t}

    def cdf(self, x: np.ndarray) -> np.ndarray: ...  # P(Y <= x), x broadcastable to S

    def cdf_left(self, x: np.ndarray) -> np.ndarray: ...  # P(Y < x)

    def sf(self, x: np.ndarray) -> np.ndarray: ...  # P(Y > x)

    def quantile(self, tau: float) -> np.ndarray: ...  # Q(tau), (S)

    def quantile_where(self, tau: float, mask: np.ndarray) -> np.ndarray: ...  # Q(tau) where mask (S bool): (N,)

    def moments(self) -> tuple[np.ndarray, np.ndarray]: ...  # (mean, std), each (S)


@dataclass(frozen=True)
class GaussianForecast:
    """N(mu, sigma^2), ``mu`` and ``sigma`` of shape S = (T, lat, lon), as a :class:`Predictive` in float64 numpy:
    the raw ensemble's (its members' mean and spread), the oracle's and a Gaussian checkpoint's. Its CRPS is the
    closed form of :func:`postcast.pipeline.verify.scores.crps_gaussian`, its cdf and quantiles the law's
    (:mod:`postcast.datasets.laws`); a continuous law, so P(Y < x) = P(Y <= x)."""

    mu: np.ndarray
    sigma: np.ndarray

    name = laws.Gaussian.name

    @property
    def params(self) -> laws.Params:
        return {"mu": self.mu, "sigma": self.sigma}

    def crps(self, y: np.ndarray) -> np.ndarray:
        return scores.crps_gaussian(self.mu, self.sigma, y)

    def twcrps_above(self, t: np.ndarray, y: np.ndarray) -> None:
        """None: the quantiles of a Gaussian are cheap (:meth:`Chunk.quantile_twcrps` scores its tails)."""
        return None

    def cdf(self, x: np.ndarray) -> np.ndarray:
        return laws.get(self.name).cdf(self.params, x)

    def cdf_left(self, x: np.ndarray) -> np.ndarray:
        return self.cdf(x)

    def sf(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(1.0 - self.cdf(x))

    def quantile(self, tau: float) -> np.ndarray:
        return laws.get(self.name).quantile(self.params, tau)

    def quantile_where(self, tau: float, mask: np.ndarray) -> np.ndarray:
        return laws.get(self.name).quantile({"mu": self.mu[mask], "sigma": self.sigma[mask]}, tau)

    def moments(self) -> tuple[np.ndarray, np.ndarray]:
        return self.mu, self.sigma


def _chain(event: str, x: np.ndarray, t: np.ndarray) -> np.ndarray:
    """The chaining of the twCRPS: max(x, t) for an upper-tail event (weight 1{z >= t}), else min(x, t)."""
    return np.maximum(x, t) if event.startswith("above") else np.minimum(x, t)


@dataclass
class Chunk:
    """One forecast against the truth on one lead: a predictive distribution ``dist`` of any family, or an
    ensemble's ``members`` (T, M, lat, lon). ``efi`` (T, lat, lon) weights the extreme-event
    CRPS; ``thresholds`` (event of :data:`EVENTS` -> (lat, lon)) define the tail scores."""

    truth: np.ndarray  # (T, lat, lon)
    efi: np.ndarray  # (T, lat, lon), in [-1, 1]
    members: np.ndarray | None = None
    dist: Predictive | None = None
    thresholds: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return ENSEMBLE if self.members is not None else PREDICTIVE

    def quantile(self, tau: float) -> np.ndarray:
        """Q(tau) (T, lat, lon) of the distribution."""
        assert self.dist is not None
        return self.dist.quantile(tau)

    def _tail_quantiles(self, thresholds: dict[str, np.ndarray]) -> Callable[[float], np.ndarray]:
        """tau -> Q(tau) (T, lat, lon) where some event's chaining can tell it apart, else a stand-in of the same
        chained value. With t_hi the lowest upper-event threshold and t_lo the highest lower-event one, a level
        with F_left(t_lo) < tau <= F(t_hi) has t_lo <= Q(tau) <= t_hi, chained to each event's own threshold,
        as is t_hi (or t_lo): a distribution's costly quantile (the CSG's gammaincinv) is computed only for
        levels in a tail, several times fewer for a rain forecast."""
        assert self.dist is not None
        dist, shape = self.dist, self.truth.shape
        above = [t for e, t in thresholds.items() if e.startswith("above")]
        below = [t for e, t in thresholds.items() if not e.startswith("above")]
        t_hi = np.broadcast_to(np.min(above, axis=0), shape) if above else np.full(shape, np.inf)
        t_lo = np.broadcast_to(np.max(below, axis=0), shape) if below else np.full(shape, -np.inf)
        f_hi = dist.cdf(t_hi) if above else np.ones(shape)
        f_lo = dist.cdf_left(t_lo) if below else np.zeros(shape)
        stand_in = np.where(np.isfinite(t_hi), t_hi, t_lo)
        unknown = ~(np.isfinite(f_hi) & np.isfinite(f_lo))  # NaN parameters or thresholds: the quantile says so

        def quantile(tau: float) -> np.ndarray:
            need = (tau > f_hi) | (tau <= f_lo) | unknown
            q = stand_in.copy()
            if need.any():
                q[need] = dist.quantile_where(tau, need)
            return q

        return quantile

    def quantile_twcrps(self, thresholds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One pass over the TAIL_LEVELS levels tau_i = (i - 1/2)/n of a distribution's quantiles q_i
        (T, lat, lon): per event of ``thresholds`` the twCRPS 2/n sum_i rho_tau_i(v(y) - v(q_i)), v the chaining
        (:func:`_chain`), rho the pinball loss: the CRPS of the chained quantile ensemble."""
        if not thresholds:
            return {}
        n = TAIL_LEVELS
        tw = {e: np.zeros_like(self.truth) for e in thresholds}
        ys = {e: _chain(e, self.truth, t) for e, t in thresholds.items()}
        tail_quantile = self._tail_quantiles(thresholds)
        for tau in (np.arange(n) + 0.5) / n:
            q = tail_quantile(float(tau))
            for e, t in thresholds.items():
                d = ys[e] - _chain(e, q, t)
                tw[e] += d * (tau - (d < 0))
        return {e: 2.0 * v / n for e, v in tw.items()}

    def distribution_twcrps(self) -> dict[str, np.ndarray]:
        """twCRPS (T, lat, lon) per event of a distribution: in closed form where its family has one for the
        event (:meth:`Predictive.twcrps_above`: the censored families' upper tails, exact, where the CSG's
        quantiles cost a root-finder each), else by :meth:`quantile_twcrps`."""
        assert self.dist is not None
        exact = {
            e: closed
            for e, t in self.thresholds.items()
            if e.startswith("above") and (closed := self.dist.twcrps_above(t, self.truth)) is not None
        }
        rest = self.quantile_twcrps({e: t for e, t in self.thresholds.items() if e not in exact})
        return {f"twcrps_{e}": (exact | rest)[e] for e in self.thresholds}

    @cached_property
    def tail_scores(self) -> dict[str, np.ndarray]:
        """twCRPS (T, lat, lon) per event, as ``twcrps_<event>``: members, the chained fair CRPS
        (:func:`postcast.pipeline.verify.scores.twcrps_ensemble`; below: of the negated values); a
        distribution, :meth:`distribution_twcrps`."""
        if not self.thresholds:
            return {}
        if self.members is None:
            return self.distribution_twcrps()
        out = {}
        for e, t in self.thresholds.items():
            sign = 1.0 if e.startswith("above") else -1.0
            out[f"twcrps_{e}"] = scores.twcrps_ensemble(sign * self.members, sign * self.truth, sign * t, axis=1)
        return out

    @cached_property
    def sorted_members(self) -> np.ndarray:
        """Members sorted along the member axis, (T, M, lat, lon): one sort, reused."""
        assert self.members is not None
        return np.sort(self.members, axis=1)

    @cached_property
    def ensemble_crps(self) -> dict[str, np.ndarray]:
        """Fair and standard ensemble CRPS (T, lat, lon) from one pass over the members."""
        assert self.members is not None
        x = np.moveaxis(self.members, 1, -1)  # (T, lat, lon, M)
        if not scores.numba_pays(x.size):  # the numpy kernel, once per estimator
            return {e: scores.crps_ensemble(x, self.truth, estimator=e) for e in ("fair", "standard")}
        fair, std = scores.crps_ensemble_pair(x.reshape(-1, x.shape[-1]), self.truth.reshape(-1))
        return {"fair": fair.reshape(self.truth.shape), "standard": std.reshape(self.truth.shape)}

    @cached_property
    def crps(self) -> np.ndarray:
        """The family's closed form, or the fair ensemble CRPS (T, lat, lon)."""
        if self.dist is not None:
            return self.dist.crps(self.truth)
        return self.ensemble_crps["fair"]

    @cached_property
    def mean(self) -> np.ndarray:
        if self.dist is not None:
            return self.dist.moments()[0]
        assert self.members is not None
        return np.asarray(self.members.mean(axis=1))

    @cached_property
    def variance(self) -> np.ndarray:
        """Predictive variance whose mean equals E[(mean - y)^2] for a calibrated forecast:
        the distribution's, in closed form; or (M + 1)/M times the unbiased member variance
        (Fortin et al. 2014)."""
        if self.dist is not None:
            return np.asarray(self.dist.moments()[1] ** 2)
        assert self.members is not None
        m = self.members.shape[1]
        return np.asarray((m + 1) / m * self.members.var(axis=1, ddof=1))
