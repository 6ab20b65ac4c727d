"""Predictive distribution families (postcast.models.distributions, the torch side; their laws in
postcast.datasets.laws) against independent implementations: scoringrules 0.10 for the CRPS, scipy.stats
for log scores and quantiles, scipy.integrate.quad of (F(x) - 1{x >= y})^2 where scoringrules is unstable
or has no closed form, all in float64; then the one distribution head on every architecture (float32
training, the Gaussian bit for bit as before)."""

import dataclasses
import itertools
import math
from pathlib import Path

import numpy as np
import pytest
import scoringrules as sr
import torch
from battery import assert_ok, in_process
from scipy import integrate, interpolate, optimize, special, stats

from postcast.datasets import laws
from postcast.datasets.core.errors import BadInputError, ConfigError
from postcast.models import distributions as D
from postcast.models import kernels, registry
from postcast.models.module import PostProcessor
from postcast.models.postprocessors import crps_loss

ROOT = Path(__file__).resolve().parents[1]

TOL = 1e-8  # absolute, on CRPS values of order 0.01-10 (the brief: 1e-8)
N = 400  # random cases per family


def T(a) -> torch.Tensor:
    return torch.as_tensor(np.asarray(a, dtype=np.float64))


def law_of(dist: D.Distribution) -> tuple[laws.Family, laws.Params]:
    """The law of a torch family and its parameters as the law reads them (numpy; Bernstein's coef (K, *S))."""
    return dist.law, dist.numpy_params()


def quad_crps(cdf, sf, y: float, lower: float = -np.inf, breaks: tuple[float, ...] = ()) -> float:
    """CRPS by integration: int_lower^y F^2 + int_y^inf (1 - F)^2, split at y and at ``breaks``."""

    def piece(f, a, b):
        pts = sorted({p for p in breaks if a < p < b})
        edges = [a, *pts, b]
        return sum(
            integrate.quad(f, lo, hi, epsabs=1e-14, epsrel=1e-13, limit=500)[0] for lo, hi in itertools.pairwise(edges)
        )

    if np.isinf(lower):
        return piece(lambda x: cdf(x) ** 2, lower, y) + piece(lambda x: sf(x) ** 2, y, np.inf)
    # F^2 = 1 - sf (1 + F): integrate the small part where F is close to 1 on most of [lower, y]
    return (y - lower) - piece(lambda x: sf(x) * (1 + cdf(x)), lower, y) + piece(lambda x: sf(x) ** 2, y, np.inf)


def rng() -> np.random.Generator:
    return np.random.default_rng(31)


# --- CRPS against scoringrules ------------------------------------------------------------------
def test_gaussian_crps_matches_scoringrules_with_edge_cases():
    g = rng()
    mu, sigma = g.normal(0, 5, N), g.lognormal(0, 1, N)
    y = mu + sigma * g.normal(0, 2, N)
    mu = np.r_[mu, 0.0, 0.0, 1.0, 1.0]
    sigma = np.r_[sigma, 1e-6, 1e-6, 1e-3, 2.0]  # sigma near 0, outcomes far in either tail
    y = np.r_[y, 1e-6, -3e-5, 1.0 + 40e-3, 1.0 - 80.0]
    ours = D.Gaussian(T(mu), T(sigma)).crps(T(y)).numpy()
    assert np.abs(ours - sr.crps_normal(y, mu, sigma)).max() < TOL


def test_truncnormal_crps_matches_scoringrules_where_it_is_stable():
    """scoringrules' crps_tnormal(y, mu, s, 0, inf) is exact down to mu/s of about -3 (2.5e-11 off at
    -3, 4e-9 at -4, 3e-7 at -4.5, NaN below about -5: measured against quad), so compare there only;
    the region below is test_truncnormal_crps_is_stable_far_below_zero."""
    g = rng()
    sigma = g.lognormal(0, 1, N)
    mu = sigma * g.uniform(-3.0, 6.0, N)
    y = np.abs(mu + sigma * g.normal(0, 2, N))
    mu, sigma, y = np.r_[mu, 5.0, 1e3], np.r_[sigma, 1e-5, 1.0], np.r_[y, 5.0 + 1e-6, 0.0]  # sigma ~ 0; all mass far up
    ours = D.TruncNormal(T(mu), T(sigma)).crps(T(y)).numpy()
    assert np.abs(ours - sr.crps_tnormal(y, mu, sigma, 0.0, np.inf)).max() < TOL


