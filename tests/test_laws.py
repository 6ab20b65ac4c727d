"""The predictive laws (postcast.datasets.laws, numpy/scipy): each family's survival function and quantiles
against scipy.stats (the Bernstein law against scipy's own Bernstein polynomial, BPoly, and brentq), and its
cdf against the integral of the density the torch side scores with (exp(-log_score) of
postcast.models.distributions), on a few parameter sets each, extreme ones included."""

import math

import numpy as np
import pytest
import torch
from scipy import integrate, interpolate, optimize, stats

from postcast.datasets import laws
from postcast.datasets.core.errors import ConfigError
from postcast.models import distributions as D

# parameter sets per family, one per point (shape S = (4,)): ordinary laws, one close to 0, one far below
CASES = {
    "gaussian": {"mu": [2.0, 0.3, -1.0, 280.0], "sigma": [1.0, 0.5, 2.0, 0.01]},
    "truncnormal": {"mu": [5.0, 0.3, -3.0, -12.0], "sigma": [1.0, 0.5, 1.0, 2.0]},
    "clogistic": {"loc": [5.0, 0.3, -2.0, -20.0], "scale": [1.0, 0.5, 1.0, 0.7]},
    "csg": {"shape": [4.0, 0.7, 2.0, 38.4], "scale": [1.0, 2.0, 0.5, 0.081], "shift": [0.5, 0.1, 3.0, 3.33]},
    "bernstein": {"coef": np.cumsum(np.abs(np.random.default_rng(0).normal(size=(13, 4))), axis=0) - 2.0},
}
LEVELS = np.array([0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99])


def params(family: str) -> laws.Params:
    return {k: np.asarray(v, dtype=np.float64) for k, v in CASES[family].items()}


def at(p: laws.Params, i: int) -> dict[str, np.ndarray]:
    return {k: v[..., i] for k, v in p.items()}


def scipy_sf(family: str, v: dict[str, np.ndarray], t: float) -> float:
    """P(Y > t) of one parameter set by scipy alone (a law on [0, inf): 1 below 0)."""
    if family == "gaussian":
        return float(stats.norm.sf(t, v["mu"], v["sigma"]))
    if family == "bernstein":
        q = interpolate.BPoly(v["coef"][:, None], [0.0, 1.0])
        if t <= q(0.0) or t >= q(1.0):
            return float(t < q(0.0))
        return 1.0 - optimize.brentq(lambda tau: q(tau) - t, 0.0, 1.0, xtol=1e-15)
    if t < 0:
        return 1.0
    if family == "truncnormal":
        return float(stats.truncnorm.sf(t, -v["mu"] / v["sigma"], np.inf, loc=v["mu"], scale=v["sigma"]))
    if family == "clogistic":  # Y = max(0, X): P(Y > t) = P(X > t) from 0 up
        return float(stats.logistic.sf(t, v["loc"], v["scale"]))
    return float(stats.gamma.sf(t + v["shift"], v["shape"], scale=v["scale"]))  # csg: Y = max(0, X - shift)


def scipy_quantile(family: str, v: dict[str, np.ndarray], tau: np.ndarray) -> np.ndarray:
    if family == "gaussian":
        return stats.norm.ppf(tau, v["mu"], v["sigma"])
    if family == "truncnormal":
        return stats.truncnorm.ppf(tau, -v["mu"] / v["sigma"], np.inf, loc=v["mu"], scale=v["sigma"])
    if family == "clogistic":  # censoring maps every level inside the point mass to 0
        return np.maximum(stats.logistic.ppf(tau, v["loc"], v["scale"]), 0.0)
    if family == "csg":
        return np.maximum(stats.gamma.ppf(tau, v["shape"], scale=v["scale"]) - v["shift"], 0.0)
    return interpolate.BPoly(v["coef"][:, None], [0.0, 1.0])(tau)  # Bernstein: Q itself


def thresholds(family: str, v: dict[str, np.ndarray]) -> np.ndarray:
    """Thresholds across the law: below 0, at 0, and at its 1 %, 30 %, 70 % and 99.9 % points."""
    inner = scipy_quantile(family, v, np.array([0.01, 0.3, 0.7, 0.999]))
    return np.unique(np.r_[-1.0, 0.0, inner])


@pytest.mark.parametrize("family", sorted(CASES))
def test_survival_function_and_quantiles_match_scipy(family):
    law, p = laws.get(family), params(family)
    for i in range(4):
        v = at(p, i)
        t = thresholds(family, v)
        want = np.array([scipy_sf(family, v, float(x)) for x in t])
        np.testing.assert_allclose(law.sf(v, t), want, rtol=1e-9, atol=1e-12, err_msg=f"{family} {i}")
        np.testing.assert_allclose(law.cdf(v, t), 1.0 - want, rtol=1e-9, atol=1e-12, err_msg=f"{family} {i}")
        q = law.quantile(v, LEVELS)
        np.testing.assert_allclose(q, scipy_quantile(family, v, LEVELS), rtol=1e-8, atol=1e-9, err_msg=f"{family} {i}")
    # on all points at once (shape S), with a threshold or a level per point: the same numbers
    t = np.array([thresholds(family, at(p, i))[-1] for i in range(4)])
    np.testing.assert_allclose(
        law.sf(p, t), [scipy_sf(family, at(p, i), t[i]) for i in range(4)], rtol=1e-9, atol=1e-12
    )
    assert law.quantile(p, LEVELS[:, None]).shape == (len(LEVELS), 4)


