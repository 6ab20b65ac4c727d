"""The local EMOS reaches its training-CRPS optimum (postcast.models.emos_fit): every point's coefficients
against scipy.optimize.minimize on the same objective to tight tolerance (the Gaussian's CRPS written out
here in numpy, independent of postcast; the other families through their closed form, checked against
scoringrules and numerical integration in tests/test_distributions.py), robustness where the members'
spread is 0 or every outcome is dry, and the ``postcast train`` preset's checkpoint at the optimum."""

from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import optimize, stats

from postcast.models import distributions, emos_bands, emos_fit
from postcast.models.emos_fit import FitSettings, fit
from postcast.models.emos_objective import PointData, crps_per_point
from postcast.pipeline.stopping import stop_reason

ROOT = Path(__file__).resolve().parents[1]
OPTIMUM_TOL = 1e-5  # the brief: postcast's training CRPS within 1e-5 of scipy's (or lower) at every point


def crps_normal_numpy(mu: np.ndarray, sigma: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Gneiting et al. (2005): sigma [z (2 Phi(z) - 1) + 2 phi(z) - 1 / sqrt(pi)], z = (y - mu) / sigma."""
    z = (y - mu) / sigma
    return sigma * (z * (2.0 * stats.norm.cdf(z) - 1.0) + 2.0 * stats.norm.pdf(z) - 1.0 / np.sqrt(np.pi))


def point_objective(d: PointData, p: int, family: str):
    """Point p's mean training CRPS as a function of its coefficients (numpy vector), for scipy."""
    xm, xs, m, s, y, w = (np.asarray(t[p]) for t in (d.xm, d.xs, d.m, d.s, d.y, d.w))
    one = PointData(*(t[p : p + 1] for t in (d.xm, d.xs, d.m, d.s, d.y, d.w)))

    def f(theta: np.ndarray) -> float:
        if family == "gaussian":
            mu, sigma = m + s * (theta[0] + theta[1] * xm), s * np.exp(theta[2] + theta[3] * xs)
            return float(np.sum(w * crps_normal_numpy(mu, sigma, y)))
        with torch.no_grad():
            value = float(crps_per_point(torch.as_tensor(theta, dtype=torch.float64)[None], one, family)[0])
        return value if np.isfinite(value) else 1e30

    return f


def scipy_optimum(f, starts: list[np.ndarray]) -> float:
    """The lowest value scipy reaches from each start: Nelder-Mead to tight tolerance, then BFGS."""
    best = np.inf
    for x0 in starts:
        nm = optimize.minimize(f, x0, method="Nelder-Mead", options={"xatol": 1e-10, "fatol": 1e-13, "maxiter": 4000})
        bfgs = optimize.minimize(f, nm.x, method="BFGS", options={"gtol": 1e-10})
        best = min(best, nm.fun, bfgs.fun)
    return best


def synthetic(family: str, points: int = 4, dates: int = 60, seed: int = 0) -> PointData:
    """Data of a world per family whose truth's mean and spread depend on the ensemble's through
    point-specific coefficients (precipitation: dry dates where the ensemble is dry or light). The optimum is
    finite there; a censored shifted gamma fitted to data better described by a censored normal has its
    optimum at an infinite shift (the fit then walks towards it: not a case for this test)."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    xm, xs = rand(points, dates), rand(points, dates)
    bias, slope = rand(points, 1), 0.5 + 0.3 * rand(points, 1).abs()
    s = torch.exp(0.3 * xs)  # (P, N)
    if family in ("gaussian",):
        m = 280.0 + 3.0 * xm
        y = m + bias + slope * s * rand(points, dates) + 0.3 * xm
    elif family == "truncnormal":
        m = (5.0 + 2.0 * xm).clamp_min(0.3)
        y = (0.9 * m + bias + slope * s * rand(points, dates)).abs()
    else:  # precipitation: a censored shifted gamma truth, shift 0.5, whose mean and std follow the ensemble's
        m = torch.nn.functional.softplus(2.0 * xm)
        mean, std = (m + 0.5) * (1.0 + 0.2 * bias.abs()), 0.8 * s + 0.2
        gamma = np.random.default_rng(seed).gamma((mean / std).square().numpy(), (std.square() / mean).numpy())
        y = (torch.as_tensor(gamma) - 0.5).clamp_min(0.0)
    w = torch.full_like(y, 1.0 / dates)
    return PointData(xm, xs, m, s.clamp_min(1e-6), y, w)


SLOW = pytest.mark.slow  # scipy's per-point fits of the non-Gaussian families take 10-40 s on a loaded 2-core machine


@pytest.mark.parametrize(
    "family", ["gaussian", pytest.param("truncnormal", marks=SLOW), pytest.param("clogistic", marks=SLOW),
               pytest.param("csg", marks=SLOW)]
)  # fmt: skip
def test_fit_reaches_the_scipy_optimum(family):
    """At every point, the vectorised fit's training CRPS is at most scipy's optimum + 1e-5 (it is found to
    ~1e-10 in practice), and the report says every point converged."""
    d = synthetic(family)
    theta, report = fit(d, family)
    with torch.no_grad():
        ours = crps_per_point(theta, d, family).numpy()
    n = theta.shape[1]
    for p in range(theta.shape[0]):
        f = point_objective(d, p, family)
        assert abs(f(theta[p].numpy()) - ours[p]) < 1e-9  # the same objective
        reference = scipy_optimum(f, [np.zeros(n), theta[p].numpy()])
        assert ours[p] <= reference + OPTIMUM_TOL, (p, ours[p], reference)
        assert ours[p] <= reference + 1e-8, (p, ours[p], reference)  # in fact to scipy's own precision
    assert report.converged_points + report.stalled_points == report.points
    assert report.crps_fit < report.crps_raw and report.grad_norm_max < 1e-5


@SLOW
def test_a_censored_shifted_gamma_whose_optimum_is_its_censored_normal_limit():
    """Truth drawn from a censored normal: the csg's CRPS falls towards its limit like 1 / shift, with no
    minimum. Where the gradient in the shape is still exact (raw shift c up to ~3,000) the descent stopped
    1e-4 above what scipy's Nelder-Mead reached by walking the shift out (c ~ 1e6 at one point of the targets
    world); the fit's ray along the shift (emos_fit.RAY) ends within 1e-5 of it (or lower). Here point 0's
    optimum is the limit and point 1's is finite."""
    g = np.random.default_rng(0)
    xm, xs = g.normal(size=(2, 120)), g.normal(size=(2, 120))
    s, m = 6.0 * np.exp(0.3 * xs), 5.0 + 5.0 * xm  # mm: at c = 1,000 the CRPS is 2.5e-5 above its limit
    y = np.maximum(0.0, m - 0.1 * s + s * g.normal(size=m.shape))  # 27 and 33 % dry
    d = PointData(*(torch.as_tensor(a) for a in (xm, xs, m, s, y)), w=torch.full((2, 120), 1.0 / 120))
    theta, report = fit(d, "csg")
    with torch.no_grad():
        ours = crps_per_point(theta, d, "csg").numpy()
    # issue 54: point 0 is settled at the limit, its CRPS within tol_limit (1 + CRPS) of it, not left unconverged
    assert report.limit_points == 1 and report.converged_points + report.stalled_points == 1, report
    assert 0.0 < report.limit_gap_max <= FitSettings.tol_limit * (1.0 + ours[0]), report
    f = point_objective(d, 0, "csg")
    far = theta[0].numpy() * np.array([1e-3, 1e-3, 1.0, 1.0, 1e3])  # the shift 1,000 times out, the location kept
    reference = scipy_optimum(f, [theta[0].numpy(), far])
    assert ours[0] <= reference + OPTIMUM_TOL, (ours[0], reference, theta[0])
    assert theta[0, 4] > 1e5 and abs(theta[1, 4]) < 10  # point 0 out along the shift; point 1's optimum is finite


