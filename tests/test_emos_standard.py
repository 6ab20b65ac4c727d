"""The local EMOS's standard form, pooling and choice on validation (postcast.models.emos_forms, emos_pool,
emos_select): the standard form's fit against scipy fitting the operational parametrisation itself
(mu = a + b * ensemble mean, sigma^2 = c^2 + d^2 * ensemble variance, CRPS written out in numpy), the solver's
Hessian against autograd's, pooling of radius 0 against the local fit, and a point with 3 training dates that
overfits alone and gets a finite, calibrated fit through pooling chosen on validation dates."""

import threading
from pathlib import Path

import numpy as np
import pytest
import scoringrules as sr
import torch
from scipy import optimize, stats
from test_convergence import fit_preset
from test_emos_optimum import crps_normal_numpy, synthetic
from torch.utils.data import DataLoader

from postcast.datasets.loaders.datamodule import DataConfig, StoreDataset
from postcast.datasets.sample import SampleSpec
from postcast.models import distributions, emos_bands, emos_forms, emos_objective, emos_pool, emos_select, emos_training
from postcast.models.emos_bands import BandScratch
from postcast.models.emos_fit import fit
from postcast.models.emos_objective import Model, PointData, crps_per_point
from postcast.models.emos_pool import Pooling, pooled
from postcast.models.emos_select import select
from postcast.models.module import load_checkpoint

TOL = 1e-5  # the issue: training CRPS within 1e-5 of scipy's per-point fit of the standard form (or lower)


def with_unit(d: PointData) -> PointData:
    return d.with_unit(d.training_unit())


def scipy_standard(d: PointData, p: int) -> float:
    """Point p's lowest mean training CRPS scipy reaches on the operational form's own coefficients (a, b, c, d):
    Nelder-Mead from least squares (as an operational suite starts), then BFGS."""
    m, s, y, w = (d.m[p].numpy(), d.s[p].numpy(), d.y[p].numpy(), d.w[p].numpy())

    def f(x: np.ndarray) -> float:
        sigma = np.sqrt(x[2] ** 2 + x[3] ** 2 * s**2)
        return float(np.sum(w * crps_normal_numpy(x[0] + x[1] * m, sigma, y)))

    b, a = np.polyfit(m, y, 1)
    resid = np.std(y - (a + b * m))
    best = np.inf
    for x0 in (np.array([a, b, resid / 2, 1.0]), np.array([0.0, 1.0, 0.1, 1.0])):
        nm = optimize.minimize(f, x0, method="Nelder-Mead", options={"xatol": 1e-10, "fatol": 1e-13, "maxiter": 8000})
        bfgs = optimize.minimize(f, nm.x, method="BFGS", options={"gtol": 1e-10})
        best = min(best, nm.fun, bfgs.fun)
    return best


def test_the_standard_form_reaches_scipys_fit_of_the_operational_form():
    """The standard form is the operational one reparametrised (mu = m + u (a0 + a1 x_mean) is linear in m;
    sigma^2 = (u b0)^2 + (b1 s)^2): at every point postcast's training CRPS is at most scipy's + 1e-5."""
    d = with_unit(synthetic("gaussian", points=6, dates=60, seed=1))
    theta, report = fit(d, "gaussian", form="standard")
    with torch.no_grad():
        ours = crps_per_point(theta, d, "gaussian", "standard").numpy()
    for p in range(d.y.shape[0]):
        reference = scipy_standard(d, p)
        assert ours[p] <= reference + TOL, (p, ours[p], reference)
    assert report.converged_points + report.stalled_points == report.points
    assert report.crps_fit < report.crps_raw


def test_the_standard_forms_crps_is_the_closed_form_of_its_law():
    """crps_per_point in the standard form is the normal CRPS (numpy, Gneiting et al. 2005) of
    N(m + u (a0 + a1 x_mean), (u b0)^2 + (b1 s)^2): the form means what docs/models.md says."""
    d = with_unit(synthetic("gaussian", points=3, dates=20, seed=2))
    theta = torch.tensor([[0.3, -0.2, -0.5, 0.1], [0.0, 0.0, 0.2, -0.3], [-1.0, 0.5, -2.0, 0.4]], dtype=torch.float64)
    with torch.no_grad():
        ours = crps_per_point(theta, d, "gaussian", "standard").numpy()
    u = d.u.numpy()
    mu = d.m.numpy() + u * (theta[:, :1].numpy() + theta[:, 1:2].numpy() * d.xm.numpy())
    sigma = np.sqrt((u * theta[:, 2:3].numpy()) ** 2 + (theta[:, 3:4].numpy() * d.s.numpy()) ** 2)
    expected = (d.w.numpy() * crps_normal_numpy(mu, sigma, d.y.numpy())).sum(1)
    np.testing.assert_allclose(ours, expected, rtol=1e-10)


