"""Local EMOS fitted to its CRPS optimum: a full-batch, second-order fit vectorised over every grid point.

The local EMOS (:class:`postcast.models.postprocessors.LocalEMOS`) has its own coefficients at each point,
``theta = (a0, a1, b0, b1, c...)``: raw head outputs ``a = a0 + a1 x_mean``, ``b = b0 + b1 x_std`` and one
constant per further output (the family's head, :mod:`postcast.models.distributions`). The parameters of
different points do not interact, so the sum over points of each point's mean training CRPS has a
block-diagonal Hessian, and one Levenberg-Marquardt (damped Newton) iteration updates every point at once:

    step_p = -(H_p + lambda_p diag(H_p))^-1 g_p      (g_p: autograd; H_p: BFGS-updated between refreshes;
                                                      steps capped)

The raw outputs are linear in the coefficients (raw_t = J_t theta at date t), so a refresh computes
H_p = sum_t J_t^T H_t J_t from each date's K x K Hessian H_t, by forward differences of the gradient in the raw
outputs: K backward passes (3 for the csg) instead of one per coefficient (5).

A step is kept at a point only where it lowers that point's CRPS (else lambda_p grows), so the fit never
leaves a point worse than where it started, and it starts at each point from the better of the raw
ensemble (``theta = 0``) and a moment estimate (least squares of the standardised error on the ensemble
mean, log std of the residual); the censored shifted gamma descends from the raw ensemble and from near its
censored-normal limit, keeping the better per point (:func:`_starts`). Each iteration computes the points
still active only, and the Hessian is recomputed after a failed step on a BFGS-updated one. A point stops
when its gradient is below ``tol_grad (1 + CRPS)`` or its Newton decrement (the CRPS decrease a full Newton
step predicts) below ``tol_decrease (1 + CRPS)``, or when no step can lower its CRPS any more in float64 on an
exact Hessian (``stalled``, counted in the report). The points left short of convergence go on by BFGS with a
line search of their own (:func:`emos_bfgs.polish`), and those still short descend again from a fresh
Hessian (:func:`_restarted`). Scores run in float64.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from postcast.datasets import laws
from postcast.models import distributions, emos_bfgs, emos_forms, special
from postcast.models.emos_objective import Model, PointData, crps_per_point, hessian, value_grad
from postcast.models.emos_report import FitReport

NEAR_SHIFT = -5.0  # the csg's raw shift c of its second start (shift = s softplus(c): 0.007 spreads)
FAR_SHIFT = 1000.0  # ... of its third (1,000 spreads; from 1e4 the descent fails in float64)
STORE_TOL = 1e-4  # the largest rise of a point's training CRPS, x (1 + CRPS), that :func:`representable` accepts
RAY = tuple(2.0**i for i in range(-4, 0)) + tuple(2.0**i for i in range(1, 11))  # the csg's shift times these:
# in from the far start (points left at a shift of 1,000 spreads, the Newton decrement's criterion met on an
# inexact Hessian, lay 3e-4 above a shift 4 times smaller), then out toward its censored-normal limit
NEAR_RAY = tuple(2.0**i for i in range(6))  # the csg's raw shift c minus these: in toward its plain-gamma limit
# (shift -> 0, where the CRPS has a kink in the location's coefficients that stalls the descent: the slow tier's
# emos_tp24 point 431 stalled at c = -6.5, 4.3e-5 above scipy's c = -33.7)


@dataclass(frozen=True)
class FitSettings:
    tol_grad: float = 1e-9  # max |dCRPS/dtheta| at a converged point, relative to 1 + its CRPS
    tol_decrease: float = 1e-12  # Newton decrement at a converged point, relative to 1 + its CRPS
    tol_limit: float = 1e-6  # the csg's CRPS left to fall to its censored-normal limit, relative to 1 + its CRPS
    max_iter: int = 100  # from the first start
    max_iter_polish: int = 40  # of BFGS at the points the damped iterations left short (:func:`_polished`)
    max_iter_far: int = 12  # from the further starts (the csg's), before the points they lead on are iterated on
    restarts: int = 5  # fresh descents (:func:`_restarted`) at the points the polish leaves short
    refresh: int = 10  # iterations between finite-difference Hessians (BFGS updates in between)
    max_step: float = 1.0  # largest change of a coefficient in one iteration, x (1 + the largest |coefficient|)
    min_std: float = 1e-6  # the head's floor on the ensemble std


def moment_start(d: PointData, n: int, form: str = "spread") -> torch.Tensor:
    """Moment estimates (P, n) for a location-scale head: a0, a1 by least squares of the standardised error
    (y - m) / s (spread form; / u: standard) on x_mean, and a scale that matches the residual's variance
    (:func:`emos_forms.scale_start`; a point whose x_mean does not vary gets a1 = 0)."""
    r = emos_forms.standardised_error(d, d.m, d.y, form)  # (P, N)
    xm_bar, r_bar = (d.w * d.xm).sum(1), (d.w * r).sum(1)
    var = (d.w * (d.xm - xm_bar[:, None]) ** 2).sum(1)
    cov = (d.w * (d.xm - xm_bar[:, None]) * (r - r_bar[:, None])).sum(1)
    a1 = torch.where(var > 1e-12, cov / var.clamp_min(1e-12), 0.0)
    a0 = r_bar - a1 * xm_bar
    resid = r - a0[:, None] - a1[:, None] * d.xm
    b0, b1 = emos_forms.scale_start((d.w * resid**2).sum(1), form)
    theta = torch.zeros(d.y.shape[0], n, dtype=torch.float64, device=d.y.device)
    theta[:, 0], theta[:, 1], theta[:, 2], theta[:, 3] = a0, a1, b0, b1
    return theta


def _starts(d: PointData, model: Model, n: int) -> list[torch.Tensor]:
    """Where the descents start, each (P, n). A location-scale family: per point the best (lowest training CRPS)
    of the raw ensemble, the moment estimate and (standard form) the raw ensemble nudged off b0 = 0. The
    censored shifted gamma, whose CRPS is not convex in its coefficients: the raw ensemble, a shift near 0 (a
    plain gamma), and a shift of FAR_SHIFT spreads with the moment estimate's scale, near the family's
    censored-normal limit. A point's optimum can lie in any of them: 2e-3 apart at one point of the targets
    world, 0.023 at one of tests/test_emos_optimum.py's."""
    zero = emos_forms.raw_start(d.y.shape[0], n, model.form, d.y)
    if not laws.get(model.family).location_scale:
        near, far = zero.clone(), zero.clone()
        near[:, 4] = NEAR_SHIFT
        far[:, 2:4], far[:, 4] = moment_start(d, 4, model.form)[:, 2:4], FAR_SHIFT
        if model.form == "sh":  # b0 = 0 is a saddle the descent never leaves (the CRPS is even in b0): off it
            zero[:, 2] = near[:, 2] = emos_forms.nudged(zero, model.form)[0][0, 2]
        return [zero, near, far] if model.family == "csg" else [zero]  # (sh: zero is already nudged)
    tries = [zero, moment_start(d, n, model.form), *emos_forms.nudged(zero, model.form)]
    with torch.no_grad():
        f = torch.stack([crps_per_point(t, d, model.family, model.form) for t in tries]).nan_to_num(torch.inf)
    best = f.argmin(0)  # (P,): the first of equals, so the raw ensemble where nothing is lower
    return [torch.stack(tries)[best, torch.arange(best.numel())]]