def _textbook_tn(mu: float, s: float, y: float) -> float:
    """The published closed form (Thorarinsdottir and Gneiting 2010), to show where it breaks."""
    p, z = stats.norm.cdf(mu / s), (y - mu) / s
    return (
        s
        / p**2
        * (
            z * p * (2 * stats.norm.cdf(z) + p - 2)
            + 2 * stats.norm.pdf(z) * p
            - stats.norm.cdf(math.sqrt(2) * mu / s) / math.sqrt(math.pi)
        )
    )


@pytest.mark.parametrize("ratio", [-5.0, -8.0, -20.0, -60.0, -300.0, -2000.0])
def test_truncnormal_crps_is_stable_far_below_zero(ratio):
    """mu/s far below 0 (an early-training network can get there): the textbook form cancels there and
    scoringrules returns NaN; ours matches integration of (F - 1{x >= y})^2 with the tail in log space,
    P(Y > x) = exp(log Phi((mu - x) / s) - log Phi(mu / s)) (scipy.special.log_ndtr). (scipy.stats.truncnorm
    is 1.4e-8 off at mu/s = -2000, y = 3: measured against a 40-digit mpmath integration.)"""
    for sigma in (0.3, 2.0):
        mu = ratio * sigma
        sf = lambda x, mu=mu, sigma=sigma: math.exp(special.log_ndtr((mu - x) / sigma) - special.log_ndtr(mu / sigma))  # noqa: E731
        scale = sigma / abs(ratio)  # the law is nearly exponential with this mean
        for y in (0.0, 0.1 * scale, scale, 5 * scale, 3.0):
            breaks = tuple(scale * np.array([1, 5, 10, 20, 40, 80]))
            ref = quad_crps(lambda x, sf=sf: 1.0 - sf(x), sf, y, lower=0.0, breaks=breaks)
            ours = D.TruncNormal(T(mu), T(sigma)).crps(T(y)).item()
            assert abs(ours - ref) < max(TOL, 1e-9 * ref), (ratio, sigma, y, ours, ref)


def test_the_textbook_truncnormal_crps_and_scoringrules_fail_where_ours_is_checked():
    """Why the test above exists (measured): at mu/s = -8 the textbook form is negative and scoringrules
    7.17 (exact: 0.0616); at -10 scoringrules is NaN."""
    exact = D.TruncNormal(T(-8.0), T(1.0)).crps(T(0.0)).item()
    assert _textbook_tn(-8.0, 1.0, 0.0) < 0 < exact < 0.1
    assert sr.crps_tnormal(0.0, -8.0, 1.0, 0.0, np.inf) > 1.0
    with np.errstate(all="ignore"):
        assert np.isnan(sr.crps_tnormal(0.0, -10.0, 1.0, 0.0, np.inf))


def test_truncnormal_crps_in_float32_stays_close_to_float64_far_below_zero():
    """Training runs in float32: the score is computed in float64 inside and returned as float32."""
    mu = torch.tensor([-1e3, -50.0, -5.0, 0.0, 40.0])
    sigma, y = torch.ones(5), torch.tensor([0.0, 0.02, 0.5, 1.0, 39.0])
    lo = D.TruncNormal(mu, sigma).crps(y)
    hi = D.TruncNormal(mu.double(), sigma.double()).crps(y.double())
    assert lo.dtype == torch.float32
    assert torch.allclose(lo.double(), hi, rtol=1e-6, atol=0)
    assert bool((lo > 0).all())