@pytest.mark.parametrize("family", ["gaussian", "truncnormal", "clogistic", pytest.param("csg", marks=SLOW)])
def test_zero_spread_and_all_dry_points(family):
    """A point whose members never spread (s = 0, floored) and one where the ensemble and the truth are 0 on
    every date (all dry): finite coefficients, no NaN, and no point worse than the raw ensemble."""
    d = synthetic(family, points=4, dates=40, seed=3)
    m, s, y = d.m.clone(), d.s.clone(), d.y.clone()
    s[0] = FitSettings.min_std  # zero spread (the head's floor)
    m[1], s[1], y[1] = 0.0, FitSettings.min_std, 0.0  # all dry (for a Gaussian: a constant truth at the members' value)
    m[2], y[2] = 0.0, 0.0  # dry truth, spread ensemble
    d = PointData(d.xm, d.xs, m, s, y, d.w)
    theta, report = fit(d, family)
    with torch.no_grad():
        fitted = crps_per_point(theta, d, family)
        raw = crps_per_point(torch.zeros_like(theta), d, family)
    assert torch.isfinite(theta).all() and torch.isfinite(fitted).all()
    assert (fitted <= raw + 1e-12).all(), (fitted, raw)
    assert np.isfinite([report.grad_norm_max, report.crps_fit]).all()


def test_missing_truth_is_ignored():
    """Dates without a truth (NaN) carry no weight: the fit equals the fit on the other dates alone."""
    d = synthetic("gaussian", points=3, dates=60)
    y = d.y.clone()
    y[:, ::3] = torch.nan
    both = PointData.from_fields(*(t.T.reshape(60, 1, 3) for t in (d.xm, d.xs, d.m, d.s, y)), min_std=1e-6)
    keep = torch.isfinite(y[0])
    alone = PointData(*(t[:, keep] for t in (d.xm, d.xs, d.m, d.s, y)), w=torch.full_like(y[:, keep], 1 / 40))
    theta_both, _ = fit(both, "gaussian")
    theta_alone, _ = fit(alone, "gaussian")
    assert torch.allclose(theta_both, theta_alone, atol=1e-6)


