"""Issue 54, item 5: the tp24 preset's sh-form fit hit its iteration ceiling on the targets world. From the raw
ensemble (and the nudged start) the sh form's Hessian is indefinite, its curvature in b0 negative where the
truth spreads far more than the members; Marquardt's damping of the diagonal then had to reach lambda ~ 100 before
the damped Hessian was positive definite, every step 100 times shorter than Newton's, and no point of the
world converged in 100 iterations. The indefinite Hessian's step now takes each curvature's absolute value
(emos_bfgs.saddle_free), and the world's points converge in tens of iterations."""

from pathlib import Path

import numpy as np
import torch
import xarray as xr
from scipy import optimize
from test_convergence import point_crps

from postcast.models import emos_bfgs, emos_fit
from postcast.models.emos_objective import Model, PointData, crps_per_point, hessian, value_grad


def underdispersed(points: int = 4, dates: int = 60, seed: int = 0) -> PointData:
    """Precipitation whose members agree far more than the truth varies (the targets world's tp24: a fitted std
    ~5 times the members' spread), 20-45 % dry dates."""
    g = torch.Generator().manual_seed(seed)
    xm, xs = (torch.randn(points, dates, generator=g, dtype=torch.float64) for _ in range(2))
    m, s = torch.nn.functional.softplus(xm), 0.2 * torch.exp(0.3 * xs)
    mean, std = (m + 1.0).numpy(), 1.2
    y = torch.as_tensor(np.random.default_rng(seed).gamma((mean / std) ** 2, std**2 / mean)) - 1.0
    d = PointData(xm, xs, m, s, y.clamp_min(0.0), torch.full_like(y, 1.0 / dates))
    return d.with_unit(d.training_unit())


def test_the_step_at_an_indefinite_hessian_keeps_newtons_scale():
    """Curvature 100 in one coefficient, -1 in another: the step in the first is Newton's (-g / 100, to within
    the damping), not Marquardt's 100 times shorter one, and it descends along the second."""
    hess = torch.diag(torch.tensor([100.0, -1.0, 4.0], dtype=torch.float64))[None]
    g = torch.tensor([[1.0, 0.1, 0.4]], dtype=torch.float64)
    step, ok, _, definite = emos_fit._newton_step(hess, g, torch.full((1,), 1e-3, dtype=torch.float64))
    assert bool(ok[0]) and not bool(definite[0])
    assert abs(float(step[0, 0]) + 0.01) < 2e-3 and abs(float(step[0, 2]) + 0.1) < 2e-2, step
    assert float((step * g).sum()) < 0 and float(step[0, 1]) < -0.05, step
    e = torch.linalg.eigvalsh(hess)
    assert torch.allclose(
        emos_bfgs.saddle_free(hess, g, torch.zeros(1, dtype=torch.float64))[0], -g / e.abs()[:, [2, 0, 1]]
    )


def test_the_sh_form_converges_where_its_hessian_is_indefinite():
    """At every point of the world, the sh form's Hessian at the nudged start is indefinite; 30 iterations from
    there reached no point's criterion before (gradient up to 0.04), and now reach every point's whose optimum
    has a finite shift. (Two points' optimum is the censored-normal limit since the power law reads the raw
    ensemble mean: from here they walk their shift outwards, and the fit reaches the limit from its far start.)"""
    d, model = underdispersed(seed=1), Model("csg", "sh")
    start = emos_fit._starts(d, model, 5)[0]  # the raw ensemble nudged to b0 = 0.1
    grad = value_grad(start, d, model)[2]
    assert (torch.linalg.eigvalsh(hessian(start, grad, d, model))[:, 0] < 0).all()
    out = emos_fit._descend(start, d, model, emos_fit.FitSettings(), 30)
    interior = emos_fit.fit(d, "csg", form="sh")[0][:, 4] < emos_fit.FAR_SHIFT / 2  # (P,)
    assert int(interior.sum()) >= 2 and out.done[interior].all(), (interior, out.done, out.g)


def test_no_sh_start_sits_on_the_saddle_at_b0_0():
    """The sh form's CRPS is even in b0 (std^2 = (u b0)^2 + (b1 s)^2): at b0 = 0 its gradient in b0 is 0 and its
    Hessian's b0 row is 0 off the diagonal (the curvature term carries b0), so a descent from there can stay on
    b0 = 0, a saddle where the curvature in b0 is negative. On the targets world 3 of 8 points sampled against
    scipy ended there or nearby, up to 0.02 above scipy's optimum (points 44 and 1693 at b0 = -0.0), as the
    descents from the raw ensemble and the plain gamma started at b0 = 0. Every start of the sh form is now off it."""
    d, model = underdispersed(seed=1), Model("csg", "sh")
    starts = emos_fit._starts(d, model, 5)
    assert all((s[:, 2] != 0).all() for s in starts), [s[:, 2] for s in starts]