def _clogistic_reference(y, loc, scale):
    """scoringrules' crps_clogistic is NaN for any infinite ``upper`` (log(sigmoid(-inf)) * 0) and for
    any finite one that underflows; an upper bound 40 scales above max(y, loc) moves 4e-18 of mass."""
    upper = np.maximum(y, loc) + 40.0 * scale
    return sr.crps_clogistic(y, loc, scale, lower=0.0, upper=upper)


def test_clogistic_crps_matches_scoringrules_with_edge_cases():
    g = rng()
    scale = g.lognormal(0, 1, N)
    loc = scale * g.uniform(-8.0, 8.0, N)
    y = np.where(g.random(N) < 0.3, 0.0, np.abs(loc + scale * g.logistic(0, 2, N)))
    # scale near 0; outcomes far in the upper tail (w = 60, 20.6: torch's softplus is linear above 20)
    loc, scale = np.r_[loc, 2.0, 1.0, -183.05811865657557], np.r_[scale, 1e-6, 0.5, 23.191050340646772]
    y = np.r_[y, 2.0 + 1e-6, 30.0, 294.10091592499913]
    ours = D.CensoredLogistic(T(loc), T(scale)).crps(T(y)).numpy()
    assert np.abs(ours - _clogistic_reference(y, loc, scale)).max() < TOL


@pytest.mark.parametrize(("loc", "y"), [(-50.0, 0.0), (-50.0, 10.0), (-800.0, 0.5), (-20.0, 1e-3)])
def test_clogistic_crps_when_all_mass_is_at_zero(loc, y):
    """All dry, P(Y = 0) ~ 1: scoringrules is NaN there (sigmoid underflow), so integrate (scipy's logistic)."""
    law = stats.logistic(loc, 1.0)
    ref = quad_crps(law.cdf, law.sf, y, lower=0.0)
    with np.errstate(all="ignore"):
        assert np.isnan(_clogistic_reference(np.array([y]), np.array([loc]), np.array([1.0]))[0]) or loc > -30
    assert abs(D.CensoredLogistic(T(loc), T(1.0)).crps(T(y)).item() - ref) < TOL


def _csg_cases():
    g = rng()
    k, theta = g.lognormal(0, 1, N), g.lognormal(0, 1, N)
    shift = theta * g.uniform(0.01, 3.0, N)
    y = np.where(g.random(N) < 0.3, 0.0, g.gamma(k, theta))
    # heavy right tail (k = 0.05), all dry (P(Y = 0) = P(2, 60) ~ 1), an outcome far in the upper tail
    k, theta, shift = np.r_[k, 0.05, 2.0, 2.0], np.r_[theta, 5.0, 1.0, 0.5], np.r_[shift, 0.01, 60.0, 0.3]
    return k, theta, shift, np.r_[y, 40.0, 0.0, 200.0]


def test_csg_crps_matches_scoringrules_and_integration():
    """scoringrules' crps_csg0 implements the same published closed form, so it is also checked against
    integration on a few cases (including the heavy-tailed and the all-dry ones)."""
    k, theta, shift, y = _csg_cases()
    ours = D.CensoredShiftedGamma(T(k), T(theta), T(shift)).crps(T(y)).numpy()
    keep = k < 10  # the score uses P_2k; torch's is 4e-10 off above shape 20: test_csg_crps_for_large_shapes
    assert np.abs(ours - sr.crps_csg0(y, k, scale=theta, shift=shift))[keep].max() < TOL
    for i in [0, 1, 2, 3, N, N + 1, N + 2]:
        law = stats.gamma(k[i], scale=theta[i])
        ref = quad_crps(
            lambda x, law=law, i=i: law.cdf(x + shift[i]),
            lambda x, law=law, i=i: law.sf(x + shift[i]),
            y[i],
            lower=0.0,
            breaks=tuple(law.ppf([0.5, 0.9, 0.99]) - shift[i]),
        )
        assert abs(ours[i] - ref) < TOL, (k[i], theta[i], shift[i], y[i], ours[i], ref)


