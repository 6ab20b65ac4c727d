"""Predictive distribution families, the torch side: the closed-form CRPS (the training loss), the log
score, and the head that maps a network's raw outputs to valid parameters.

The law itself (its parameters, units, moments, cdf, survival function and quantiles, on numpy arrays)
lives in :mod:`postcast.datasets.laws`, which every layer reads; here each family is a frozen dataclass of
parameter tensors (all one shape S, e.g. (B, H, W)) whose fields are the law's parameter names
(:func:`register` checks them against :mod:`postcast.datasets.laws`); :func:`get` and :func:`names` look
them up. ``from_raw(raw, m, s)`` builds one from the network's unconstrained outputs ``raw`` (*S, K)
(``K = n_raw``) and the raw ensemble's mean ``m`` and (floored) std ``s``, spread-relative like the
Gaussian head: all raw outputs at zero give a distribution close to the raw ensemble. Formulas and
references: docs/distributions.md.

Families: ``gaussian``, ``truncnormal`` (normal truncated to [0, inf), wind speed), ``clogistic``
(logistic censored at 0: a point mass P(Y = 0), precipitation), ``csg`` (censored shifted gamma,
Scheuerer and Hamill 2015, precipitation), ``bernstein`` (a monotone Bernstein-polynomial quantile
function, Bremnes 2020). Except for the Gaussian (which keeps the fused kernel the models trained
with so far), scores are computed in float64 and returned in the input dtype: the truncated normal
cancels in float32 far below 0 and the incomplete gamma is coarse in float32.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar, TypeVar

import numpy as np
import torch
import torch.nn.functional as F

from postcast.datasets import laws
from postcast.datasets.core.errors import ConfigError
from postcast.models import kernels
from postcast.models.special import HALF_LOG_2PI, SQRT2, gammainc, k_beta_half, mills, softplus, x_gamma_density

SQRT_PI = math.sqrt(math.pi)
BERNSTEIN_DEGREE = 12


class Distribution(ABC):
    """A batch of predictive distributions; every method is elementwise over the parameter shape S."""

    name: ClassVar[str]
    n_raw: ClassVar[int]  # raw network outputs per point
    # what the local EMOS fit holds per (point, date) sample of this family (models/emos_bands.py): float64 data,
    # autograd's saved tensors, the gradient in the raw outputs and the Hessian's K columns of it; peak RSS
    # measured with 0.2 M samples (1,000 points, 200 dates): gaussian 620, clogistic 570, truncnormal 940, csg
    # 2,820 bytes (the shifted gamma's CRPS saves most); the csg's sh form 2,965 bytes (the targets world's tp24,
    # its peak RSS's growth from 300 to 1,200 points of 128 dates); a family not measured: 4,096
    fit_bytes_per_sample: ClassVar[int] = 4096

    @classmethod
    @abstractmethod
    def from_raw(cls, raw: torch.Tensor, m: torch.Tensor, s: torch.Tensor) -> Distribution:
        """Valid parameters from unconstrained outputs raw (*S, K), ensemble mean m (*S), std s (*S) > 0."""

    @abstractmethod
    def crps(self, y: torch.Tensor) -> torch.Tensor:
        """Closed-form CRPS at outcomes y (*S), units of y; differentiable in the parameters and y."""

    @abstractmethod
    def log_score(self, y: torch.Tensor) -> torch.Tensor:
        """-log density at y (*S) (for a point mass at 0: -log P(Y = 0) at y = 0)."""

    def raised(self, floor: torch.Tensor) -> Distribution | None:
        """The law of max(Y, floor) - floor, floor >= 0 (*S), where it is one of this family, else None. For a
        law censored at 0, Y = max(0, X), it is X moved down by the floor and censored at 0 again: the twCRPS of
        weight 1{z >= t} is then this law's CRPS at max(y, t) - t (t >= 0; the CRPS does not change when law and
        outcome move together), a closed form where the quantiles would take a root-finder per level."""
        return None

    def select(self, mask: torch.Tensor) -> Distribution:
        """The distributions where ``mask`` (boolean, shape S) holds: parameters (N,) (Bernstein: (N, d + 1))."""
        return type(self)(**{k: v[mask] for k, v in self.params.items()})

    @property
    def law(self) -> laws.Family:
        """The law of this family on numpy arrays: parameters, moments, cdf, survival function, quantiles."""
        return laws.get(self.name)

    @property
    def params(self) -> dict[str, torch.Tensor]:
        """The parameter tensors by name, in the law's order."""
        return {name: getattr(self, name) for name in self.law.names}

    def numpy_params(self) -> laws.Params:
        """The parameters as the law reads them: float64 numpy, a vector parameter's axis first ((K, *S))."""
        out = {}
        for name, v in self.params.items():
            a = v.detach().cpu().double().numpy()
            out[name] = np.moveaxis(a, -1, 0) if self.law.parameter(name).vector else a
        return out

    @property
    def dtype(self) -> torch.dtype:
        return next(iter(self.params.values())).dtype

    @property
    def device(self) -> torch.device:
        return next(iter(self.params.values())).device


