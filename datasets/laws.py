"""The predictive laws: one home per family (numpy and scipy only, so every layer can import it).

A :class:`Family` is a small frozen object registered by name (:func:`get`, :func:`names`) that owns what
the law itself is, whoever computes with it: its parameters (:class:`Parameter`: name, CF long name, units
rule), the lower bound of its support, its closed-form mean and std (:meth:`Family.moments`), its
distribution and survival functions (:meth:`Family.cdf`, :meth:`Family.cdf_left`, :meth:`Family.sf`: the
probability of exceeding a threshold) and its quantile function (:meth:`Family.quantile`), all elementwise
on numpy float64 arrays.

Parameters travel as ``dict[str, np.ndarray]`` by name, each of one shape S (e.g. (lat, lon) or
(T, lat, lon)); a vector parameter (Bernstein's ``coef``) carries its own axis first, (K, *S), as the
forecast files store it. The torch side of each family (the network head and the closed-form CRPS the
models train with) is :mod:`postcast.models.distributions`; formulas and references: docs/distributions.md.

Families: ``gaussian``, ``truncnormal`` (normal truncated to [0, inf), wind speed), ``clogistic``
(logistic censored at 0: a point mass P(Y = 0), precipitation), ``csg`` (censored shifted gamma,
Scheuerer and Hamill 2015, precipitation), ``bernstein`` (a monotone Bernstein-polynomial quantile
function, Bremnes 2020).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from scipy import special

from postcast.datasets.core.errors import ConfigError

Params = dict[str, np.ndarray]  # a law's parameters by name: shape S each (a vector parameter: (K, *S))
ArrayLike = np.ndarray | float
TARGET_UNITS = ""  # Parameter.units: the parameter is in the target's units


@dataclass(frozen=True)
class Parameter:
    """One parameter of a family: its name (the torch dataclass field, the file variable ``<target>_<name>``),
    its CF long name, its units (:data:`TARGET_UNITS`: the target's; else CF units, "1" dimensionless) and
    whether it is a vector per point (its own axis first: (K, *S))."""

    name: str
    long_name: str
    units: str = TARGET_UNITS
    vector: bool = False
    oracle: str = ""  # the stem of the synthetic oracle's store variable ``oracle_<stem>_<target>``; "": the name

    @property
    def oracle_stem(self) -> str:
        return self.oracle or self.name

    def units_of(self, target_units: str) -> str:
        """The CF units of the parameter for a target in ``target_units``."""
        return self.units or target_units


@dataclass(frozen=True)
class Family:
    """A predictive family; subclasses implement the law, every method elementwise over the shape S (the
    parameters' and the argument's, broadcast) in float64."""

    name: ClassVar[str]
    parameters: ClassVar[tuple[Parameter, ...]]
    lower: ClassVar[float | None] = None  # the support's lower bound (a point mass there if censored)
    # a location-scale law, two raw head outputs (a, b) = (location offset / s, log scale / s): the local EMOS
    # fits it by Newton under ``solver: auto``, in the standard form too (models/emos_fit.py)
    location_scale: ClassVar[bool] = False
    moments_from: ClassVar[str] = "its parameters in closed form"  # how the mean and std come (file comment)

    @property
    def names(self) -> tuple[str, ...]:
        """The parameter names, in order."""
        return tuple(p.name for p in self.parameters)

    def parameter(self, name: str) -> Parameter:
        return next(p for p in self.parameters if p.name == name)

    def moments(self, p: Params) -> tuple[np.ndarray, np.ndarray]:
        """(mean, std), each of shape S, in closed form."""
        raise NotImplementedError

    def valid(self, p: Params) -> np.ndarray:
        """Where the parameters are a law of this family (bool, shape S): finite and inside its domain (a
        positive scale, ...); anything read from a file is checked with it before it is used."""
        ok = np.ones(np.shape(p[self.parameters[0].name])[1 if self.parameters[0].vector else 0 :], dtype=bool)
        for q in self.parameters:
            ok &= np.isfinite(p[q.name]).all(axis=0) if q.vector else np.isfinite(p[q.name])
        with np.errstate(invalid="ignore"):
            return ok & self._domain(p)

    def _domain(self, p: Params) -> np.ndarray:
        """Where finite parameters are inside the family's domain."""
        return np.asarray(True)

    def cdf(self, p: Params, x: ArrayLike) -> np.ndarray:
        """P(Y <= x)."""
        raise NotImplementedError

    def cdf_left(self, p: Params, x: ArrayLike) -> np.ndarray:
        """P(Y < x): differs from the cdf only at a point mass (the censoring point)."""
        return self.cdf(p, x)

    def sf(self, p: Params, x: ArrayLike) -> np.ndarray:
        """P(Y > x): the probability of exceeding the threshold x."""
        return 1.0 - self.cdf(p, x)

    def quantile(self, p: Params, tau: ArrayLike) -> np.ndarray:
        """Q(tau) = inf {x : F(x) >= tau}, tau in (0, 1)."""
        raise NotImplementedError

    def pit(self, p: Params, y: ArrayLike, u: ArrayLike | None = None) -> np.ndarray:
        """Probability integral transform F(y); with uniforms u randomised where F jumps (an outcome at a
        point mass gets a uniform draw over [P(Y < y), P(Y <= y)])."""
        upper = self.cdf(p, y)
        return upper if u is None else self.cdf_left(p, y) + _f64(u) * (upper - self.cdf_left(p, y))


_FAMILIES: dict[str, Family] = {}


def register(cls: type[Family]) -> type[Family]:
    """Class decorator: one instance of the family, under its ``name``."""
    _FAMILIES[cls.name] = cls()
    return cls


def names() -> list[str]:
    return sorted(_FAMILIES)


def location_scale() -> tuple[str, ...]:
    """The names of the location-scale families (:attr:`Family.location_scale`), sorted."""
    return tuple(n for n in names() if _FAMILIES[n].location_scale)


def get(name: str) -> Family:
    """The family ``name``; :class:`ConfigError` naming the known families for another name."""
    if name not in _FAMILIES:
        msg = f"predictive family (distribution) {name!r}: choose one of {names()}"
        raise ConfigError(msg)
    return _FAMILIES[name]


def _f64(x: ArrayLike) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def mills(x: np.ndarray) -> np.ndarray:
    """Mills ratio M(x) = Phi(-x) / phi(x) through the scaled complementary error function (x >= 0)."""
    return math.sqrt(math.pi / 2.0) * special.erfcx(x / math.sqrt(2.0))


# --- Gaussian -----------------------------------------------------------------------------------
@register
class Gaussian(Family):
    """N(mu, sigma^2)."""

    name = "gaussian"
    parameters = (Parameter("mu", "mean", oracle="mean"), Parameter("sigma", "standard deviation", oracle="std"))
    location_scale = True
    moments_from = "the parameters mu and sigma"

    def _domain(self, p: Params) -> np.ndarray:
        return p["sigma"] > 0

    def moments(self, p: Params) -> tuple[np.ndarray, np.ndarray]:
        return p["mu"], p["sigma"]

    def cdf(self, p: Params, x: ArrayLike) -> np.ndarray:
        return special.ndtr((_f64(x) - p["mu"]) / p["sigma"])

    def sf(self, p: Params, x: ArrayLike) -> np.ndarray:
        return special.ndtr((p["mu"] - _f64(x)) / p["sigma"])

    def quantile(self, p: Params, tau: ArrayLike) -> np.ndarray:
        return p["mu"] + p["sigma"] * special.ndtri(tau)


DEFAULT = Gaussian.name  # the predictive family of a target or a model that names none


# --- truncated normal ---------------------------------------------------------------------------
@register
class TruncNormal(Family):
    """N(mu, sigma^2) truncated to [0, inf) (wind speed)."""

    name = "truncnormal"
    parameters = (
        Parameter("mu", "location mu of the normal law before truncation to [0, inf)"),
        Parameter("sigma", "scale sigma of the normal law before truncation to [0, inf)"),
    )
    lower = 0.0
    location_scale = True

    def _domain(self, p: Params) -> np.ndarray:
        return p["sigma"] > 0

    def moments(self, p: Params) -> tuple[np.ndarray, np.ndarray]:
        """alpha = -mu / sigma, lam = phi(alpha) / Phi(-alpha) (inverse Mills ratio, erfcx: 0 where
        alpha << 0); mean = mu + sigma lam, var = sigma^2 (1 + alpha lam - lam^2)."""
        mu, sigma = p["mu"], p["sigma"]
        alpha = -mu / sigma
        with np.errstate(over="ignore"):  # erfcx overflows to inf for alpha < -26: lam = 0
            lam = 1.0 / mills(alpha)
        return mu + sigma * lam, sigma * np.sqrt(np.maximum(1.0 + alpha * lam - lam * lam, 0.0))

    def _log_sf(self, p: Params, x: np.ndarray) -> np.ndarray:
        """log P(Y > x) for x >= 0: log Phi(-z) - log Phi(mu / sigma)."""
        return special.log_ndtr((p["mu"] - x) / p["sigma"]) - special.log_ndtr(p["mu"] / p["sigma"])

    def cdf(self, p: Params, x: ArrayLike) -> np.ndarray:
        x = _f64(x)
        return np.where(x >= 0, -np.expm1(self._log_sf(p, np.maximum(x, 0.0))), 0.0)

    def sf(self, p: Params, x: ArrayLike) -> np.ndarray:
        x = _f64(x)
        return np.where(x >= 0, np.exp(self._log_sf(p, np.maximum(x, 0.0))), 1.0)

    def quantile(self, p: Params, tau: ArrayLike) -> np.ndarray:
        """Solves log Phi(-z) = log(1 - tau) + log Phi(a), a = mu / sigma: closed form, then Newton steps in
        log space (where Phi(a) underflows, from z = sqrt(-2 target))."""
        mu, sigma = p["mu"], p["sigma"]
        a = mu / sigma
        target = np.log1p(-_f64(tau)) + special.log_ndtr(a)  # log of P(Y > Q) in N(0, 1) terms
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            z = -special.ndtri(np.exp(target))
            z = np.where(np.isfinite(z), z, np.sqrt(-2.0 * target))
            for _ in range(6):  # only changes a < 0 (z > 0 there, where M is finite)
                step = (special.log_ndtr(-z) - target) * mills(np.maximum(z, 0.0))
                z = np.where(a < 0, z + step, z)
        return np.maximum(mu + sigma * z, 0.0)


# --- censored logistic --------------------------------------------------------------------------
@register
class CensoredLogistic(Family):
    """Logistic(loc, scale) censored at 0: Y = max(0, X), P(Y = 0) = F_X(0) (precipitation)."""

    name = "clogistic"
    parameters = (
        Parameter("loc", "location of the logistic law before censoring at 0"),
        Parameter("scale", "scale of the logistic law before censoring at 0"),
    )
    lower = 0.0
    location_scale = True

    def _domain(self, p: Params) -> np.ndarray:
        return p["scale"] > 0

    def moments(self, p: Params) -> tuple[np.ndarray, np.ndarray]:
        """t = loc / scale: E Y = scale softplus(t), E Y^2 = 2 scale^2 F_1(t) (:func:`_fermi_dirac_1`)."""
        s, t = p["scale"], p["loc"] / p["scale"]
        mean = s * special.softplus(t)
        return mean, np.sqrt(np.maximum(2.0 * s * s * _fermi_dirac_1(t) - mean * mean, 0.0))

    def cdf(self, p: Params, x: ArrayLike) -> np.ndarray:
        x = _f64(x)
        return np.where(x >= 0, special.expit((x - p["loc"]) / p["scale"]), 0.0)

    def cdf_left(self, p: Params, x: ArrayLike) -> np.ndarray:
        x = _f64(x)
        return np.where(x > 0, self.cdf(p, x), 0.0)

    def sf(self, p: Params, x: ArrayLike) -> np.ndarray:
        x = _f64(x)
        return np.where(x >= 0, special.expit((p["loc"] - x) / p["scale"]), 1.0)

    def quantile(self, p: Params, tau: ArrayLike) -> np.ndarray:
        return np.maximum(p["loc"] + p["scale"] * special.logit(tau), 0.0)


def _fermi_dirac_1(t: np.ndarray) -> np.ndarray:
    """int_0^inf u / (1 + e^(u - t)) du = -Li2(-e^t), Li2(-x) = spence(1 + x); for t > 0 through
    Li2(-e^t) = -pi^2/6 - t^2/2 - Li2(-e^-t) (no overflow)."""
    e = np.exp(-np.abs(t))
    return np.where(t > 0, np.pi**2 / 6.0 + 0.5 * t * t + special.spence(1.0 + e), -special.spence(1.0 + e))


# --- censored shifted gamma ---------------------------------------------------------------------
@register
class CensoredShiftedGamma(Family):
    """Y = max(0, X - shift), X ~ Gamma(shape k, scale theta): P(Y = 0) = P(k, shift / theta)
    (Scheuerer and Hamill 2015; P the regularised lower incomplete gamma function)."""

    name = "csg"
    parameters = (
        Parameter("shape", "shape k of the gamma law X (Y = max(0, X - shift))", "1"),
        Parameter("scale", "scale theta of the gamma law X (Y = max(0, X - shift))"),
        Parameter("shift", "shift of the gamma law X (Y = max(0, X - shift))"),
    )
    lower = 0.0

    def _domain(self, p: Params) -> np.ndarray:
        return (p["shape"] > 0) & (p["scale"] > 0) & (p["shift"] >= 0)

    def moments(self, p: Params) -> tuple[np.ndarray, np.ndarray]:
        """c = shift / theta, Q = upper regularised incomplete gamma: E Y = theta (k Q(k+1, c) - c Q(k, c)),
        E Y^2 = theta^2 (k (k+1) Q(k+2, c) - 2 c k Q(k+1, c) + c^2 Q(k, c))."""
        k, theta = p["shape"], p["scale"]
        c = p["shift"] / theta
        q0, q1, q2 = special.gammaincc(k, c), special.gammaincc(k + 1.0, c), special.gammaincc(k + 2.0, c)
        mean = k * q1 - c * q0  # in units of theta
        second = k * (k + 1.0) * q2 - 2.0 * c * k * q1 + c * c * q0
        return theta * mean, theta * np.sqrt(np.maximum(second - mean * mean, 0.0))

    def cdf(self, p: Params, x: ArrayLike) -> np.ndarray:
        x = _f64(x)
        return np.where(x >= 0, special.gammainc(p["shape"], (np.maximum(x, 0.0) + p["shift"]) / p["scale"]), 0.0)

    def cdf_left(self, p: Params, x: ArrayLike) -> np.ndarray:
        x = _f64(x)
        return np.where(x > 0, self.cdf(p, x), 0.0)

    def sf(self, p: Params, x: ArrayLike) -> np.ndarray:
        x = _f64(x)
        return np.where(x >= 0, special.gammaincc(p["shape"], (np.maximum(x, 0.0) + p["shift"]) / p["scale"]), 1.0)

    def quantile(self, p: Params, tau: ArrayLike) -> np.ndarray:
        """0 where tau <= P(Y = 0), else theta (P^-1(k, tau) - c), c = shift / theta (NaN parameters: NaN)."""
        k, tau = np.broadcast_arrays(p["shape"], _f64(tau))
        c = p["shift"] / p["scale"]
        dry = special.gammainc(k, c)  # P(Y = 0)
        out = p["scale"] * (special.gammaincinv(k, tau) - c)
        return np.where(tau > dry, out, np.where(np.isnan(dry), np.nan, 0.0))


# --- Bernstein quantile function ----------------------------------------------------------------
def bernstein_basis(tau: ArrayLike, degree: int) -> np.ndarray:
    """B_{j,d}(tau) = C(d, j) tau^j (1 - tau)^(d - j): tau (*S) -> (*S, d + 1); powers by running products."""
    binom = np.array([math.comb(degree, i) for i in range(degree + 1)], dtype=np.float64)
    t = _f64(tau)[..., None]  # (*S, 1)
    ones = np.ones_like(t)
    up = np.cumprod(np.concatenate([ones, np.broadcast_to(t, (*t.shape[:-1], degree))], axis=-1), axis=-1)
    down = np.flip(
        np.cumprod(np.concatenate([ones, np.broadcast_to(1.0 - t, (*t.shape[:-1], degree))], axis=-1), axis=-1), axis=-1
    )  # (1 - tau)^(d - j)
    return binom * up * down


@register
class Bernstein(Family):
    """Quantile function Q(tau) = sum_j a_j B_{j,d}(tau), a_0 <= ... <= a_d (``coef``: (d + 1, *S)), so Q is
    increasing on [0, 1] and the law lives on [a_0, a_d] (Bremnes 2020)."""

    name = "bernstein"
    parameters = (
        Parameter(
            "coef", "coefficients a_j of the Bernstein quantile function Q(tau) = sum_j a_j B_j,d(tau)", vector=True
        ),
    )

    def _domain(self, p: Params) -> np.ndarray:
        return np.asarray((np.diff(p["coef"], axis=0) >= 0).all(axis=0))  # a_0 <= ... <= a_d

    def moments(self, p: Params) -> tuple[np.ndarray, np.ndarray]:
        """E Y = mean_j a_j (each B_j,d integrates to 1 / (d + 1)); with a centred, var = a^T G a,
        G_ij = int B_i,d B_j,d = C(d, i) C(d, j) / (C(2d, i + j) (2d + 1))."""
        a = p["coef"]  # (K, *S), K = d + 1
        d = a.shape[0] - 1
        j = np.arange(d + 1)
        gram = (
            special.comb(d, j)[:, None]
            * special.comb(d, j)[None]
            / (special.comb(2 * d, j[:, None] + j[None]) * (2 * d + 1))
        )  # (K, K)
        mean = a.mean(axis=0)
        dev = a - mean  # Q - mean has coefficients a_j - mean (the B_j,d sum to 1)
        return mean, np.sqrt(np.maximum(np.einsum("i...,ij,j...->...", dev, gram, dev), 0.0))

    def quantile(self, p: Params, tau: ArrayLike) -> np.ndarray:
        coef = np.moveaxis(p["coef"], 0, -1)  # (*S, K)
        return (bernstein_basis(tau, coef.shape[-1] - 1) * coef).sum(-1)

    def cdf(self, p: Params, x: ArrayLike) -> np.ndarray:
        """The tau with Q(tau) = x by bisection, 64 halvings of [0, 1] (0 below a_0, 1 above a_d)."""
        x = _f64(x)
        lo = np.zeros(np.broadcast_shapes(p["coef"].shape[1:], x.shape))
        hi = lo + 1.0
        for _ in range(64):
            mid = 0.5 * (lo + hi)
            below = self.quantile(p, mid) - x < 0
            lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
        return 0.5 * (lo + hi)