def _scale(f: torch.Tensor) -> torch.Tensor:
    """1 + |CRPS| per point (1 where the CRPS is not finite): what the tolerances are relative to."""
    return 1.0 + torch.nan_to_num(f.abs(), posinf=0.0)


def _newton_step(
    hess: torch.Tensor, g: torch.Tensor, lam: torch.Tensor, saddle_free: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The damped step (P, n), where it exists (P,), the damping used (P,) and where the Hessian is positive
    definite (P,) (linear algebra only, no CRPS evaluation). A positive definite Hessian: Marquardt's step
    (:func:`emos_bfgs.damped_cholesky`). An indefinite one: the step of its eigenvalues' absolute values
    (:func:`emos_bfgs.saddle_free`), whose damping is that of the largest, not the Marquardt damping of its
    diagonal that turns positive definite only at lambda ~ 100 (the sh form from the raw ensemble: its
    curvature in b0 < 0; every step then 100 times too short, no point converged in 100 iterations). Not
    ``saddle_free``: Marquardt's step everywhere (the location-scale families, whose fits it leaves as they were:
    the ws10 spread form's left 4 points short with it)."""
    definite = torch.linalg.cholesky_ex(hess)[1] == 0
    chol, ok, damped = emos_bfgs.damped_cholesky(hess, lam)
    step = torch.where(ok[:, None], torch.nan_to_num(torch.cholesky_solve(-g.unsqueeze(-1), chol).squeeze(-1)), 0.0)
    if not saddle_free or bool(definite.all()):
        return step, ok, damped, definite if saddle_free else torch.ones_like(definite)
    bent = (~definite).nonzero().squeeze(1)
    step, ok, damped = step.clone(), ok.clone(), damped.clone()
    step[bent], ok[bent] = emos_bfgs.saddle_free(hess[bent], g[bent], lam[bent])
    damped[bent] = lam[bent]
    return step, ok, damped, definite


@dataclass(frozen=True)
class _Iteration:
    """One iteration's outcome at the active points (A of them), each (A, ...)."""

    theta: torch.Tensor
    f: torch.Tensor
    g: torch.Tensor
    grad: torch.Tensor  # (A, N, K): g in each date's raw outputs
    hess: torch.Tensor
    lam: torch.Tensor
    decrement: torch.Tensor  # the predicted decrease, where ``newton``
    newton: torch.Tensor
    done: torch.Tensor
    failed: torch.Tensor  # the step did not lower the CRPS


def _iterate(
    theta: torch.Tensor,
    f: torch.Tensor,
    g: torch.Tensor,
    grad: torch.Tensor,
    hess: torch.Tensor,
    lam: torch.Tensor,
    d: PointData,
    model: Model,
    settings: FitSettings,
    refresh: torch.Tensor,
) -> _Iteration:
    """One Levenberg-Marquardt iteration at active points: theta (A, n), f (A,), g (A, n), its raw form grad
    (A, N, K), hess (A, n, n);
    ``refresh`` (A,): where the Hessian is recomputed by finite differences first (else the BFGS-updated one)."""
    if bool(refresh.any()):
        r = refresh.nonzero().squeeze(1)
        hess = hess.clone()
        hess[r] = hessian(theta[r], grad[r], d.take(r), model)
    step, ok, lam, definite = _newton_step(hess, g, lam, not laws.get(model.family).location_scale)
    cap = settings.max_step * (1.0 + theta.abs().amax(1, keepdim=True))  # (A, 1): grows with the coefficients
    step = step * (cap / step.abs().amax(1, keepdim=True).clamp_min(1e-300)).clamp_max(1.0)
    newton = ok & definite & (lam < 1e-2)  # the damped step is close to Newton's: its predicted decrease
    decrement = -0.5 * (g * step).sum(1)
    done = newton & (decrement < settings.tol_decrease * _scale(f))  # no decrease left to find
    trial = theta + torch.where(~done[:, None], step, 0.0)
    f_trial, g_trial, grad_trial = value_grad(trial, d, model)
    better = ~done & ok & torch.isfinite(f_trial) & (f_trial <= f)
    hess = emos_bfgs.hessian_update(hess, trial - theta, g_trial - g, better)
    lam = torch.where(better, lam * 0.2, lam * 10.0).clamp(1e-12, 1e16)
    return _Iteration(
        theta=torch.where(better[:, None], trial, theta),
        f=torch.where(better, f_trial, f),
        g=torch.where(better[:, None], g_trial, g),
        grad=torch.where(better[:, None, None], grad_trial, grad),
        hess=hess,
        lam=lam,
        decrement=decrement,
        newton=newton,
        done=done,
        failed=~done & ~better,
    )


@dataclass(frozen=True)
class _Descent:
    """Where the iterations from one start ended, per point (P, ...)."""

    theta: torch.Tensor
    f: torch.Tensor
    g: torch.Tensor
    done: torch.Tensor
    stalled: torch.Tensor
    decrement: torch.Tensor
    iterations: int
    FIELDS = ("theta", "f", "g", "done", "stalled", "decrement")

    def better(self, other: _Descent) -> _Descent:
        """Per point, the descent with the lower CRPS (ties: this one)."""
        pick = ~(other.f < self.f)  # (P,): a NaN or inf of the other keeps this one

        def choose(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return torch.where(pick.view(-1, *([1] * (a.dim() - 1))), a, b)

        chosen = {k: choose(getattr(self, k), getattr(other, k)) for k in self.FIELDS}
        return _Descent(**chosen, iterations=max(self.iterations, other.iterations))

    def replaced(self, idx: torch.Tensor, other: _Descent) -> _Descent:
        """This descent with the points ``idx`` (A,) taken from ``other`` (a descent of those A points)."""
        fields = {k: getattr(self, k).clone() for k in self.FIELDS}
        for k, t in fields.items():
            t[idx] = getattr(other, k)
        return _Descent(**fields, iterations=max(self.iterations, other.iterations))


def _descend(theta: torch.Tensor, d: PointData, model: Model, settings: FitSettings, max_iter: int) -> _Descent:
    """Levenberg-Marquardt iterations from theta (P, n); each computes only the points still active (neither
    converged nor stalled), so the last few, whose optimum lies far out, cost little."""
    f, g, grad = value_grad(theta, d, model)
    lam = torch.full_like(f, 1e-3)
    done = torch.zeros_like(f, dtype=torch.bool)
    stalled = torch.zeros_like(done)
    stale = torch.zeros_like(done)  # a step on the BFGS-updated Hessian failed: recompute it
    exact = torch.zeros_like(done)  # the Hessian is the finite-difference one (no update since)
    decrement = torch.full_like(f, torch.inf)
    hess = torch.zeros(f.shape[0], theta.shape[1], theta.shape[1], dtype=f.dtype, device=f.device)
    iterations = 0
    for iterations in range(1, max_iter + 1):
        done |= g.abs().amax(1) < settings.tol_grad * _scale(f)
        idx = (~done & ~stalled).nonzero().squeeze(1)  # (A,) the active points
        if idx.numel() == 0:
            break
        # the exact (finite-difference) Hessian every ``refresh`` iterations, BFGS updates in between, and again
        # after a failed step on an updated one (an update away from the optimum can be indefinite: a point
        # stalled 0.05 above its optimum before); a point stalls only on an exact Hessian
        refresh = stale[idx] | (iterations % settings.refresh == 1)
        out = _iterate(
            theta[idx], f[idx], g[idx], grad[idx], hess[idx], lam[idx], d.take(idx), model, settings, refresh
        )
        theta[idx], f[idx], g[idx], grad[idx], hess[idx] = out.theta, out.f, out.g, out.grad, out.hess
        was_exact = exact[idx] | refresh
        stale[idx] = out.failed & ~was_exact
        exact[idx] = was_exact & out.failed
        lam[idx] = torch.where(stale[idx], out.lam / 10.0, out.lam)  # the damping before the failed step
        stalled[idx] |= out.failed & was_exact & (out.lam >= 1e16)
        decrement[idx] = torch.where(out.newton, out.decrement, decrement[idx])
        done[idx] |= out.done
    done |= g.abs().amax(1) < settings.tol_grad * _scale(f)
    return _Descent(theta, f, g, done, stalled, decrement, iterations)


def fit(
    d: PointData,
    family: str,
    settings: FitSettings = FitSettings(),
    form: str = "spread",
    start: torch.Tensor | None = None,
) -> tuple[torch.Tensor, FitReport]:
    """Coefficients theta (P, 4 + K - 2) in ``form`` at the training-CRPS optimum of every point, and how the fit
    ended: the better per point of the descents from each of the family's starts (:func:`_starts`), the first
    of them replaced by ``start`` (P, n) where that is lower (a warm start). The standard form reads each point's
    unit ``d.u`` (:meth:`PointData.with_unit`)."""
    t0 = time.perf_counter()
    model = Model(family, form)
    n = emos_forms.coefficients(distributions.get(family).n_raw, d)
    starts = _starts(d, model, n)
    if start is not None:
        with torch.no_grad():
            lower = crps_per_point(start, d, family, form) < crps_per_point(starts[0], d, family, form)
        starts[0] = torch.where(lower[:, None], start.to(starts[0]), starts[0])
    with torch.no_grad():  # the report's training CRPS, without a prior's penalty
        plain = replace(d, prior=None)
        raw_crps = crps_per_point(emos_forms.raw_start(d.y.shape[0], n, form, d.y), plain, family, form)
        start_crps = torch.stack([crps_per_point(s, plain, family, form) for s in starts]).nan_to_num(torch.inf).amin(0)
    first = _descend(starts[0], d, model, settings, settings.max_iter)
    best = first
    for start in starts[1:]:  # a few iterations from each further start, then on where one of them leads
        best = best.better(_descend(start, d, model, settings, settings.max_iter_far))
    moved = (best.f < first.f).nonzero().squeeze(1)
    if moved.numel():
        best = best.replaced(moved, _descend(best.theta[moved], d.take(moved), model, settings, settings.max_iter))
    limit, gap = torch.zeros_like(best.done), torch.zeros_like(best.f)
    if family == "csg":  # the far basin, then (a second walk from where it ended) its points still short
        far = _far(best)
        best, limit, gap = _toward_the_limit(best, d, model, settings, far, limit, gap)
        best, limit, gap = _toward_the_limit(best, d, model, settings, far & ~best.done & ~limit, limit, gap)
    best = _polished(best, d, model, settings)
    limit &= ~best.done
    best = _restarted(best, d, model, settings, limit)
    if family == "csg":  # a restart can carry a point into the far basin, where it walks to the limit (also
        short = _far(best) & ~best.done & ~limit  # one a flat restart called stalled: 4e-5 above scipy there)
        best, limit, gap = _toward_the_limit(best, d, model, settings, short, limit, gap)
        best = _toward_no_shift(best, d, model, settings)
    report = FitReport(
        method="levenberg-marquardt, then BFGS line searches (per point: finite-difference Hessian, float64)",
        iterations=best.iterations,
        points=int(best.f.numel()),
        converged_points=int(best.done.sum()),
        stalled_points=int((best.stalled & ~best.done & ~limit).sum()),
        limit_points=int(limit.sum()),
        limit_gap_max=float(torch.where(limit, gap, 0.0).amax()) if limit.numel() else 0.0,
        # a point at the limit has its shift's coefficient out at ~1e6, where the gradient has no meaning (its
        # criterion is limit_gap_max); a point converged by its gradient may have taken no Newton step (inf)
        grad_norm_max=float(torch.where(limit[:, None], 0.0, best.g.abs()).amax()),
        newton_decrement_max=float(
            torch.where(best.done & torch.isfinite(best.decrement), best.decrement.clamp_min(0), 0.0).amax()
        ),
        tol_grad=settings.tol_grad,
        tol_decrease=settings.tol_decrease,
        crps_raw=float(raw_crps.mean()),
        crps_start=float(start_crps.mean()),
        crps_fit=float(best.f.mean()),
        seconds=time.perf_counter() - t0,
    )
    return best.theta, report


def _far(best: _Descent) -> torch.Tensor:
    """The csg's far basin (P,): a raw shift above FAR_SHIFT / 2, where the shape's gradient is inexact."""
    return best.theta[:, 4] > FAR_SHIFT / 2


def _toward_the_limit(
    best: _Descent,
    d: PointData,
    model: Model,
    settings: FitSettings,
    todo: torch.Tensor,
    limit: torch.Tensor,
    gap: torch.Tensor,
) -> tuple[_Descent, torch.Tensor, torch.Tensor]:
    """The points ``todo`` (P,) of the csg's far basin, whose optimum can be the censored-normal limit (an
    infinite shift): the shift times RAY, the best, a descent from it. Also which points (P,) are at the limit
    (``limit`` updated at ``todo``), the CRPS still falling at the ray's last factor by at most ``tol_limit``
    (1 + CRPS), and that fall (P,), the ``gap``: the CRPS falls towards the limit like 1 / shift, so the fall of
    the last doubling of the shift is what is left to fall to the limit from there. Or, from shifts of thousands
    where float64 resolves the CRPS to ~1e-8 only (its cancelling terms; it no longer falls monotonically along
    the ray), the CRPS level from here outwards to within ``tol_limit``, the lowest of the ray out there: its
    ``gap`` the rise and fall along the ray (on the targets world's tp24, 2 points at shifts 4,000 to 16,000 left
    short of every criterion by a descent that moved by 1e-8 steps)."""
    far = todo.nonzero().squeeze(1)
    theta, at, f = best.theta[far], d.take(far), best.f[far]
    c, tried, f_ray, out_hi, out_lo = theta[:, 4:5], theta, f, f.clone(), f.clone()
    with torch.no_grad():
        for factor in RAY:  # the location's coefficients (a0, a1 and any seasonal terms after the shift's c)
            # divided by as much as the shift grows: the location kept to first order
            shrink = (1.0 + F.softplus(c)) / (1.0 + F.softplus(c * factor))  # (F, 1)
            ray = torch.cat([theta[:, :2] * shrink, theta[:, 2:4], c * factor, theta[:, 5:] * shrink], dim=1)
            f_before, f_ray = f_ray, crps_per_point(ray, at, "csg", model.form)
            tried, f = torch.where((f_ray < f)[:, None], ray, tried), torch.where(f_ray < f, f_ray, f)
            if factor > 1.0:  # (F,): the CRPS's range from here outwards
                out_hi, out_lo = torch.maximum(out_hi, f_ray), torch.minimum(out_lo, f_ray)
    falling = (f_ray == f) & (f_ray < f_before)  # (F,): the last factor (the farthest) the lowest, still falling
    level = ~falling & (out_lo == f) & (out_hi - out_lo <= settings.tol_limit * _scale(f))  # (F,)
    limit, gap = limit.clone(), gap.clone()
    gap[far] = torch.where(falling, f_before - f_ray, torch.where(level, out_hi - out_lo, 0.0))
    limit[far] = (falling & (gap[far] <= settings.tol_limit * _scale(f))) | level
    keep = f < best.f[far]
    if not keep.any():
        return best, limit, gap
    done = _descend(tried[keep], d.take(far[keep]), model, settings, settings.max_iter)
    return best.replaced(far[keep], _flat_is_stalled(f[keep], done, model)), limit, gap


def _toward_no_shift(best: _Descent, d: PointData, model: Model, settings: FitSettings) -> _Descent:
    """The csg's points short of convergence (stalled ones too) whose raw shift c fell below NEAR_SHIFT, whose
    optimum can be the plain-gamma limit (c -> -inf): c minus NEAR_RAY's steps, the lowest, and a descent from it
    where that is lower. There the shift's gradient falls like e^c while the location's coefficients sit at a
    kink of the CRPS (dry dates: the law's mean shift e^a), where the damped steps stall before c gets far."""
    near = (best.theta[:, 4] < NEAR_SHIFT) & ~best.done  # (P,)
    idx = near.nonzero().squeeze(1)
    if idx.numel() == 0:
        return best
    theta, at = best.theta[idx], d.take(idx)
    tried, f = theta, best.f[idx]
    with torch.no_grad():
        for step in NEAR_RAY:
            ray = torch.cat([theta[:, :4], theta[:, 4:5] - step, theta[:, 5:]], dim=1)
            f_ray = crps_per_point(ray, at, "csg", model.form)  # (A,)
            tried, f = torch.where((f_ray < f)[:, None], ray, tried), torch.where(f_ray < f, f_ray, f)
    keep = (f < best.f[idx]).nonzero().squeeze(1)
    if keep.numel() == 0:
        return best
    again = _descend(tried[keep], at.take(keep), model, settings, settings.max_iter)
    return best.replaced(idx[keep], _flat_is_stalled(f[keep], again, model))


def _polished(best: _Descent, d: PointData, model: Model, settings: FitSettings) -> _Descent:
    """The points short of convergence, on by BFGS with line searches (:func:`emos_bfgs.polish`) from the inverse
    of their damped finite-difference Hessian (never to a higher CRPS); not the csg's far basin, whose shape's
    gradient is too inexact for line searches (on the targets world: 10 s more for 4 % of the polish's gain)."""
    far = _far(best) if model.family == "csg" else torch.zeros_like(best.done)
    idx = (~best.done & ~far).nonzero().squeeze(1)
    if idx.numel() == 0:
        return best
    at, lam = d.take(idx), torch.full_like(best.f[idx], 1e-3)
    chol = emos_bfgs.damped_cholesky(
        hessian(best.theta[idx], value_grad(best.theta[idx], at, model)[2], at, model), lam
    )[0]
    theta, f, g, done = emos_bfgs.polish(
        best.theta[idx], torch.cholesky_inverse(chol), lambda t, i: value_grad(t, at.take(i), model)[:2],
        settings.max_iter_polish, settings.tol_grad * _scale(best.f[idx]), lambda t, i: _value(t, at.take(i), model),
    )  # fmt: skip
    return best.replaced(idx, _Descent(theta, f, g, done, best.stalled[idx], best.decrement[idx], best.iterations))


def _value(theta: torch.Tensor, d: PointData, model: Model) -> torch.Tensor:
    """Each point's CRPS (P,) as :func:`value_grad` gives it, without the gradient (no autograd graph)."""
    with torch.no_grad():
        return crps_per_point(theta, d, model.family, model.form)


def fit_bands(
    bands: Iterable[PointData], family: str, settings: FitSettings = FitSettings(), form: str = "spread"
) -> tuple[torch.Tensor, FitReport]:
    """:func:`fit` of each band of points in turn (the points do not interact, so each point's coefficients
    are those of one fit over every point), :func:`representable`, and the merged report: theta (P, n) in the
    bands' order."""
    thetas, reports = [], []
    for d in bands:
        theta, report = fit(d, family, settings, form)
        thetas.append(representable(theta, d, family, form))
        reports.append(report)
    return torch.cat(thetas), FitReport.merged(reports)


def representable(theta: torch.Tensor, d: PointData, family: str, form: str) -> torch.Tensor:
    """Fitted coefficients theta (P, n) as the model stores them: the csg's points whose shift walked past
    FAR_SHIFT towards the censored-normal limit brought back to it. The model evaluates its law in float32,
    which is wrong that far out: at raw shifts of 1e6 to 1e9 the tp24 preset's checkpoint validated 0.7917 on the
    targets world where its float64 fit said 0.7852 (one point 16 above). Of two ways back, each point takes the
    one of lower training CRPS: the shift alone, or with the log-mean's coefficients (a0, a1, the seasonal
    terms) scaled by the shift's ratio, which keeps the location (m + shift) e^a - shift to first order in a. A
    point whose CRPS would rise by more than STORE_TOL (1 + CRPS) keeps its fit."""
    idx = (theta[:, 4] > FAR_SHIFT).nonzero().squeeze(1) if family == "csg" else theta.new_zeros(0, dtype=torch.long)
    if idx.numel() == 0:
        return theta
    now, at = theta[idx], replace(d.take(idx), prior=None)  # (A, n), the points' training data
    plain = now.clone()
    plain[:, 4] = FAR_SHIFT
    scaled = plain.clone()
    k = special.softplus(now[:, 4]) / special.softplus(plain[:, 4])  # (A,): the shift's ratio
    n = theta.shape[1]
    log_mean = [0, 1, *(range(n - emos_forms.SEASON, n) if d.season is not None else ())]
    scaled[:, log_mean] *= k[:, None]
    with torch.no_grad():
        f = torch.stack([crps_per_point(t, at, family, form) for t in (now, scaled, plain)]).nan_to_num(torch.inf)
    back = torch.where((f[1] <= f[2])[:, None], scaled, plain)  # (A, n)
    ok = f[1:].amin(0) <= f[0] + STORE_TOL * (1.0 + f[0])  # (A,)
    out = theta.clone()
    out[idx[ok]] = back[ok]
    return out


def _restarted(best: _Descent, d: PointData, model: Model, settings: FitSettings, limit: torch.Tensor) -> _Descent:
    """The points short of every criterion (P,) after the polish, neither stalled nor at the limit ``limit``,
    descended again from where they are with a fresh damping and finite-difference Hessian, up to
    ``settings.restarts`` times (never to a higher CRPS: a descent keeps only lowering steps). On the targets
    world's tp24, 21 of the 22 points left short converged within 100 more iterations; the last, whose
    BFGS-updated Hessian and damping had held it 1e-11 short for 1,000 iterations, at once on a second restart."""
    for _ in range(settings.restarts):
        idx = (~best.done & ~best.stalled & ~limit).nonzero().squeeze(1)
        if idx.numel() == 0:
            break
        again = _descend(best.theta[idx], d.take(idx), model, settings, settings.max_iter)
        best = best.replaced(idx, _flat_is_stalled(best.f[idx], again, model))
    return best


def _flat_is_stalled(f: torch.Tensor, again: _Descent, model: Model) -> _Descent:
    """``again``, a whole descent of A points from CRPS ``f`` (A,), with the csg's points it lowered by no more
    than float64 resolves (1e-13 (1 + CRPS)) and left short counted stalled: at the optimum as far as float64
    tells (at shifts of hundreds of units the gradient's noise is ~1e-8, above ``tol_grad``; from thousands, where
    the ray of :func:`_toward_the_limit` leaves a point whose CRPS no longer falls monotonically, no step lowers
    it). Not a location-scale law's: its points short of the criterion have their optimum at infinity (sigma -> 0
    through all its coefficients), each descent lowering the CRPS a little: said, not settled."""
    if laws.get(model.family).location_scale:
        return again
    flat = (f - again.f <= 1e-13 * _scale(f)) & ~again.done  # (A,)
    return _Descent(again.theta, again.f, again.g, again.done, again.stalled | flat, again.decrement, again.iterations)