def _fields(d: PointData, height: int) -> dict[str, torch.Tensor]:
    """The (N, H, W) float32 fields of ``d``'s points laid out row by row on a height x width grid."""
    n = d.y.shape[1]
    return {k: getattr(d, k).T.reshape(n, height, -1).float() for k in emos_bands.FIELDS}


def test_a_fit_by_latitude_bands_equals_the_fit_of_every_point_at_once(tmp_path, monkeypatch):
    """The local EMOS's training samples go to disk by latitude band and are fitted a band at a time, so the
    fit holds one band's samples of every date: the coefficients equal one fit over every point, and no
    band holds more than FIT_BYTES' worth of (point, date) samples."""
    d = synthetic("gaussian", points=12, dates=40, seed=3)
    fields = _fields(d, height=4)  # a 4 x 3 grid
    whole = PointData.from_fields(**fields, min_std=1e-6)
    theta_all, report_all = fit(whole, "gaussian")
    per_sample = distributions.get("gaussian").fit_bytes_per_sample
    monkeypatch.setattr(emos_bands, "FIT_BYTES", per_sample * 40 * 3)  # one row of 3 points
    rows = emos_bands.band_rows("gaussian", n_dates=40, height=4, width=3)
    assert rows == 1
    scratch = emos_bands.BandScratch(tmp_path, height=4, rows=rows)
    for start in range(0, 40, 16):  # batches of dates, as the training loader gives them
        scratch.add({k: v[start : start + 16] for k, v in fields.items()})
    bands = list(scratch.bands(min_std=1e-6))
    assert [b.y.shape for b in bands] == [(3, 40)] * 4
    assert all(b.y.numel() * per_sample <= emos_bands.FIT_BYTES for b in bands)
    theta_bands, report = emos_fit.fit_bands(bands, "gaussian")
    assert torch.allclose(theta_bands, theta_all, rtol=0, atol=1e-12), (theta_bands - theta_all).abs().max()
    assert report.points == report_all.points == 12
    assert report.converged_points + report.stalled_points == 12
    assert report.crps_fit == pytest.approx(report_all.crps_fit, rel=1e-12)
    assert report.iterations == report_all.iterations


@pytest.fixture(scope="module")
def csg_world() -> tuple[PointData, torch.Tensor, emos_fit.FitReport]:
    """A 200-point, 40-date censored-shifted-gamma world and its fit."""
    d = synthetic("csg", points=200, dates=40, seed=0)
    return d, *fit(d, "csg")


@pytest.mark.system  # a 200-point csg fit: a minute of CPU (tests/tiers.py)
def test_the_censored_shifted_gamma_is_fitted_in_the_basin_of_its_optimum(csg_world):
    """The csg's CRPS is not convex in its coefficients: at point 109 of this 200-point world the optimum is a
    plain gamma (a shift near 0), which a descent from the raw ensemble misses for the censored-normal limit
    (0.023 above scipy's optimum when the fit started from the raw ensemble only). And a failed step on a
    BFGS-updated Hessian no longer stalls a point short of its optimum (4 points stalled, one 0.017 above)."""
    d, theta, report = csg_world
    with torch.no_grad():
        ours = crps_per_point(theta, d, "csg").numpy()
    f = point_objective(d, 109, "csg")
    reference = scipy_optimum(f, [np.zeros(theta.shape[1]), theta[109].numpy()])
    assert ours[109] <= reference + 1e-8, (ours[109], reference)
    assert report.stalled_points <= 1, report


@pytest.mark.system  # a 200-point csg fit: a minute of CPU (tests/tiers.py)
def test_every_point_of_a_censored_shifted_gamma_fit_is_settled(csg_world):
    """Issue 54: 12 of this world's 200 points (22 of the targets world's 2,664 tp24 points) ended short of
    every criterion, their gradient up to 0.9, after the damped iterations and the BFGS polish: each point is
    now converged, stalled in float64, or at the censored-normal limit."""
    _, _, report = csg_world
    settled = report.converged_points + report.stalled_points + report.limit_points
    assert settled == report.points, report


def test_a_fit_whose_points_are_converged_stalled_or_at_the_limit_is_converged():
    """Issue 54: the tp24 preset's summary said fit_max_iter on every run, its far-basin points (optimum at the
    censored shifted gamma's censored-normal limit) counted as short of the criterion. A point at the limit is
    settled; a point short of all three is not."""

    class Fitted:  # what stop_reason reads of a model: the fit's report as the checkpoint keeps it
        def __init__(self, **counts: int) -> None:
            self.fit_report = {"points": 10, "converged_points": 6, "stalled_points": 1, **counts}

    assert stop_reason(None, Fitted(limit_points=3)) == "converged"  # type: ignore[arg-type]
    assert stop_reason(None, Fitted(limit_points=2)) == "fit_max_iter"  # type: ignore[arg-type]
