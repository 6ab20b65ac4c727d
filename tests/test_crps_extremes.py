"""Every family's closed-form CRPS (postcast.models.distributions) is >= 0 and equals the integral
int (F(x) - 1{x >= y})^2 dx over a grid of extreme parameters (tiny and huge scales, locations far from
zero in units of the scale, shapes from 1e-3 to 1e16, all mass at the censoring point), with F from
scipy.stats (not from postcast) and the integral by scipy.integrate.quad split at the law's quantiles;
Bernstein's by its quantile form, 2 int_0^1 pinball_tau(y - Q(tau)) dtau with scipy's BPoly."""

import itertools

import numpy as np
import pytest
import torch
from scipy import integrate, interpolate, optimize, special, stats

from postcast.models import distributions as D

REL = 1e-7  # of the law's scale (the defects were O(1e1)); locations stay within 1e8 scales, where float64
# holds y - location to 1e-8 of the scale
LEVELS = (1e-12, 1e-6, 1e-3, 0.1, 0.5, 0.9, 0.999, 1 - 1e-6, 1 - 1e-12)


def T(a) -> torch.Tensor:
    return torch.as_tensor(np.asarray(a, dtype=np.float64))


def quad_crps(law, y: float, lower: float | None, shift: float = 0.0) -> float:
    """int (F(x) - 1{x >= y})^2 dx of Y = max(lower, X - shift) (lower None: Y = X), X ~ ``law`` (scipy: its
    cdf below y, its survival function above, so neither tail cancels), split at y, the censoring point and
    X's quantiles so quad sees every place F moves."""
    start = -np.inf if lower is None else min(lower, y)
    qs = [q - shift for q in law.ppf(LEVELS) if np.isfinite(q)]
    edges = sorted({start, y, *(q for q in qs if q > start), np.inf} | (set() if lower is None else {lower}))
    total = 0.0
    for a, b in itertools.pairwise(edges):
        below = lower is not None and b <= lower  # F = 0 there
        if b <= y:
            f = (lambda x: 0.0) if below else (lambda x: law.cdf(x + shift) ** 2)
        else:
            f = (lambda x: 1.0) if below else (lambda x: law.sf(x + shift) ** 2)
        total += integrate.quad(f, a, b, epsabs=0.0, epsrel=1e-11, limit=200)[0]
    return total


class Law:
    """A law for quad_crps: scipy's frozen law for its quantiles (the breakpoints, a few calls), and its cdf
    and survival function through scipy.special (the integrand, thousands of calls: 50x faster)."""

    def __init__(self, frozen, cdf, sf) -> None:
        self.ppf, self.cdf, self.sf = frozen.ppf, cdf, sf
        self.mean, self.std = frozen.mean, frozen.std


def normal(mu: float, s: float) -> Law:
    return Law(stats.norm(mu, s), lambda x: special.ndtr((x - mu) / s), lambda x: special.ndtr((mu - x) / s))


def truncnormal(mu: float, s: float) -> Law:
    """N(mu, s) truncated to [0, inf) (x >= 0 only): P(Y > x) = Phi((mu - x) / s) / Phi(mu / s), in logs."""
    log_sf = lambda x: special.log_ndtr((mu - x) / s) - special.log_ndtr(mu / s)  # noqa: E731
    frozen = stats.truncnorm(-mu / s, np.inf, loc=mu, scale=s)
    return Law(frozen, lambda x: -np.expm1(log_sf(x)), lambda x: np.exp(log_sf(x)))


def logistic(loc: float, s: float) -> Law:
    return Law(stats.logistic(loc, s), lambda x: special.expit((x - loc) / s), lambda x: special.expit((loc - x) / s))


def gamma(k: float, th: float) -> Law:
    g = stats.gamma(k, scale=th)
    return Law(g, lambda x: special.gammainc(k, max(x, 0.0) / th), lambda x: special.gammaincc(k, max(x, 0.0) / th))


def _check(ours: np.ndarray, refs: list[float], scales: list[float], cases: list) -> None:
    for o, r, s, c in zip(ours, refs, scales, cases, strict=True):
        assert o >= 0.0, (c, o)
        assert abs(o - r) <= REL * (r + s), (c, o, r)


def _outcomes(law, shift: float = 0.0, censored: bool = False) -> list[float]:
    ys = [float(q) - shift for q in law.ppf([1e-4, 0.5, 0.97])] + [float(law.mean() + 50 * law.std()) - shift]
    return [max(y, 0.0) for y in ys] + [-1.0] if censored else ys


def test_gaussian_crps_over_extreme_parameters():
    pairs = [(mu, s) for mu, s in itertools.product([0.0, 1e6, -3e4], [1e-8, 1.0, 1e4]) if abs(mu) <= 1e8 * s]
    cases = [(mu, s, y) for mu, s in pairs for y in _outcomes(normal(mu, s))]
    mu, s, y = (np.array(v) for v in zip(*cases, strict=True))
    ours = D.Gaussian(T(mu), T(s)).crps(T(y)).numpy()
    _check(ours, [quad_crps(normal(a, b), c, None) for a, b, c in cases], list(s), cases)