@pytest.mark.parametrize("family", ["gaussian", "truncnormal"])
def test_the_solvers_hessian_of_the_standard_form_is_autograds(family):
    """The solver's Hessian (Jacobian columns of the raw outputs plus the scale's curvature term, per-date
    Hessians by finite differences) equals the exact Hessian of the point's CRPS in its coefficients."""
    d = with_unit(synthetic(family, points=2, dates=30, seed=4))
    theta = torch.tensor([[0.2, -0.1, -0.3, 0.2], [-0.4, 0.3, 0.5, -0.6]], dtype=torch.float64)
    _, _, grad = emos_objective.value_grad(theta, d, Model(family, "standard"))
    ours = emos_objective.hessian(theta, grad, d, Model(family, "standard"))
    for p in range(2):
        one = d.take(torch.tensor([p]))
        exact = torch.autograd.functional.hessian(
            lambda t, one=one: crps_per_point(t[None], one, family, "standard")[0], theta[p]
        )
        torch.testing.assert_close(ours[p], exact, rtol=1e-4, atol=1e-7)


def grid_data(height: int, width: int, dates: int, seed: int) -> PointData:
    """A height x width grid (points row-major): the truth is N(m + bias, (1.6 s)^2) with a bias that varies
    smoothly in space, an under-dispersive ensemble (spread s), and the normalised ensemble mean x_mean."""
    g = torch.Generator().manual_seed(seed)
    points = height * width
    rows, cols = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    bias = (0.5 * torch.sin(rows / 3.0) + 0.3 * torch.cos(cols / 4.0)).flatten().double()[:, None]  # (P, 1)
    xm = torch.randn(points, dates, generator=g, dtype=torch.float64)
    m = 280.0 + 3.0 * xm
    s = torch.exp(0.4 * torch.randn(points, dates, generator=g, dtype=torch.float64))
    y = m + bias + 1.6 * s * torch.randn(points, dates, generator=g, dtype=torch.float64)
    xs = (s - 1.0) / 0.4
    return PointData(xm, xs, m, s, y, torch.full_like(y, 1.0 / dates))


def _fields(d: PointData, height: int) -> dict[str, torch.Tensor]:
    n = d.y.shape[1]
    return {k: getattr(d, k).T.reshape(n, height, -1).float() for k in ("xm", "xs", "m", "s", "y")}


def test_pooling_of_radius_0_or_weight_0_is_the_local_fit():
    d = with_unit(grid_data(4, 5, dates=30, seed=0))
    local, _ = fit(d, "gaussian", form="standard")
    for pool in (Pooling(0, 1.0), Pooling(2, 0.0)):
        theta, _ = fit(pooled(d, (4, 5), slice(0, 4), pool, wrap=True), "gaussian", form="standard")
        torch.testing.assert_close(theta, local, rtol=0, atol=0)


def test_a_pooled_point_is_fitted_on_its_neighbours_dates():
    """Radius 1, weight 1, no wrap: a corner point reads its own dates and its 3 neighbours' (the rest weigh 0),
    each point's weights sum to 1, and a fit with a neighbour's truth changed moves the point's coefficients."""
    d = with_unit(grid_data(3, 4, dates=5, seed=1))
    pool = pooled(d, (3, 4), slice(0, 3), Pooling(1, 1.0), wrap=False)
    assert pool.y.shape == (12, 5 * 9)
    torch.testing.assert_close(pool.w.sum(1), torch.ones(12, dtype=torch.float64))
    corner = pool.w[0].reshape(9, 5).sum(1)  # own, then the 8 offsets
    assert int((corner > 0).sum()) == 4 and corner[0] == pytest.approx(0.25)
    wrapped = pooled(d, (3, 4), slice(0, 3), Pooling(1, 1.0), wrap=True).w[0].reshape(9, 5).sum(1)
    assert int((wrapped > 0).sum()) == 6  # the western neighbours wrap round to the last column