def test_csg_crps_for_large_shapes():
    """Above shape 20 (so from k = 10 through P_2k) torch.special.gammainc switches to an asymptotic
    expansion good to ~4e-10 (scipy's: 1e-15; measured on 2e5 random points), so the CRPS there matches
    scoringrules (and integration) to 1e-8 relative only (measured: 3.3e-9 at k = 19.93)."""
    k = np.array([19.931290292096453, 30.0, 80.0, 150.0])
    theta, shift = np.array([5.97, 1.0, 0.3, 0.1]), np.array([1.93, 0.5, 1.0, 2.0])
    y = np.array([91.9, 25.0, 30.0, 5.0])
    ours = D.CensoredShiftedGamma(T(k), T(theta), T(shift)).crps(T(y)).numpy()
    ref = sr.crps_csg0(y, k, scale=theta, shift=shift)
    assert np.abs(ours / ref - 1).max() < 1e-8


@pytest.mark.parametrize("c", [10.0, 300.0, 1000.0, 3000.0])
def test_csg_crps_gradient_in_the_head_matches_scoringrules_for_large_shapes(c):
    """The gradient of the CRPS in the head's raw (a, b, c) (autograd; dP/dk by a central difference inside
    :class:`postcast.models.special._GammaInc`) against central differences of scoringrules' crps_csg0
    at the same laws (its P(k, x) is scipy's), near the censored-normal limit where the shape k reaches 1e4 to
    2e6. With a step of 1e-5 k, dP/dk's truncation error (P varies over sqrt(k) in k) reached 2.5 % of
    dCRPS/db at k = 2.5e5 (c = 1000) and 30 % at k = 2.5e7, and the EMOS fit stalled there 1e-4 above scipy."""
    m, s, y = np.array([0.4, 1.5, 0.0]), np.array([0.6, 0.8, 0.5]), np.array([0.0, 2.5, 1.2])
    raw = np.stack([np.full(3, -0.3 / c), np.full(3, 0.8), np.full(3, c)], axis=-1)  # (3, K): a, b, c

    def reference(r: np.ndarray) -> np.ndarray:  # the head of CensoredShiftedGamma.from_raw, in numpy
        shift = s * np.logaddexp(0.0, r[:, 2])
        mean, std = (np.maximum(m, 0.0) + shift) * np.exp(r[:, 0]), s * np.exp(r[:, 1])
        return np.asarray(sr.crps_csg0(y, (mean / std) ** 2, scale=std**2 / mean, shift=shift))

    x = T(raw).requires_grad_(True)
    crps = D.CensoredShiftedGamma.from_raw(x, T(m), T(s)).crps(T(y))
    (grad,) = torch.autograd.grad(crps.sum(), x)
    assert np.abs(crps.detach().numpy() / reference(raw) - 1).max() < 1e-8
    for j, h in enumerate((1e-4 / c, 1e-4, 1e-4 * c)):
        e = np.zeros_like(raw)
        e[:, j] = h
        numeric = (reference(raw + e) - reference(raw - e)) / (2 * h)
        np.testing.assert_allclose(grad[:, j].numpy(), numeric, rtol=1e-4, atol=1e-9 / h, err_msg=f"raw {j}")