_FAMILIES: dict[str, type[Distribution]] = {}
D = TypeVar("D", bound=type[Distribution])


def register(name: str, n_raw: int) -> Callable[[D], D]:
    """Class decorator: the torch side of the law ``name`` (:mod:`postcast.datasets.laws`) with ``n_raw``
    network outputs per point; its dataclass fields must be the law's parameters, in order."""

    def deco(cls: D) -> D:
        declared = tuple(f.name for f in fields(cls))  # type: ignore[arg-type]
        if declared != laws.get(name).names:
            msg = f"{cls.__name__}: fields {declared}, the law {name!r} has the parameters {laws.get(name).names}"
            raise TypeError(msg)
        cls.name, cls.n_raw = name, n_raw
        _FAMILIES[name] = cls
        return cls

    return deco


def names() -> list[str]:
    return sorted(_FAMILIES)


def get(name: str) -> type[Distribution]:
    """The family ``name``; :class:`~postcast.datasets.core.errors.ConfigError` naming the families otherwise."""
    if name not in _FAMILIES:
        msg = f"model.distribution {name!r}: choose one of {names()}"
        raise ConfigError(msg)
    return _FAMILIES[name]


def _float64(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """Run a score in float64 (parameters and argument upcast), returning the argument's dtype."""

    def wrapped(self: Distribution, y: torch.Tensor) -> torch.Tensor:
        up = type(self)(**{k: v.double() for k, v in self.params.items()})
        return fn(up, y.double()).to(y.dtype)

    wrapped.__doc__, wrapped.__name__ = fn.__doc__, fn.__name__
    return wrapped


def _censored(fn: Callable[[Any, torch.Tensor], torch.Tensor]) -> Callable[[Any, torch.Tensor], torch.Tensor]:
    """CRPS of a law on [0, inf) at any y: an outcome y < 0 adds |y| to the CRPS at 0 (F = 0 below 0)."""

    def wrapped(self: Any, y: torch.Tensor) -> torch.Tensor:
        return fn(self, y.clamp_min(0.0)) + F.relu(-y)

    wrapped.__doc__, wrapped.__name__ = fn.__doc__, fn.__name__
    return wrapped


def _bisect(
    fn: Callable[[torch.Tensor], torch.Tensor], lo: torch.Tensor, hi: torch.Tensor, iters: int = 64
) -> torch.Tensor:
    """Root of an increasing fn on [lo, hi] (elementwise, no gradient): the midpoint after ``iters`` halvings."""
    with torch.no_grad():
        for _ in range(iters):
            mid = 0.5 * (lo + hi)
            below = fn(mid) < 0
            lo, hi = torch.where(below, mid, lo), torch.where(below, hi, mid)
        return 0.5 * (lo + hi)


# --- Gaussian -----------------------------------------------------------------------------------
@register("gaussian", n_raw=2)
@dataclass(frozen=True)
class Gaussian(Distribution):
    """N(mu, sigma^2); head: mu = m + s a, sigma = s exp(b) (the ENS-10 head)."""

    fit_bytes_per_sample = 768

    mu: torch.Tensor
    sigma: torch.Tensor

    @classmethod
    def from_raw(cls, raw: torch.Tensor, m: torch.Tensor, s: torch.Tensor) -> Gaussian:
        return cls(m + s * raw[..., 0], s * torch.exp(raw[..., 1]))

    def crps(self, y: torch.Tensor) -> torch.Tensor:
        return kernels.crps_gaussian(self.mu, self.sigma, y)

    def log_score(self, y: torch.Tensor) -> torch.Tensor:
        z = (y - self.mu) / self.sigma
        return torch.log(self.sigma) + 0.5 * z * z + HALF_LOG_2PI


# --- truncated normal ---------------------------------------------------------------------------
def _tn_crps_std(t: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """CRPS / sigma of N(mu, sigma) truncated to [0, inf) at y >= 0, from t = y / sigma and a = mu / sigma.

    a >= 0: the textbook form (p = Phi(a) >= 1/2, z = t - a). a < 0 (b = -a): every ratio of normal
    tails as a ratio of Mills ratios, R = 1 / M(b), E = phi(z) / phi(b) = exp(-t (t + 2b) / 2):
    CRPS / sigma = z + 2 E R (1 - z M(z)) - sqrt(2) R^2 M(sqrt(2) b), finite for every b."""
    ap, b = a.clamp_min(0.0), (-a).clamp_min(0.0)  # each branch on inputs valid for it (no NaN gradients)
    z = t - ap  # (*S)
    p = torch.special.ndtr(ap)
    pdf = torch.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    textbook = (z * (p - 2.0 * torch.special.ndtr(-z)) + 2.0 * pdf - torch.special.ndtr(SQRT2 * ap) / (SQRT_PI * p)) / p
    zb = t + b  # >= b >= 0
    r = 1.0 / mills(b)
    e = torch.exp(-0.5 * t * (t + 2.0 * b))
    scaled = zb + 2.0 * e * r * (1.0 - zb * mills(zb)) - SQRT2 * r * r * mills(SQRT2 * b)
    return torch.where(a >= 0, textbook, scaled)


@register("truncnormal", n_raw=2)
@dataclass(frozen=True)
class TruncNormal(Distribution):
    """N(mu, sigma^2) truncated to [0, inf) (wind speed); head: mu = m + s a, sigma = s exp(b)."""

    fit_bytes_per_sample = 1152

    mu: torch.Tensor
    sigma: torch.Tensor

    @classmethod
    def from_raw(cls, raw: torch.Tensor, m: torch.Tensor, s: torch.Tensor) -> TruncNormal:
        return cls(m + s * raw[..., 0], s * torch.exp(raw[..., 1]))

    @_float64
    @_censored
    def crps(self, y: torch.Tensor) -> torch.Tensor:
        return self.sigma * _tn_crps_std(y / self.sigma, self.mu / self.sigma)

    def log_score(self, y: torch.Tensor) -> torch.Tensor:
        z = (y - self.mu) / self.sigma
        dens = torch.log(self.sigma) + 0.5 * z * z + HALF_LOG_2PI + torch.special.log_ndtr(self.mu / self.sigma)
        return torch.where(y >= 0, dens, torch.inf)


# --- censored logistic --------------------------------------------------------------------------
@register("clogistic", n_raw=2)
@dataclass(frozen=True)
class CensoredLogistic(Distribution):
    """Logistic(loc, scale) censored at 0: Y = max(0, X), P(Y = 0) = F_X(0) (precipitation).
    Head: loc = m + s a, scale = s exp(b) sqrt(3) / pi (the logistic with std s at a = b = 0)."""

    fit_bytes_per_sample = 768

    loc: torch.Tensor
    scale: torch.Tensor

    @classmethod
    def from_raw(cls, raw: torch.Tensor, m: torch.Tensor, s: torch.Tensor) -> CensoredLogistic:
        return cls(m + s * raw[..., 0], s * torch.exp(raw[..., 1]) * (math.sqrt(3.0) / math.pi))

    def raised(self, floor: torch.Tensor) -> CensoredLogistic:
        return replace(self, loc=self.loc - floor)

    @_float64
    @_censored
    def crps(self, y: torch.Tensor) -> torch.Tensor:
        """With w = (y - loc) / scale >= c = -loc / scale (y >= 0), sp = softplus, sg = sigmoid:
        CRPS / scale = -w + 2 sp(w) - 1 + sg(c) - sp(c)."""
        w, c = (y - self.loc) / self.scale, -self.loc / self.scale
        return self.scale * (2.0 * softplus(w) - w - 1.0 + torch.sigmoid(c) - softplus(c))

    def log_score(self, y: torch.Tensor) -> torch.Tensor:
        w = (y - self.loc) / self.scale
        dens = torch.log(self.scale) + softplus(w) + softplus(-w)
        atom = softplus(self.loc / self.scale)  # -log P(Y = 0) = -log sigmoid(-loc / scale)
        return torch.where(y > 0, dens, torch.where(y == 0, atom, torch.inf))


# --- censored shifted gamma ---------------------------------------------------------------------


@register("csg", n_raw=3)
@dataclass(frozen=True)
class CensoredShiftedGamma(Distribution):
    """Y = max(0, X - shift), X ~ Gamma(shape k, scale theta): P(Y = 0) = P(k, shift / theta)
    (Scheuerer and Hamill 2015). Head, raw (a, b, c): shift = s softplus(c), X has mean
    (max(m, 0) + shift) exp(a) and std s exp(b), so k = (mean / std)^2, theta = std^2 / mean."""

    fit_bytes_per_sample = 3072  # measured: 2,820 bytes (spread form), 2,965 (sh form)

    shape: torch.Tensor
    scale: torch.Tensor
    shift: torch.Tensor

    @classmethod
    def from_raw(cls, raw: torch.Tensor, m: torch.Tensor, s: torch.Tensor) -> CensoredShiftedGamma:
        """In float64, the shape and scale kept within [1e-30, 1e30] (float32's range): a float32 head whose
        std overflowed (raw b above 88, where a fit's scale regression extrapolates from dry training dates)
        gave shape 0 and scale inf, a CRPS of NaN; at such a clamp the law is its limit, all mass at 0
        (the CRPS equals y to 1e-14, against integration), as it already is from b = 10."""
        r, m64, s64 = raw.double(), m.double(), s.double()
        shift = s64 * F.softplus(r[..., 2])
        mean = (m64.clamp_min(0.0) + shift) * torch.exp(r[..., 0])  # of X, > 0
        std = s64 * torch.exp(r[..., 1])
        shape, scale = ((mean / std) ** 2).clamp(1e-30, 1e30), (std * std / mean).clamp(1e-30, 1e30)
        return cls(shape.to(raw.dtype), scale.to(raw.dtype), shift.to(raw.dtype))

    def raised(self, floor: torch.Tensor) -> CensoredShiftedGamma:
        return replace(self, shift=self.shift + floor)

    @_float64
    @_censored
    def crps(self, y: torch.Tensor) -> torch.Tensor:
        """In units of theta, u = (y + shift) / theta, c = shift / theta, P_k = P(k, .), B the beta function,
        the published form (Scheuerer and Hamill 2015)
        CRPS / theta = u (2 P_k(u) - 1) - c P_k(c)^2 + k (1 + 2 P_k(c) P_k+1(c) - P_k(c)^2 - 2 P_k+1(u))
                       - k / pi B(1/2, k + 1/2) (1 - P_2k(2c))
        cancels terms of order k (1e16 for near-identical members: -31.8 for a CRPS of 2e-7). With
        P_k+1(x) = P_k(x) - x g_k(x) / k (g_k the Gamma(k, 1) density) it is, term by term of order sqrt(k),
        (u - k)(2 P_k(u) - 1) + 2 u g_k(u) + P_k(c) ((k - c) P_k(c) - 2 c g_k(c)) - k / pi B (1 - P_2k(2c)),
        with x g_k(x) and k B(1/2, k + 1/2) through Stirling's remainder (:mod:`postcast.models.special`)."""
        k, theta = self.shape, self.scale
        u, c = (y + self.shift) / theta, self.shift / theta
        pu, pc = gammainc(k, u), gammainc(k, c)
        gap_u = (y + self.shift - k * theta) / theta  # u - k, without the cancellation of u - k at large k
        gap_c = (k * theta - self.shift) / theta  # k - c
        out = (
            gap_u * (2.0 * pu - 1.0)
            + 2.0 * x_gamma_density(k, u, gap_u)
            + pc * (gap_c * pc - 2.0 * x_gamma_density(k, c, -gap_c))
            - k_beta_half(k) / math.pi * (1.0 - gammainc(2.0 * k, 2.0 * c))
        )
        return theta * out

    def log_score(self, y: torch.Tensor) -> torch.Tensor:
        u = (y + self.shift) / self.scale
        dens = torch.log(self.scale) - torch.xlogy(self.shape - 1.0, u) + u + torch.lgamma(self.shape)
        atom = -torch.log(torch.special.gammainc(self.shape, self.shift / self.scale))
        return torch.where(y > 0, dens, torch.where(y == 0, atom, torch.inf))


# --- Bernstein quantile function ----------------------------------------------------------------
def bernstein_basis(tau: torch.Tensor, degree: int) -> torch.Tensor:
    """B_{j,d}(tau) = C(d, j) tau^j (1 - tau)^(d - j): tau (*S) -> (*S, d + 1); powers by running products."""
    binom = torch.tensor([math.comb(degree, i) for i in range(degree + 1)], dtype=tau.dtype, device=tau.device)
    t = tau.unsqueeze(-1)  # (*S, 1)
    ones = torch.ones_like(t)
    up = torch.cat([ones, t.expand(*t.shape[:-1], degree)], dim=-1).cumprod(-1)  # tau^j
    down = torch.cat([ones, (1.0 - t).expand(*t.shape[:-1], degree)], dim=-1).cumprod(-1).flip(-1)  # (1-tau)^(d-j)
    return binom * up * down


@register("bernstein", n_raw=BERNSTEIN_DEGREE + 1)
@dataclass(frozen=True)
class Bernstein(Distribution):
    """Quantile function Q(tau) = sum_j a_j B_{j,d}(tau), a_0 <= ... <= a_d (coef: (*S, d + 1)), so Q is
    increasing on [0, 1] and the law lives on [a_0, a_d] (Bremnes 2020). Head, raw r (*S, d + 1):
    a_0 = m + s (r_0 - sqrt(3)), a_j = a_0 + s k sum_{i<=j} softplus(r_i), k = sqrt(12) / (d log 2):
    r = 0 gives the uniform law of mean m and std s."""

    coef: torch.Tensor

    @property
    def degree(self) -> int:
        return self.coef.shape[-1] - 1

    @classmethod
    def from_raw(cls, raw: torch.Tensor, m: torch.Tensor, s: torch.Tensor) -> Bernstein:
        d = raw.shape[-1] - 1
        a0 = m + s * (raw[..., 0] - math.sqrt(3.0))  # (*S)
        steps = F.softplus(raw[..., 1:]) * (math.sqrt(12.0) / (d * math.log(2.0)))  # (*S, d)
        rise = torch.cat([torch.zeros_like(raw[..., :1]), steps.cumsum(-1)], dim=-1)  # (*S, d + 1)
        return cls(a0.unsqueeze(-1) + s.unsqueeze(-1) * rise)

    def _q(self, tau: torch.Tensor) -> torch.Tensor:
        """Q(tau) on the device, for the CRPS's level tau* (the law's quantiles: :mod:`postcast.datasets.laws`)."""
        return (bernstein_basis(tau, self.degree) * self.coef).sum(-1)

    def _level(self, y: torch.Tensor) -> torch.Tensor:
        """tau* = F(y), the tau with Q(tau) = y by bisection on the device (0 below a_0, 1 above a_d), no
        gradient: the CRPS and log score need it every training step (the law's cdf is on numpy arrays)."""
        zero = torch.zeros_like(y.expand(self.coef.shape[:-1]))
        return _bisect(lambda t: self._q(t) - y, zero, zero + 1.0, iters=64)

    @_float64
    def crps(self, y: torch.Tensor) -> torch.Tensor:
        """Exact CRPS of Q: 2 int_0^1 pinball_tau(y - Q(tau)) dtau. With tau* = F(y) and
        w_j = int tau B_{j,d} = (j + 1) / ((d + 1)(d + 2)), U_j = sum_{i <= j} B_{i,d+1}(tau*)
        (= (d + 1) int_tau*^1 B_{j,d}): CRPS = y (2 tau* - 1) - 2 sum_j a_j w_j + 2 / (d + 1) sum_j a_j U_j.
        tau* carries no gradient and needs none: the integrand vanishes at tau* (Q(tau*) = y). Computed on
        y - a_0 and a - a_0 (the CRPS is unchanged by a shift): its terms are then of the order of the spread,
        not of |y| (at a_0 = 1e6 with a spread of 1e-9 the raw terms cancelled to -5e-10)."""
        d = self.degree
        t = self._level(y)  # (*S), detached
        j = torch.arange(d + 1, dtype=y.dtype, device=y.device)
        w = (j + 1.0) / ((d + 1) * (d + 2))  # (d + 1,)
        up = bernstein_basis(t, d + 1)  # (*S, d + 2)
        tail = up.cumsum(-1)[..., :-1]  # (*S, d + 1): U_j = sum_{i <= j}
        base = self.coef[..., :1]  # (*S, 1): a_0
        a, z = self.coef - base, y - base[..., 0]
        return z * (2.0 * t - 1.0) - 2.0 * (a * w).sum(-1) + 2.0 / (d + 1) * (a * tail).sum(-1)

    def log_score(self, y: torch.Tensor) -> torch.Tensor:
        """log Q'(F(y)) inside [a_0, a_d] (the density is 1 / Q'), +inf outside."""
        d = self.degree
        slope = d * (bernstein_basis(self._level(y), d - 1) * self.coef.diff(dim=-1)).sum(-1)
        inside = (y >= self.coef[..., 0]) & (y <= self.coef[..., -1])
        return torch.where(inside, torch.log(slope), torch.inf)