def test_a_point_with_3_training_dates_is_calibrated_through_pooling_chosen_on_validation(tmp_path):
    """With 3 training dates a point's own fit overfits: its predictive spread collapses (the central 80 %
    interval holds far fewer than 80 % of unseen outcomes) in today's spread form and in the standard form alike.
    Pooling over neighbours within 2 cells, chosen on validation dates (never the test dates), gives every point a
    finite fit whose 80 % interval holds 70-90 % of the test outcomes and whose test CRPS is lower."""
    height, width = 8, 10
    train, val, test = (grid_data(height, width, n, seed) for n, seed in ((3, 1), (20, 2), (200, 3)))
    scratch = {}
    for name, d in (("train", train), ("val", val)):
        scratch[name] = BandScratch(tmp_path / name, height, rows=3)
        (tmp_path / name).mkdir()
        scratch[name].add(_fields(d, height))
    forms, pools = ["spread", "standard"], [Pooling(1, 0.25), Pooling(2, 1.0)]
    chosen = select(scratch["train"], scratch["val"], "gaussian", forms, pools, torch.ones(height), wrap=False)
    assert chosen.chosen.pooling == Pooling(2, 1.0)
    assert len(chosen.table) == 4 and all(np.isfinite(r["val_crps"]) for r in chosen.table)  # 2 local, 2 pooled

    def coverage_and_crps(theta: torch.Tensor, form: str, unit: torch.Tensor) -> tuple[float, float]:
        d = test.with_unit(unit)
        raw = emos_forms.raw(theta, d, form)  # (P, N, 2)
        mu, sigma = d.m + d.s * raw[..., 0], d.s * torch.exp(raw[..., 1])
        lo, hi = stats.norm.ppf(0.1, mu, sigma), stats.norm.ppf(0.9, mu, sigma)
        inside = float(((test.y.numpy() >= lo) & (test.y.numpy() <= hi)).mean())
        return inside, float(crps_per_point(theta, d, "gaussian", form).mean())

    unit = train.training_unit()
    for form in ("spread", "standard"):
        local, _ = fit(train.with_unit(unit), "gaussian", form=form)
        cover, crps_local = coverage_and_crps(local, form, unit)
        assert cover < 0.6, (form, cover)  # overfitted: the 80 % interval holds well under 80 %
    assert torch.isfinite(chosen.theta).all()
    cover, crps_pooled = coverage_and_crps(chosen.theta, chosen.chosen.form, chosen.unit)
    assert 0.7 <= cover <= 0.9, cover
    assert crps_pooled < crps_local


def _small_scratch(tmp_path: Path, height: int, rows: int) -> dict[str, BandScratch]:
    """Training (12 dates) and validation (8) scratch of a height x 5 grid, ``rows`` latitude rows a band."""
    scratch = {}
    for name, d in (("train", grid_data(height, 5, 12, 4)), ("val", grid_data(height, 5, 8, 5))):
        scratch[name] = BandScratch(tmp_path / name, height, rows=rows)
        (tmp_path / name).mkdir()
        scratch[name].add(_fields(d, height))
    return scratch


def test_candidates_fitted_side_by_side_equal_those_fitted_one_after_another(tmp_path, monkeypatch):
    """Two forms, then two poolings, fitted on each band at the same time (threads) give bit-identical
    coefficients and validation scores to the same candidates fitted one at a time, on bands sized for the fits
    held at once."""
    height = 6
    scratch = _small_scratch(tmp_path, height, rows=4)
    forms, pools = ["spread", "standard"], [Pooling(1, 0.5), Pooling(2, 1.0)]
    runs = {}
    for at_once in (1, 2):
        monkeypatch.setattr(emos_select, "FITS_AT_ONCE", at_once)
        assert emos_select.held_at_once(forms, pools) == at_once
        runs[at_once] = select(scratch["train"], scratch["val"], "gaussian", forms, pools, torch.ones(height), False)
    torch.testing.assert_close(runs[2].theta, runs[1].theta, rtol=0, atol=0)
    assert [r["val_crps"] for r in runs[2].table] == [r["val_crps"] for r in runs[1].table]
    assert runs[2].chosen == runs[1].chosen