def test_truncnormal_crps_over_extreme_parameters():
    cases = []
    for ratio, s in itertools.product([-40.0, -5.0, 0.0, 5.0, 40.0], [1e-8, 1.0, 1e4]):
        cases += [(ratio * s, s, y) for y in _outcomes(truncnormal(ratio * s, s), censored=True)]
    mu, s, y = (np.array(v) for v in zip(*cases, strict=True))
    ours = D.TruncNormal(T(mu), T(s)).crps(T(y)).numpy()
    refs = [quad_crps(truncnormal(a, b), c, 0.0) for a, b, c in cases]
    _check(ours, refs, list(s), cases)


def test_clogistic_crps_over_extreme_parameters():
    cases = []
    for ratio, s in itertools.product([-50.0, -3.0, 0.0, 3.0, 50.0], [1e-8, 1.0, 1e4]):
        cases += [(ratio * s, s, y) for y in _outcomes(logistic(ratio * s, s), censored=True)]
    loc, s, y = (np.array(v) for v in zip(*cases, strict=True))
    ours = D.CensoredLogistic(T(loc), T(s)).crps(T(y)).numpy()
    _check(ours, [quad_crps(logistic(a, b), c, 0.0) for a, b, c in cases], list(s), cases)


def _csg_grid() -> list[tuple[float, float, float, float]]:
    """(shape, scale, shift, y): the issue's near-identical members (m = 100 or 1000, s = 1e-6 or 1e-5
    through the head: shapes 1e10..1e18), then shapes 1e-3..1e8 with shifts from 0 to 3 means."""
    out = []
    for m, s in itertools.product([100.0, 1000.0], [1e-6, 1e-5]):
        d = D.CensoredShiftedGamma.from_raw(torch.zeros(1, 3, dtype=torch.float64), T([m]), T([s]))
        k, th, sh = (float(v[0]) for v in (d.shape, d.scale, d.shift))
        out += [(k, th, sh, y) for y in _outcomes(gamma(k, th), sh, censored=True)]
    for k, th, frac in itertools.product([1e-3, 0.05, 1.0, 30.0, 1e4, 1e8], [2.0], [0.0, 1.0, 3.0]):
        sh = frac * k * th
        out += [(k, th, sh, y) for y in _outcomes(gamma(k, th), sh, censored=True)]
    return out


def test_csg_crps_over_extreme_parameters():
    """The issue's case: m = 100, s = 1e-6 gave -31.83 (m = 1000: -318), s = 1e-5 gave 4.4e-6 for ~2.3e-6."""
    cases = _csg_grid()
    k, th, sh, y = (np.array(v) for v in zip(*cases, strict=True))
    ours = D.CensoredShiftedGamma(T(k), T(th), T(sh)).crps(T(y)).numpy()
    refs = [quad_crps(gamma(a, b), e, 0.0, c) for a, b, c, e in cases]
    _check(ours, refs, list(np.sqrt(k) * th), cases)


def test_csg_crps_of_near_identical_members_is_the_gaussian_limit():
    """Shape 1e16 is a normal law to 1e-8: the CRPS at the mean is sigma (2 phi(0) - 1 / sqrt(pi))."""
    d = D.CensoredShiftedGamma.from_raw(torch.zeros(1, 3, dtype=torch.float64), T([100.0]), T([1e-5]))
    mean = d.shape * d.scale - d.shift  # of Y, all of it above 0
    expected = 1e-5 * (2.0 * stats.norm.pdf(0.0) - 1.0 / np.sqrt(np.pi))
    assert abs(float(d.crps(mean)[0]) - expected) < 1e-6 * expected


@pytest.mark.parametrize("spread", [1e-9, 1.0, 1e5])
def test_bernstein_crps_over_extreme_parameters(spread):
    g = np.random.default_rng(5)
    base = 1e6 if spread >= 1e-2 else 10.0  # within 1e8 spreads of 0 (float64 holds y - a_0 to 1e-8 of it)
    coef = base + spread * np.cumsum(g.exponential(1.0, (6, D.BERNSTEIN_DEGREE + 1)), axis=1)
    coef[0] = base + spread * np.r_[0.0, np.full(D.BERNSTEIN_DEGREE, 1e-12)]  # all mass in one place
    y = coef[:, 0] + (coef[:, -1] - coef[:, 0]) * np.array([-0.5, 0.0, 0.2, 0.5, 1.0, 3.0])
    ours = D.Bernstein(T(coef)).crps(T(y)).numpy()
    refs = []
    for c, yi in zip(coef, y, strict=True):
        q = interpolate.BPoly(c.reshape(-1, 1), [0.0, 1.0])
        star = optimize.brentq(lambda t, q=q, yi=yi: q(t) - yi, 0.0, 1.0, xtol=1e-15) if q(0) < yi < q(1) else None
        pin = lambda t, q=q, yi=yi: 2.0 * (yi - q(t)) * (t - (yi < q(t)))  # noqa: E731
        refs.append(integrate.quad(pin, 0.0, 1.0, points=[star] if star else None, epsabs=0.0, limit=200)[0])
    scales = np.maximum(coef[:, -1] - coef[:, 0], 1e-8 * np.abs(coef[:, 0]))  # float64 holds a_0 to 1e-16
    _check(ours, refs, list(scales), list(zip(coef[:, 0], y, strict=True)))
