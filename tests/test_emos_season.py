"""The local EMOS's seasonal terms (``model.net.season``, postcast.models.emos_forms): the location gains
a_sin sin(day) + a_cos cos(day). Checked against scipy fitting the operational form with the two harmonics
(mu = a + b m + c sin + d cos, sigma^2 = e^2 + f^2 s^2, CRPS written out in numpy; for precipitation, Scheuerer
and Hamill's censored shifted gamma whose mean the harmonics scale, CRPS from scoringrules), against autograd's
Hessian and Jacobian, against the form without them (the terms at zero), and on a planted seasonal bias (a
seasonal factor of the rain's mean) that only they recover."""

import math

import numpy as np
import pytest
import scoringrules as sr
import torch
from scipy import optimize
from test_emos_optimum import crps_normal_numpy
from test_emos_standard import SH_THETA, assert_sh_pieces_are_autograds, sh_law

from postcast.datasets.core.errors import ConfigError
from postcast.models import emos_forms, emos_objective, registry
from postcast.models.emos_fit import fit
from postcast.models.emos_objective import Model, PointData, crps_per_point

TOL = 1e-5  # training CRPS within 1e-5 of scipy's per-point fit, as the standard form's (test_emos_standard.py)
AMPLITUDE = 1.5  # K of the planted seasonal bias, peaking at day 91