def test_one_candidate_split_across_threads_equals_its_fit_in_one_thread(tmp_path, monkeypatch):
    """One form and its shrinkage (a stage of one candidate each, as the tp24 preset's): with two fits at once each
    candidate's points are split into two parts fitted side by side (every other point of a band); the
    coefficients, validation scores and reports' counts equal those of the whole band fitted in one thread."""
    height = 6
    scratch = _small_scratch(tmp_path, height, rows=4)
    runs, calls = {}, {}
    for at_once in (1, 2):
        monkeypatch.setattr(emos_select, "FITS_AT_ONCE", at_once)
        calls[at_once] = []
        monkeypatch.setattr(emos_select.emos_fit, "fit", _recording_points(emos_select.emos_fit.fit, calls[at_once]))
        runs[at_once] = select(scratch["train"], scratch["val"], "gaussian", ["standard"], [], torch.ones(height),
                               False, shrinks=(emos_pool.Shrinkage(1, 1.0),))  # fmt: skip
        monkeypatch.undo()
    assert sum(calls[2]) == sum(calls[1]) and len(calls[2]) == 2 * len(calls[1])  # the split happened
    torch.testing.assert_close(runs[2].theta, runs[1].theta, rtol=0, atol=0)
    torch.testing.assert_close(runs[2].unit, runs[1].unit, rtol=0, atol=0)
    assert [r["val_crps"] for r in runs[2].table] == [r["val_crps"] for r in runs[1].table]
    one, two = runs[1].report, runs[2].report
    assert (two.points, two.converged_points, two.kept_points) == (one.points, one.converged_points, one.kept_points)


def _recording_points(fit, points: list[int]):
    """``fit`` that records how many points each call fits (the split is real: twice the calls, half the points)."""

    def recorded(d, *args, **kwargs):
        points.append(d.y.shape[0])
        return fit(d, *args, **kwargs)

    return recorded