def test_csg_head_in_float32_whose_std_overflows_is_all_mass_at_zero():
    """A float32 head with raw b above 88 (a scale regression fitted on dry training dates, extrapolated): its
    std overflowed to inf, so shape 0 and scale inf gave a CRPS of NaN. The law's limit there is all mass at 0,
    whose CRPS is y: checked against integration at b = 40, where float64 still holds the law."""
    m, s = torch.tensor([0.5, 2.0, 0.0]), torch.tensor([0.3, 1.0, 0.01])
    y = torch.tensor([0.0, 3.5, 1.25])
    for b in (40.0, 95.0, 300.0):
        raw = torch.tensor([[0.1, b, -2.0], [-0.4, b, 1.0], [0.0, b, 3.0]])  # float32, (3, K)
        crps = D.CensoredShiftedGamma.from_raw(raw, m, s).crps(y)
        assert crps.dtype == torch.float32
        np.testing.assert_allclose(crps.numpy(), y.numpy(), rtol=1e-6, atol=1e-7, err_msg=f"b = {b}")
    law = D.CensoredShiftedGamma.from_raw(torch.tensor([[0.1, 40.0, -2.0]], dtype=torch.float64), T([0.5]), T([0.3]))
    k, theta, shift = (float(v) for v in (law.shape, law.scale, law.shift))
    dist = stats.gamma(k, scale=theta)
    ref = quad_crps(lambda x: dist.cdf(x + shift), lambda x: dist.sf(x + shift), 3.5, lower=0.0)
    assert abs(ref - 3.5) < 1e-12 and abs(float(law.crps(T([3.5]))) - ref) < 1e-12


def _bernstein_cases(n: int):
    g = rng()
    d = D.BERNSTEIN_DEGREE
    raw = g.normal(0, 1.5, (n, d + 1))
    raw[0, 1:] = -40.0  # nearly flat quantile function (all mass in one place)
    coef = D.Bernstein.from_raw(T(raw), T(g.normal(0, 3, n)), T(g.lognormal(0, 1, n))).coef.numpy()
    span = coef[:, -1] - coef[:, 0]
    y = coef[:, 0] + span * g.uniform(-0.3, 1.3, n)  # some outside [Q(0), Q(1)]
    return coef, y


def test_bernstein_crps_matches_integrated_pinball_loss():
    """The exact CRPS of the quantile function, 2 int_0^1 pinball_tau(y - Q(tau)) dtau, with Q from
    scipy's BPoly (an independent Bernstein evaluation) and quad split at tau* = F(y)."""
    coef, y = _bernstein_cases(60)
    ours = D.Bernstein(T(coef)).crps(T(y)).numpy()
    for i in range(len(y)):
        q = interpolate.BPoly(coef[i].reshape(-1, 1), [0.0, 1.0])
        inside = q(0.0) < y[i] < q(1.0)
        star = optimize.brentq(lambda t, q=q, i=i: q(t) - y[i], 0.0, 1.0, xtol=1e-15) if inside else None
        pin = lambda t, q=q, i=i: 2.0 * (y[i] - q(t)) * (t - (y[i] < q(t)))  # noqa: E731
        ref = integrate.quad(pin, 0.0, 1.0, points=[star] if star else None, epsabs=1e-14, limit=200)[0]
        assert abs(ours[i] - ref) < TOL, (i, ours[i], ref)


def test_bernstein_crps_is_the_limit_of_scoringrules_crps_quantile():
    """crps_quantile on a dense midpoint grid of 20 000 levels approaches the exact CRPS (error O(h^2),
    ~1e-9 of the spread here, so this comparison is looser than the integration above)."""
    coef, y = _bernstein_cases(N)
    levels = (np.arange(20_000) + 0.5) / 20_000
    dist = D.Bernstein(T(coef))
    law, p = law_of(dist)
    grid = law.quantile(p, levels[:, None]).T  # (N, levels)
    assert np.abs(dist.crps(T(y)).numpy() - sr.crps_quantile(y, grid, levels)).max() < 1e-6


# --- log score, cdf and quantiles against scipy ---------------------------------------------------
def _scipy_laws():
    """(our distribution, scipy frozen law, the shift of scipy's variable, the point mass at 0 or None)."""
    g = rng()
    n = 50  # as in the test below
    mu, s = g.normal(1, 2, n), g.lognormal(0, 0.5, n)
    k, theta, shift = g.lognormal(0, 0.7, n), g.lognormal(0, 0.5, n), g.uniform(0.05, 1.0, n)
    return [
        (D.Gaussian(T(mu), T(s)), stats.norm(mu, s), 0.0, False),
        (D.TruncNormal(T(mu), T(s)), stats.truncnorm(-mu / s, np.inf, loc=mu, scale=s), 0.0, False),
        (D.CensoredLogistic(T(mu), T(s)), stats.logistic(mu, s), 0.0, True),
        (D.CensoredShiftedGamma(T(k), T(theta), T(shift)), stats.gamma(k, scale=theta), shift, True),
    ]