def test_every_descent_of_the_censored_shifted_gamma_starts_from_a_point_of_its_own():
    """The sh form's raw-ensemble start is already moved off the b0 = 0 saddle, so the further 'nudged' start was
    the same point again: 12 iterations of every point (8 % of the sh fit's time on the targets world) spent on
    a descent that could change nothing."""
    d = underdispersed(seed=1)
    for form in ("spread", "sh"):
        starts = emos_fit._starts(d, Model("csg", form), 5)
        for i in range(len(starts)):
            for j in range(i):
                assert not torch.equal(starts[i], starts[j]), (form, i, j)


def test_points_whose_crps_is_level_far_out_are_at_the_limit():
    """Two points of the targets world's tp24 (spread form) have their optimum at shifts of thousands, where
    float64 resolves the CRPS to ~1e-8 only: along the ray it rose and fell by 1e-8 (not falling at its farthest
    factor, so not at the limit), and the descent from the ray's best moved by 1e-8 steps to its iteration
    ceiling. Both were left short of every criterion (settled 2,662 of 2,664); a CRPS level to within
    ``tol_limit`` from there outwards is the limit's, and the fit there is within tol_limit of scipy's optimum."""
    ds = xr.open_dataset(Path(__file__).parent / "reference_results" / "tp24_far_points.nc")
    d = PointData(*(torch.as_tensor(ds[k].values) for k in ("xm", "xs", "m", "s", "y", "w")))
    theta, report = emos_fit.fit(d, "csg")
    assert report.converged_points + report.stalled_points + report.limit_points == 2, report
    assert report.grad_norm_max < 1.0, report  # a stalled point at a shift of 1e4 reported 8e-3 to 4.9e18
    for p in range(2):
        one = PointData(*(t[p : p + 1] for t in (d.xm, d.xs, d.m, d.s, d.y, d.w)))

        def f(x: np.ndarray, one: PointData = one) -> float:
            with torch.no_grad():
                value = float(crps_per_point(torch.as_tensor(x)[None], one, "csg")[0])
            return value if np.isfinite(value) else 1e30

        best = optimize.minimize(f, theta[p].numpy(), method="Nelder-Mead", options={"xatol": 1e-10, "fatol": 1e-13})
        assert f(theta[p].numpy()) <= best.fun + 1e-6 * (1.0 + best.fun), (p, f(theta[p].numpy()), best.fun)


def test_a_point_at_the_limit_is_stored_where_the_models_float32_law_holds():
    """Two points of this world walk their shift towards the censored-normal limit, their shift's coefficient
    out to 1e6 and beyond, where the model's float32 law is wrong (the targets world's tp24 checkpoint validated
    0.7917 against its float64 fit's 0.7852, one point 16 above; here 7e-4 above at one point). As stored, they
    are back at FAR_SHIFT: the float32 law agrees with the fit, within STORE_TOL of the fit's CRPS."""
    d = underdispersed(seed=1)
    fitted, report = emos_fit.fit(d, "csg", form="sh")
    theta = emos_fit.representable(fitted, d, "csg", "sh")
    assert report.limit_points == 2 and (theta[:, 4] <= emos_fit.FAR_SHIFT).all(), (report, theta[:, 4])
    as32 = PointData(*(t.float() for t in (d.xm, d.xs, d.m, d.s, d.y, d.w)), u=d.u.float())
    with torch.no_grad():
        f64, f32 = crps_per_point(fitted, d, "csg", "sh"), crps_per_point(theta.float(), as32, "csg", "sh")
    torch.testing.assert_close(f32.double(), f64, rtol=emos_fit.STORE_TOL, atol=2e-5)


def test_a_point_whose_optimum_is_the_plain_gamma_limit_walks_there():
    """Point 431 of the derived store's tp24 (the slow tier's scipy-optimum test of the emos_tp24 preset, spread
    form): its optimum is the plain-gamma limit, the shift's raw coefficient c -> -inf (scipy: c = -34 and on).
    The descent stalled at c = -6.5 (in the preset's fit; -8.4 alone, 7e-6 above scipy's minimum): there the
    shift's gradient falls like e^c while the location's coefficients sit at a kink of the CRPS. The fit walks
    c inwards and ends within 3e-6 (1 + CRPS) of scipy's minimum of scoringrules' CRPS, its c below -30."""
    ds = xr.open_dataset(Path(__file__).parent / "reference_results" / "tp24_near_point.nc")
    d = PointData(*(torch.as_tensor(ds[k].values) for k in ("xm", "xs", "m", "s", "y", "w")))
    theta, _ = emos_fit.fit(d, "csg")
    at = {k: ds[k].values[0] for k in ("xm", "xs", "m", "s", "y")}

    def f(x: np.ndarray) -> float:
        value = float(point_crps("csg", x, at).mean())
        return value if np.isfinite(value) else 1e30

    ours = f(theta[0].numpy())
    best = min(
        optimize.minimize(f, x0, method="Nelder-Mead", options={"xatol": 1e-10, "fatol": 1e-13, "maxiter": 40000}).fun
        for x0 in (np.zeros(5), theta[0].numpy())
    )
    assert ours <= best + 3e-6 * (1.0 + best) and float(theta[0, 4]) < -30.0, (ours, best, theta[0].tolist())