def test_bands_are_sized_for_the_fits_held_at_once():
    """Two fits at once on a band share its memory budget: half the rows of one fit (at least one)."""
    per_row = distributions.get("csg").fit_bytes_per_sample * 128 * 72
    one = emos_bands.band_rows("csg", 128, 37, 72)
    assert one == min(37, emos_bands.FIT_BYTES // per_row)
    assert emos_bands.band_rows("csg", 128, 37, 72, fits=2) == emos_bands.FIT_BYTES // (2 * per_row) < one
    assert emos_bands.band_rows("csg", 10**6, 37, 72, fits=2) == 1


def test_a_preset_keeps_the_candidate_of_lowest_validation_crps(derived_store, tmp_path, recwarn):
    """configs/train/emos_t2m.yaml through `postcast train fit`: summary.json and the checkpoint list every
    candidate (both forms locally, then the better form pooled) with its validation CRPS; the kept one is the
    lowest, its form named in the checkpoint's hyperparameters and rebuilt on load. No Lightning warning that
    training_step returned None (the fitted model validates one epoch without optimiser steps)."""
    ckpt, summary = fit_preset(derived_store, tmp_path / "runs", "configs/train/emos_t2m.yaml")
    selection = summary["fit"]["selection"]
    rows = selection["candidates"]
    assert [(r["form"], r["radius"]) for r in rows[:2]] == [("spread", 0), ("standard", 0)] and len(rows) == 3
    assert rows[2]["radius"] == 1 and rows[2]["weight"] == 0.1 and all(np.isfinite(r["val_crps"]) for r in rows)
    best = min(rows, key=lambda r: r["val_crps"])
    assert selection["chosen"] == {k: best[k] for k in ("form", "radius", "weight")}
    model, meta = load_checkpoint(str(ckpt))
    assert model.hparams["net"]["form"] == best["form"] == model.net.form and meta["fit"]["selection"] == selection
    assert not [w for w in recwarn if "returned `None`" in str(w.message)]


@pytest.mark.parametrize("season", [False, True], ids=["standard", "seasonal"])
def test_a_standard_form_checkpoint_predicts_what_it_was_fitted_to(derived_store, tmp_path, season):
    """The standard form's network (float32, through the head) gives the fit's own CRPS (float64) on the
    validation dates: the unit u and the coefficients travel in the checkpoint; with ``season: true`` the network
    reads each date's season features where the fit read the scratch's season fields."""
    standard = ("--model.net.form", "standard", "--model.net.radii", "[]", "--model.net.weights", "[]")
    seasonal = ("--model.net.season", "true") if season else ()
    ckpt, summary = fit_preset(derived_store, tmp_path / "runs", "configs/train/emos_t2m.yaml", *standard, *seasonal)
    model, meta = load_checkpoint(str(ckpt))
    assert model.net.form == "standard" and summary["fit"]["selection"]["chosen"]["form"] == "standard"
    assert (model.net.season is not None and model.net.season.abs().sum() > 0) == season  # fitted, saved, loaded
    cfg = DataConfig(store=str(derived_store), sample=SampleSpec.from_dict(meta["sample"]))
    val = StoreDataset(cfg, "val")
    d = emos_training.points(model, val)
    assert (d.season is not None) == season
    with torch.no_grad():
        fitted = crps_per_point(model.net.theta().double(), d, "gaussian", "standard")  # (P,) mean over dates
        batch = next(iter(DataLoader(val, batch_size=len(val))))
        net = model.predictive(batch).crps(batch["y"]).double()  # (N, H, W)
    ok = torch.isfinite(batch["y"]).all(0).flatten()
    torch.testing.assert_close(net.flatten(1).mean(0)[ok], fitted[ok], rtol=1e-4, atol=1e-5)


def sh_law(theta: torch.Tensor, d: PointData) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The sh form's censored shifted gamma (shape, scale, shift) per the docs: X of mean
    (max(m, 0) + shift) (1 + max(m, 0) / u)^a1 exp(a0), std sqrt((u b0)^2 + (b1 s)^2), shift u softplus(c2)."""
    t, u, s, m = (v.numpy() for v in (theta, d.u, d.s, d.m))
    shift = u * np.logaddexp(0.0, t[:, 4:5])
    mean = (np.maximum(m, 0.0) + shift) * (1.0 + np.maximum(m, 0.0) / u) ** t[:, 1:2] * np.exp(t[:, 0:1])
    std = np.sqrt((u * t[:, 2:3]) ** 2 + (t[:, 3:4] * s) ** 2)
    return (mean / std) ** 2, std**2 / mean, shift


SH_THETA = torch.tensor(
    [[0.1, 0.2, 0.3, 0.8, 0.5], [-0.2, 0.1, 0.5, 0.6, -6.0], [0.3, -0.1, 0.2, 1.1, 40.0]], dtype=torch.float64
)  # a shift of 0.97, 0.0025 and 40 units


def test_the_sh_form_tells_apart_dates_drier_than_the_points_mean():
    """The sh form read log(1 + max(x_mean, 0)) of the normalised mean channel (the ensemble mean less the point's
    training mean, over its std): every date drier than the point's mean had the same location, whatever its
    members said. It reads the raw ensemble mean m in units of the point's spread u: a = a0 + a1 log(1 + m / u),
    worked by hand for m = 0.3 and 1.2 mm, u = 0.5 mm (log 1.6 = 0.4700036292, log 3.4 = 1.2237754316)."""
    one = torch.ones(1, 2, dtype=torch.float64)
    xm, m = torch.tensor([[-0.5, -0.2]], dtype=torch.float64), torch.tensor([[0.3, 1.2]], dtype=torch.float64)
    d = PointData(xm, one, m, 0.5 * one, one, 0.5 * one, u=0.5 * one)
    theta = torch.tensor([[0.1, 0.7, 0.3, 0.8, 0.5]], dtype=torch.float64)
    a = emos_forms.raw(theta, d, "sh")[0, :, 0]
    by_hand = torch.tensor([0.1 + 0.7 * 0.4700036292, 0.1 + 0.7 * 1.2237754316], dtype=torch.float64)
    torch.testing.assert_close(a, by_hand)


def test_the_sh_forms_crps_is_scoringrules_of_its_law():
    """crps_per_point in the sh form is scoringrules' censored-shifted-gamma CRPS of the law docs/models.md
    gives it (Scheuerer and Hamill 2015's closed form, written independently of postcast's)."""
    d = with_unit(synthetic("csg", points=3, dates=30, seed=4))
    with torch.no_grad():
        ours = crps_per_point(SH_THETA, d, "csg", "sh").numpy()
    shape, scale, shift = sh_law(SH_THETA, d)
    expected = (d.w.numpy() * sr.crps_csg0(d.y.numpy(), shape, scale=scale, shift=shift)).sum(1)
    np.testing.assert_allclose(ours, expected, rtol=1e-8)


def test_the_sh_forms_jacobian_and_curvature_are_autograds():
    """The solver's pieces of the sh form (each coefficient's column of d raw / d theta, and the curvature term
    sum_t g_t . d^2 raw_t / d theta^2 for any per-date gradient g) against autograd through the raw outputs. The
    CRPS's own Hessian in the raw outputs is finite differences for every family (torch has no derivative of
    the incomplete gamma in its shape, so autograd cannot check the whole Hessian here)."""
    assert_sh_pieces_are_autograds(SH_THETA, with_unit(synthetic("csg", points=3, dates=40, seed=1)))


def assert_sh_pieces_are_autograds(theta: torch.Tensor, d: PointData) -> None:
    """Each of the sh form's Jacobian columns and its curvature term at theta (P, n) against autograd."""
    points, dates = d.y.shape
    g = torch.randn(points, dates, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    jac = torch.autograd.functional.jacobian(lambda t: emos_forms.raw(t, d, "sh"), theta)  # (P, N, K, P, n)
    columns = emos_forms.columns(theta, d, 3, "sh")
    assert len(columns) == theta.shape[1]
    for j, (k, factor) in enumerate(columns):
        ours = torch.ones_like(d.s) if factor is None else factor  # (P, N)
        auto = torch.stack([jac[p, :, k, p, j] for p in range(points)])
        torch.testing.assert_close(ours, auto, rtol=1e-10, atol=1e-12)
    hess = torch.autograd.functional.hessian(lambda t: (emos_forms.raw(t, d, "sh") * g).sum(), theta)
    auto = torch.stack([hess[p, :, p, :] for p in range(points)])  # (P, n, n)
    torch.testing.assert_close(emos_forms.curvature(theta, d, g, "sh"), auto, rtol=1e-9, atol=1e-11)


def test_the_sh_form_reaches_scipys_fit_of_its_law():
    """At every point postcast's sh fit has a training CRPS at most scipy's (Nelder-Mead, then BFGS, on the same
    law through scoringrules) + 1e-5."""
    d = with_unit(synthetic("csg", points=4, dates=60, seed=2))
    theta, report = fit(d, "csg", form="sh")
    with torch.no_grad():
        ours = crps_per_point(theta, d, "csg", "sh").numpy()
    for p in range(4):
        at = d.take(torch.tensor([p]))

        def f(x: np.ndarray, at: PointData = at) -> float:
            shape, scale, shift = sh_law(torch.as_tensor(x[None]), at)
            with np.errstate(all="ignore"):
                v = sr.crps_csg0(at.y.numpy(), shape, scale=scale, shift=shift)
            return float((at.w.numpy() * v).sum()) if np.all(np.isfinite(v)) else 1e30

        nm = optimize.minimize(f, np.array([0.0, 0.0, 0.3, 1.0, 0.0]), method="Nelder-Mead",
                               options={"xatol": 1e-10, "fatol": 1e-13, "maxiter": 20000})  # fmt: skip
        reference = min(nm.fun, optimize.minimize(f, nm.x, method="BFGS", options={"gtol": 1e-10}).fun)
        assert ours[p] <= reference + TOL, (p, ours[p], reference)
    assert report.converged_points + report.stalled_points + report.limit_points == report.points


def test_the_sh_form_is_the_censored_shifted_gammas_only():
    with pytest.raises(ValueError, match="sh EMOS form is for the families"):
        Model("gaussian", "sh")
    with pytest.raises(ValueError, match="standard EMOS form is for the families"):
        Model("csg", "standard")


def test_the_bands_candidates_are_fitted_on_the_same_threads(tmp_path, monkeypatch):
    """Side-by-side candidates were fitted on a new pool of threads for every band; each new thread took a glibc
    arena that kept the band's freed tensors, so the fit's memory grew with the number of bands, that is with
    the training dates (0.5 deg: 2.04 GB at 3 bands, 2.70 GB at 12; one pool: 1.97 and 2.17 GB). Every band's
    fits now run on the same pool: the threads are named after their pool."""
    height = 6
    scratch = _small_scratch(tmp_path, height, rows=2)
    names: list[str] = []
    fit_band = emos_select._fit_band

    def watched(*args, **kwargs):
        names.append(threading.current_thread().name)
        return fit_band(*args, **kwargs)

    monkeypatch.setattr(emos_select, "_fit_band", watched)
    select(scratch["train"], scratch["val"], "gaussian", ["spread", "standard"], [], torch.ones(height), False)
    assert len(names) == 2 * 3, names  # 2 candidates on each of 3 bands
    assert len({n.rsplit("_", 1)[0] for n in names}) == 1, names  # one pool