@pytest.mark.parametrize("case", range(4), ids=["gaussian", "truncnormal", "clogistic", "csg"])
def test_log_score_cdf_and_quantile_match_scipy(case):
    ours, law, shift, censored = _scipy_laws()[case]
    fam, p = law_of(ours)  # cdf, survival function and quantiles: the law's (datasets/laws.py)
    n = 50
    tau = np.linspace(0.02, 0.98, n)
    x = np.abs(law.ppf(tau) - shift) + 0.01  # > 0: the continuous part
    assert np.allclose(ours.log_score(T(x)).numpy(), -law.logpdf(x + shift), rtol=1e-10, atol=1e-12)
    assert np.allclose(fam.cdf(p, x), law.cdf(x + shift), rtol=0, atol=1e-12)
    assert np.allclose(fam.sf(p, x), law.sf(x + shift), rtol=1e-10, atol=1e-14)
    q_ref = law.ppf(tau) - shift
    if censored:  # Y = max(0, X - shift): the atom at 0 scores -log P(Y = 0)
        assert np.allclose(ours.log_score(T(np.zeros(n))).numpy(), -law.logcdf(shift), rtol=1e-10)
        q_ref = np.maximum(q_ref, 0.0)
    assert np.allclose(fam.quantile(p, tau), q_ref, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", D.names())
def test_quantile_and_cdf_round_trip(name):
    """F(Q(tau)) = tau on the continuous part, across extreme parameters (mu/s down to -60 for the
    truncated normal: its quantiles then come from Newton steps in log space)."""
    g = rng()
    n = 200
    cls = D.get(name)
    raw = g.normal(0, 1.0, (n, cls.n_raw))
    raw[:20, 0] = -60.0  # far below the ensemble: mu/s ~ -60, nearly all mass at 0 when censored
    law, p = law_of(cls.from_raw(T(raw), T(g.normal(0, 2, n)), T(g.lognormal(0, 0.5, n))))
    tau = g.uniform(0.001, 0.999, n)
    q = law.quantile(p, tau)
    atom = law.cdf(p, np.zeros(n)) if law.lower is not None else np.zeros(n)
    cont = tau > atom + 1e-9
    assert np.allclose(law.cdf(p, q)[cont], tau[cont], rtol=0, atol=1e-9)
    assert (q[~cont] == 0).all()  # tau inside the point mass: the quantile is 0


@pytest.mark.parametrize("name", ["clogistic", "csg"])
def test_precipitation_families_never_go_below_zero(name):
    g = rng()
    n = 300
    cls = D.get(name)
    raw = g.normal(0, 3.0, (n, cls.n_raw))
    law, p = law_of(cls.from_raw(T(raw), T(g.normal(0, 3, n)), T(g.lognormal(0, 1, n))))
    tau = np.linspace(1e-6, 1 - 1e-6, 201)[:, None]  # (levels, 1) against (N,)
    assert float(law.quantile(p, tau).min()) >= 0.0
    assert float(law.cdf_left(p, np.zeros(n)).max()) == 0.0  # P(Y < 0)
    assert float(law.cdf(p, np.full(n, -1e-9)).max()) == 0.0
    assert float(law.sf(p, -1.0).min()) == 1.0


@pytest.mark.parametrize("name", D.names())
def test_randomised_pit_of_draws_is_uniform(name):
    """Outcomes drawn from the law itself (Q(U)) have a uniform randomised PIT, point mass included."""
    g = np.random.default_rng(7)
    n = 4000
    cls = D.get(name)
    raw = np.tile(g.normal(0, 0.5, cls.n_raw), (n, 1))
    raw[:, 0] = -1.0  # some mass at 0 for the censored families
    law, p = law_of(cls.from_raw(T(raw), T(np.full(n, 0.5)), T(np.ones(n))))
    y = law.quantile(p, g.random(n))
    pit = law.pit(p, y, g.random(n))
    assert stats.kstest(pit, "uniform").pvalue > 1e-3


def test_bernstein_log_score_is_minus_log_density():
    coef, _ = _bernstein_cases(30)
    dist = D.Bernstein(T(coef[1:]))
    law, p = law_of(dist)
    y = law.quantile(p, np.full(29, 0.37))
    h = 1e-6 * (coef[1:, -1] - coef[1:, 0])
    dens = (law.cdf(p, y + h) - law.cdf(p, y - h)) / (2 * h)
    assert np.allclose(dist.log_score(T(y)).numpy(), -np.log(dens), rtol=1e-6)
    assert bool(torch.isinf(dist.log_score(T(coef[1:, -1] + 1.0))).all())


# --- gradients and the head -----------------------------------------------------------------------
@pytest.mark.parametrize("name", D.names())
def test_crps_gradients_match_finite_differences(name):
    """The loss's gradients through the head, raw outputs and outcome (CSG: the incomplete gamma's
    shape derivative is itself a central difference; Bernstein: tau* = F(y) carries no gradient)."""
    g = np.random.default_rng(3)
    cls = D.get(name)
    raw = T(g.normal(0, 0.5, (6, cls.n_raw))).requires_grad_()
    m, s = T(g.uniform(0.5, 2.0, 6)), T(g.uniform(0.5, 2.0, 6))
    y = T(g.uniform(0.1, 3.0, 6)).requires_grad_()
    assert torch.autograd.gradcheck(lambda r, v: cls.from_raw(r, m, s).crps(v), (raw, y), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", D.names())
def test_zero_raw_outputs_give_the_raw_ensemble_spread(name):
    """raw = 0 is where every model starts (zero-initialised last layer): a law of the ensemble's scale."""
    n = 5
    m, s = T(np.full(n, 3.0)), T(np.full(n, 1.5))
    law, p = law_of(D.get(name).from_raw(T(np.zeros((n, D.get(name).n_raw))), m, s))
    iqr = law.quantile(p, 0.75) - law.quantile(p, 0.25)
    assert np.all((iqr > 0.5 * 1.349 * 1.5) & (iqr < 2.0 * 1.349 * 1.5))  # N(m, s) has IQR 1.349 s


def test_unknown_family_names_the_choices():
    with pytest.raises(ConfigError, match=r"model.distribution 'weibull': choose one of .*bernstein.*truncnormal"):
        D.get("weibull")


# --- one distribution head on every architecture ------------------------------------------------------
H, W, M = 7, 10, 5
SPEC = {"target": "t850", "variables": ["z", "t", "u"], "season_features": False, "members": True}


def _model(kind: str, distribution: str) -> PostProcessor:
    net = {"base_filters": 4} if "base_filters" in {f.name for f in dataclasses.fields(registry.get(kind))} else {}
    return PostProcessor(kind, net=net, sample=SPEC, grid=(H, W), n_members=M, distribution=distribution)


def _batch(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 9, H, W, generator=g)  # the model's statistics are 0/1: physical = normalised
    m = 2.0 + torch.rand(2, H, W, generator=g)
    y = (m + torch.randn(2, H, W, generator=g)).clamp_min(0.0)  # >= 0 for the censored / truncated families
    y[0, 0, :3] = float("nan")  # missing truth is ignored
    return {
        "fields": x[:, :6],
        "features": x[:, 6:],
        "members": torch.randn(2, M, 3, H, W, generator=g),
        "m": m,
        "s": torch.rand(2, H, W, generator=g) + 0.5,
        "y": y,
    }


@pytest.mark.parametrize("distribution", D.names())
@pytest.mark.parametrize("kind", sorted(registry.architectures()))
def test_every_architecture_trains_every_distribution(kind, distribution):
    """The zero-initialised head gives from_raw(0) (the raw ensemble's scale); a few steps lower the CRPS."""
    torch.manual_seed(0)
    model, b = _model(kind, distribution), _batch()
    model.eval()
    with torch.no_grad():
        start = model.predictive(b)
    zero = D.get(distribution).from_raw(torch.zeros(2, H, W, D.get(distribution).n_raw), b["m"], b["s"])
    for k, v in zero.params.items():
        torch.testing.assert_close(start.params[k], v, rtol=1e-4, atol=1e-5)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    scores = []
    for _ in range(6):
        opt.zero_grad()
        loss = crps_loss(model.net, {**model.normalise(b), "y": b["y"]}, distribution)
        scores.append(float(loss.detach()))
        if model.smoe_layer is not None:
            loss = loss + model.smoe_layer.rc_loss(loss)
        loss.backward()
        assert all(bool(torch.isfinite(p.grad).all()) for p in model.parameters() if p.grad is not None)
        opt.step()
    assert scores[-1] < scores[0]
    assert set(model.predict_step(b, 0)) == set(zero.params)


@pytest.mark.parametrize("kind", sorted(registry.architectures()))
def test_gaussian_distribution_reproduces_the_ens10_head(kind):
    """distribution: gaussian gives exactly what the (a, b) head gave: mu = m + s a, sigma = s exp(b) and
    the Gaussian kernel's CRPS, with the same parameters (checkpoints keep loading)."""
    torch.manual_seed(1)
    model, b = _model(kind, "gaussian"), _batch(1)
    with torch.no_grad():
        for p in model.net.parameters():
            p.add_(0.05 * torch.randn_like(p))  # away from the zero start
    model.eval()
    with torch.no_grad():
        mu, sigma = model(b)
        a, s = model.net(model.normalise(b))
        floor = b["s"].clamp_min(1e-6)  # the head's: mu = m + s a, sigma = s exp(b)
        ref_mu, ref_sigma = b["m"] + floor * a, floor * torch.exp(s)
    assert torch.equal(mu, ref_mu) and torch.equal(sigma, ref_sigma)
    assert not any(".extra" in k for k in model.state_dict())
    ok = torch.isfinite(b["y"])
    assert torch.equal(
        model.predictive(b).select(ok).crps(b["y"][ok]), kernels.crps_gaussian(mu[ok], sigma[ok], b["y"][ok])
    )


def test_a_non_gaussian_model_refuses_to_give_mu_sigma():
    """forecast and evaluate read (mu, sigma) through forward: a CSG model stops them with the fix."""
    with pytest.raises(BadInputError, match=r"'csg' distribution.*model.distribution: gaussian"):
        _model("mlp", "csg")(_batch())


def test_unknown_distribution_in_a_model_is_a_config_error():
    with pytest.raises(ConfigError, match=r"model.distribution 'weibull': choose one of \[.*'csg'"):
        _model("emos", "weibull")


@pytest.mark.battery
def test_train_with_an_unknown_distribution_is_a_usage_error(store, tmp_path, capsys):
    assert_ok(
        "train fit: distribution weibull",
        in_process(
            [
                "train",
                "fit",
                "-c",
                str(ROOT / "configs/train/tiny_emos_t2m.yaml"),
                "--data.cfg.store",
                str(store),
                "--model.distribution",
                "weibull",
                "--trainer.default_root_dir",
                str(tmp_path / "runs"),
            ],
            capsys,
        ),
    )


@pytest.mark.battery
def test_config_validate_names_an_unknown_distribution(tmp_path, capsys):
    preset = tmp_path / "weibull.yaml"
    preset.write_text("model: {family: emos, distribution: weibull}\ndata: {cfg: {sample: {target: t2m}}}\n")
    res = in_process(["config", "validate", str(preset)], capsys)
    assert_ok("config validate: distribution weibull", res)
    assert "weibull" in res.error_lines[0]