@pytest.mark.parametrize("family", sorted(CASES))
def test_cdf_integrates_the_density_the_torch_side_scores(family):
    """F(b) - F(a) = int_a^b exp(-log_score(y)) dy on the continuous part, and P(Y = 0) = exp(-log_score(0))
    for a censored law: the numpy law and the torch family describe one law."""
    law, p = laws.get(family), params(family)
    dist = D.get(family)(**{k: torch.from_numpy(np.moveaxis(v, 0, -1) if v.ndim == 2 else v) for k, v in p.items()})
    for i in range(4):
        v = at(p, i)
        one = dist.select(torch.arange(4) == i)

        def density(y: float, one: D.Distribution = one) -> float:
            with torch.no_grad():
                return math.exp(-float(one.log_score(torch.tensor([y], dtype=torch.float64))))

        a, b = (float(x) for x in law.quantile(v, np.array([0.4, 0.9])))
        if law.lower is not None:
            a = max(a, 1e-9)  # the continuous part of a law on [0, inf)
        if b <= a:
            continue  # (both levels inside the point mass)
        mass = integrate.quad(density, a, b, epsabs=1e-13, epsrel=1e-11, limit=200)[0]
        assert mass == pytest.approx(float(law.cdf(v, b) - law.cdf(v, a)), rel=1e-8, abs=1e-12), (family, i)
        if family in ("clogistic", "csg"):  # a point mass at 0
            # rel 1e-8: torch's incomplete gamma is ~4e-10 off above shape 20 (docs/distributions.md), scipy's not
            assert density(0.0) == pytest.approx(float(law.cdf(v, 0.0)), rel=1e-8, abs=1e-300)
            assert float(law.cdf_left(v, 0.0)) == 0.0


@pytest.mark.parametrize("family", sorted(CASES))
def test_moments_match_scipy_where_scipy_has_them(family):
    law, p = laws.get(family), params(family)
    mean, std = law.moments(p)
    assert mean.shape == std.shape == (4,)
    if family == "truncnormal":
        ref = stats.truncnorm(-p["mu"] / p["sigma"], np.inf, loc=p["mu"], scale=p["sigma"])
        np.testing.assert_allclose(mean, ref.mean(), rtol=1e-9)
        np.testing.assert_allclose(std, ref.std(), rtol=1e-7)
    elif family == "gaussian":
        assert np.array_equal(mean, p["mu"]) and np.array_equal(std, p["sigma"])
    else:  # E Y = int_0^inf P(Y > y) dy - int_-inf^0 P(Y < y) dy (Bernstein: on [a_0, a_d])
        for i in range(4):
            v = at(p, i)
            lo, hi = (min(v["coef"][0], 0.0), v["coef"][-1]) if family == "bernstein" else (0.0, np.inf)
            m1 = (
                integrate.quad(lambda y, v=v: float(law.sf(v, y)), 0.0, hi, limit=200)[0]
                - integrate.quad(lambda y, v=v: float(law.cdf(v, y)), lo, 0.0, limit=200)[0]
            )
            assert mean[i] == pytest.approx(m1, rel=1e-6, abs=1e-9), (family, i)


def test_each_torch_family_has_a_law_with_its_parameters():
    assert D.names() == laws.names() == ["bernstein", "clogistic", "csg", "gaussian", "truncnormal"]
    for name in D.names():
        law = laws.get(name)
        assert law.name == name and list(D.get(name).__dataclass_fields__) == list(law.names)
    units = {name: {p.name: p.units_of("mm") for p in laws.get(name).parameters} for name in laws.names()}
    assert units["csg"] == {"shape": "1", "scale": "mm", "shift": "mm"}  # the gamma's shape is dimensionless
    assert units["gaussian"] == {"mu": "mm", "sigma": "mm"}
    assert [p.vector for p in laws.get("bernstein").parameters] == [True]  # coef: (K, *S)


def test_the_location_scale_families_are_those_whose_head_shifts_and_scales():
    """laws.location_scale() is the one list (the local EMOS's Newton default and standard form read it): a
    family is in it when its torch head's two raw outputs (a, b) are a location offset and a log scale in
    units of s, so raw (a, b) on (m, s) is raw (0, 0) on (m + s a, s exp(b))."""
    gen = torch.Generator().manual_seed(0)
    raw, m = torch.randn(5, 2, generator=gen, dtype=torch.float64), torch.randn(5, dtype=torch.float64)
    s = torch.rand(5, generator=gen, dtype=torch.float64) + 0.5

    def shifts_and_scales(name: str) -> bool:
        if D.get(name).n_raw != 2:
            return False
        got, want = (
            D.get(name).from_raw(raw, m, s),
            D.get(name).from_raw(0 * raw, m + s * raw[:, 0], s * raw[:, 1].exp()),
        )
        return all(torch.allclose(getattr(got, f), getattr(want, f)) for f in laws.get(name).names)

    assert laws.location_scale() == ("clogistic", "gaussian", "truncnormal")
    assert laws.location_scale() == tuple(n for n in laws.names() if shifts_and_scales(n))


def test_an_unknown_family_is_a_config_error_naming_the_families():
    with pytest.raises(
        ConfigError,
        match=r"'nope': choose one of \['bernstein', 'clogistic', 'csg', 'gaussian', "
        r"'truncnormal'\]",
    ):
        laws.get("nope")