def seasonal(points: int, dates: int, seed: int, amplitude: float = AMPLITUDE) -> PointData:
    """Dates spread over 3 years; the truth is N(m + bias + amplitude sin(day), (1.4 s)^2): a bias that follows
    the season, the same at every point, beside a static one of each point's own."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    day = 2.0 * math.pi * torch.rand(points, dates, generator=g, dtype=torch.float64)  # (P, N) angle in the year
    xm, xs = rand(points, dates), rand(points, dates)
    m, s = 280.0 + 3.0 * xm, torch.exp(0.3 * xs)
    y = m + rand(points, 1) + amplitude * torch.sin(day) + 1.4 * s * rand(points, dates)
    d = PointData(xm, xs, m, s, y, torch.full_like(y, 1.0 / dates), season=torch.stack([day.sin(), day.cos()], -1))
    return d.with_unit(d.training_unit())


def without_season(d: PointData) -> PointData:
    return PointData(d.xm, d.xs, d.m, d.s, d.y, d.w, d.u)


def scipy_seasonal(d: PointData, p: int) -> float:
    """Point p's lowest mean training CRPS scipy reaches on (a, b, c, d, e, f) of the operational form with the
    two harmonics: Nelder-Mead from least squares, then BFGS."""
    m, s, y, w = (t[p].numpy() for t in (d.m, d.s, d.y, d.w))
    sin, cos = d.season[p, :, 0].numpy(), d.season[p, :, 1].numpy()

    def f(x: np.ndarray) -> float:
        sigma = np.sqrt(x[4] ** 2 + x[5] ** 2 * s**2)
        return float(np.sum(w * crps_normal_numpy(x[0] + x[1] * m + x[2] * sin + x[3] * cos, sigma, y)))

    design = np.column_stack([np.ones_like(m), m, sin, cos])
    ls, *_ = np.linalg.lstsq(design, y, rcond=None)
    x0 = np.concatenate([ls, [np.std(y - design @ ls) / 2, 1.0]])
    nm = optimize.minimize(f, x0, method="Nelder-Mead", options={"xatol": 1e-10, "fatol": 1e-13, "maxiter": 20000})
    bfgs = optimize.minimize(f, nm.x, method="BFGS", options={"gtol": 1e-10})
    return min(nm.fun, bfgs.fun)


@pytest.mark.parametrize("form", ["spread", "standard"])
def test_the_seasonal_terms_at_zero_are_the_form_without_them(form):
    d = seasonal(points=3, dates=20, seed=0)
    theta = torch.tensor([[0.3, -0.2, -0.5, 0.1], [0.0, 0.0, 0.2, 0.9], [-1.0, 0.5, 0.4, 0.4]], dtype=torch.float64)
    with_terms = torch.cat([theta, torch.zeros(3, emos_forms.SEASON, dtype=torch.float64)], dim=1)
    assert emos_forms.coefficients(2, d) == 6 and emos_forms.coefficients(2, without_season(d)) == 4
    torch.testing.assert_close(
        emos_forms.raw(with_terms, d, form), emos_forms.raw(theta, without_season(d), form), rtol=0, atol=0
    )


@pytest.mark.parametrize("form", ["spread", "standard"])
def test_the_solvers_hessian_with_seasonal_terms_is_autograds(form):
    d = seasonal(points=2, dates=30, seed=4)
    theta = torch.tensor([[0.2, -0.1, -0.3, 0.2, 0.4, -0.2], [-0.4, 0.3, 0.5, -0.6, -0.1, 0.3]], dtype=torch.float64)
    _, _, grad = emos_objective.value_grad(theta, d, Model("gaussian", form))
    ours = emos_objective.hessian(theta, grad, d, Model("gaussian", form))
    for p in range(2):
        one = d.take(torch.tensor([p]))
        exact = torch.autograd.functional.hessian(
            lambda t, one=one: crps_per_point(t[None], one, "gaussian", form)[0], theta[p]
        )
        torch.testing.assert_close(ours[p], exact, rtol=1e-4, atol=1e-7)


def test_a_seasonal_bias_is_recovered_by_the_seasonal_terms_and_missed_without_them():
    """Fitted on 300 dates and scored on 300 others: with the terms, the location's sine coefficient times the
    unit is the planted amplitude (the points' mean to 0.2 K, about 3.5 standard errors; each to 0.5 K) and the
    cosine's near 0; without them the held-out CRPS is worse by more than a tenth of the amplitude."""
    train, test = seasonal(points=4, dates=300, seed=2), seasonal(points=4, dates=300, seed=2 + 100)
    theta, _ = fit(train, "gaussian", form="standard")
    amplitude, cosine = theta[:, 4] * train.u[:, 0], theta[:, 5] * train.u[:, 0]  # (P,) K
    assert abs(amplitude.mean() - AMPLITUDE) < 0.2 and (amplitude - AMPLITUDE).abs().max() < 0.5, amplitude
    assert cosine.mean().abs() < 0.2 and cosine.abs().max() < 0.5, cosine
    plain, _ = fit(without_season(train), "gaussian", form="standard")
    test = test.with_unit(train.u[:, 0])
    with torch.no_grad():
        seasonal_crps = crps_per_point(theta, test, "gaussian", "standard").mean()
        plain_crps = crps_per_point(plain, without_season(test), "gaussian", "standard").mean()
    assert plain_crps - seasonal_crps > 0.1 * AMPLITUDE * 0.5  # the bias's mean absolute value is 0.64 amplitude


def test_the_seasonal_terms_need_the_season_and_the_newton_solver():
    io = registry.NetIO(in_channels=6, grid=(3, 4), n_members=5, n_variables=1, target_variable=0)
    with pytest.raises(ConfigError, match="season_features: true"):
        registry.make("emos", {"season": True}).build(io)  # no season among the inputs
    seasonal_io = registry.NetIO(6, (3, 4), 5, 1, 0, season_channels=(4, 5))
    with pytest.raises(ConfigError, match="newton solver"):
        registry.make("emos", {"season": True, "solver": "gradient"}).build(seasonal_io)
    net = registry.make("emos", {"season": True}).build(seasonal_io)
    assert net.season is not None and net.season.shape == (2, 3, 4) and net.theta().shape == (12, 6)
    rain = registry.make("emos", {"season": True, "solver": "newton", "form": "sh"}).build(
        registry.NetIO(6, (3, 4), 5, 1, 0, outputs=3, season_channels=(4, 5))
    )  # the censored shifted gamma: (a0, a1, b0, b1, c2) and the two terms
    assert rain.theta().shape == (12, 7)


RAIN_AMPLITUDE = 0.4  # the planted seasonal factor of the rain's mean: exp(0.4 sin(day)), 0.67 to 1.49


def seasonal_rain(points: int, dates: int, seed: int, amplitude: float = RAIN_AMPLITUDE) -> PointData:
    """Dates spread over 3 years; the truth is max(0, X - 0.5), X a gamma of mean (m + 0.5) r exp(amplitude
    sin(day)) and std 0.8 s + 0.2, r a wetness of each point's own: a factor of the mean that follows the
    season."""
    g = torch.Generator().manual_seed(seed)
    day = 2.0 * math.pi * torch.rand(points, dates, generator=g, dtype=torch.float64)  # (P, N) angle in the year
    xm, xs = (torch.randn(points, dates, generator=g, dtype=torch.float64) for _ in range(2))
    m, s = torch.nn.functional.softplus(2.0 * xm), torch.exp(0.3 * xs)  # (P, N) mm
    wet = 1.0 + 0.2 * torch.rand(points, 1, generator=g, dtype=torch.float64)
    mean, std = (m + 0.5) * wet * torch.exp(amplitude * day.sin()), 0.8 * s + 0.2
    gamma = np.random.default_rng(seed).gamma((mean / std).square().numpy(), (std.square() / mean).numpy())
    y = (torch.as_tensor(gamma) - 0.5).clamp_min(0.0)
    d = PointData(xm, xs, m, s, y, torch.full_like(y, 1.0 / dates), season=torch.stack([day.sin(), day.cos()], -1))
    return d.with_unit(d.training_unit())


SH_SEASON = torch.cat([SH_THETA, torch.tensor([[0.3, -0.2], [0.0, 0.5], [-0.4, 0.1]], dtype=torch.float64)], 1)


def test_the_sh_forms_seasonal_terms_at_zero_are_the_form_without_them():
    d = seasonal_rain(points=3, dates=20, seed=0)
    with_terms = torch.cat([SH_THETA, torch.zeros(3, emos_forms.SEASON, dtype=torch.float64)], dim=1)
    assert emos_forms.coefficients(3, d) == 7 and emos_forms.coefficients(3, without_season(d)) == 5
    torch.testing.assert_close(
        emos_forms.raw(with_terms, d, "sh"), emos_forms.raw(SH_THETA, without_season(d), "sh"), rtol=0, atol=0
    )


def test_the_sh_forms_seasonal_columns_and_curvature_are_autograds():
    assert_sh_pieces_are_autograds(SH_SEASON, seasonal_rain(points=3, dates=40, seed=1))


def scipy_seasonal_rain(d: PointData, p: int) -> float:
    """Point p's lowest mean training CRPS scipy reaches on Scheuerer and Hamill's law with the gamma's mean
    scaled by exp(c sin + d cos) (:func:`test_emos_standard.sh_law`, scoringrules' CRPS): Nelder-Mead from the
    raw ensemble, then BFGS."""
    at = d.take(torch.tensor([p]))
    sin, cos = at.season[0, :, 0].numpy(), at.season[0, :, 1].numpy()

    def f(x: np.ndarray) -> float:
        shape, scale, shift = sh_law(torch.as_tensor(x[None, :5]), at)
        factor = np.exp(x[5] * sin + x[6] * cos)  # of the gamma's mean; its std stays
        shape, scale = shape * factor**2, scale / factor
        with np.errstate(all="ignore"):
            v = sr.crps_csg0(at.y.numpy(), shape, scale=scale, shift=shift)
        return float((at.w.numpy() * v).sum()) if np.all(np.isfinite(v)) else 1e30

    x0 = np.array([0.0, 0.0, 0.3, 1.0, 0.0, 0.0, 0.0])
    nm = optimize.minimize(f, x0, method="Nelder-Mead", options={"xatol": 1e-10, "fatol": 1e-13, "maxiter": 40000})
    return min(nm.fun, optimize.minimize(f, nm.x, method="BFGS", options={"gtol": 1e-10}).fun)


@pytest.mark.parametrize(
    ("family", "form", "data", "reference"),
    [
        ("gaussian", "standard", lambda: seasonal(points=5, dates=80, seed=1), scipy_seasonal),
        ("csg", "sh", lambda: seasonal_rain(points=3, dates=80, seed=3), scipy_seasonal_rain),
    ],
    ids=["standard", "sh"],
)
def test_the_seasonal_form_reaches_scipys_fit_of_its_law(family, form, data, reference):
    """The operational form with the two harmonics (standard), Scheuerer and Hamill's law whose mean they scale
    (sh): postcast's fit at most scipy's per point + TOL."""
    d = data()
    theta, report = fit(d, family, form=form)
    assert theta.shape == (d.y.shape[0], 7 if form == "sh" else 6)
    with torch.no_grad():
        ours = crps_per_point(theta, d, family, form).numpy()
    for p in range(d.y.shape[0]):
        best = reference(d, p)
        assert ours[p] <= best + TOL, (p, ours[p], best)
    assert report.converged_points == report.points


def test_a_seasonal_factor_of_the_rain_is_recovered_by_the_sh_forms_terms_and_missed_without_them():
    """Fitted on 400 dates and scored on 400 others: the sine's coefficient is the planted log-amplitude (the
    points' mean to 0.1, each to 0.2), the cosine's near 0, and the held-out CRPS without the terms is worse."""
    train, test = seasonal_rain(points=4, dates=400, seed=5), seasonal_rain(points=4, dates=400, seed=5 + 100)
    theta, _ = fit(train, "csg", form="sh")
    amplitude, cosine = theta[:, 5], theta[:, 6]  # (P,)
    assert abs(amplitude.mean() - RAIN_AMPLITUDE) < 0.1 and (amplitude - RAIN_AMPLITUDE).abs().max() < 0.2, amplitude
    assert cosine.mean().abs() < 0.1 and cosine.abs().max() < 0.2, cosine
    plain, _ = fit(without_season(train), "csg", form="sh")
    test = test.with_unit(train.u[:, 0])
    with torch.no_grad():
        seasonal_crps = crps_per_point(theta, test, "csg", "sh")
        plain_crps = crps_per_point(plain, without_season(test), "csg", "sh")
    assert bool((seasonal_crps < plain_crps).all()), (seasonal_crps, plain_crps)


def test_a_seasonal_csg_fit_whose_optimum_is_the_censored_normal_limit_keeps_its_terms():
    """Truths of a normal censored at 0 whose mean follows the season a little (test_emos_optimum's world of the
    censored-normal limit, plus 0.1 s sin(day)): at point 0 the csg's optimum is its limit of an infinite shift,
    which the fit walks out to along a ray of shifts. The ray dropped the seasonal terms: an IndexError (the
    targets world's tp24 in the sh form too)."""
    g = np.random.default_rng(0)
    xm, xs = g.normal(size=(2, 120)), g.normal(size=(2, 120))
    s, m = 6.0 * np.exp(0.3 * xs), 5.0 + 5.0 * xm  # mm
    noise, day = g.normal(size=m.shape), np.random.default_rng(50).uniform(0.0, 2.0 * math.pi, size=(2, 120))
    y = np.maximum(0.0, m - 0.1 * s + 0.1 * s * np.sin(day) + s * noise)
    season = torch.as_tensor(np.stack([np.sin(day), np.cos(day)], -1))
    d = PointData(*(torch.as_tensor(a) for a in (xm, xs, m, s, y)), w=torch.full((2, 120), 1.0 / 120), season=season)
    theta, report = fit(d, "csg")
    assert theta.shape == (2, 7) and bool(torch.isfinite(theta).all())
    assert report.limit_points == 1 and theta[0, 4] > 1e5, (report, theta)  # point 0 out along the ray
    assert report.converged_points + report.stalled_points + report.limit_points == report.points
