"""Per-point damped Newton steps and a per-point BFGS polish, vectorised over independent points.

:func:`damped_cholesky` factors each point's Hessian with Levenberg-Marquardt damping and
:func:`hessian_update` updates it between refreshes (the fit's steps, :mod:`postcast.models.emos_fit`).
:func:`polish` goes on from where those iterations left a point short of convergence, by BFGS on the inverse
Hessian with a backtracking (Armijo) line search of its own at each point. It is for optima in a narrow, strongly
curved valley, such as a censored shifted gamma that puts nearly all of one wet date's mass on its observation:
there the finite-difference Hessian, taken across a valley as narrow as its step, misleads the damped steps,
which then crawl (1.9e-4 above scipy's optimum after 100 iterations at one point of tests/test_convergence.py),
whereas the secant updates follow the gradient actually met. Only steps that lower a point's value are kept: a
point never ends worse than it started.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

ValueGrad = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
Value = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
ARMIJO = 1e-4  # the sufficient decrease a trial step must reach: f(x + t p) <= f(x) + ARMIJO t g.p
HALVINGS = 30  # trial step lengths 1, 1/2, ... 2^-29 of the BFGS direction per iteration


def damped_cholesky(hess: torch.Tensor, lam: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The Cholesky factor (P, n, n) of each Hessian (P, n, n) damped by lambda (P,) times its diagonal,
    where it exists (P,) (identity elsewhere), and the damping used (P,): lambda grows tenfold at a point until
    its damped Hessian is positive definite (at most 12 times)."""
    diag = hess.diagonal(dim1=1, dim2=2).clamp_min(0.0)  # (P, n)
    scale = torch.maximum(diag, 1e-3 * diag.amax(1, keepdim=True) + 1e-300)  # Marquardt, no flat coordinate at 0
    for _ in range(12):
        chol, info = torch.linalg.cholesky_ex(hess + torch.diag_embed(lam[:, None] * scale))
        ok = info == 0
        if bool(ok.all()):
            break
        lam = torch.where(ok, lam, lam * 10.0)
    eye = torch.eye(hess.shape[1], dtype=hess.dtype, device=hess.device).expand_as(hess)
    return torch.where(ok[:, None, None], chol, eye), ok, lam


def saddle_free(hess: torch.Tensor, g: torch.Tensor, lam: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The step (P, n) -V (|E| + lambda max|E|)^-1 V^T g of each indefinite Hessian H = V E V^T (P, n, n) at
    gradient g (P, n), damping lambda (P,): Newton's step with each negative curvature taken as positive, a
    descent direction that keeps the Hessian's scale in every other direction (Dauphin et al. 2014); and where
    it exists (P,): not where H or g is not finite."""
    finite = torch.isfinite(hess).all(2).all(1) & torch.isfinite(g).all(1)  # (P,): else no step
    size = hess.abs().amax((1, 2), keepdim=True).clamp_min(1e-300)  # eigh of H / size: entries of order 1
    unit = torch.where(
        finite[:, None, None], 0.5 * (hess + hess.transpose(1, 2)) / size, torch.eye(hess.shape[1]).to(hess)
    )
    e, v = torch.linalg.eigh(unit)  # (P, n), (P, n, n)
    mag = e.abs()
    top = mag.amax(1, keepdim=True).clamp_min(1e-300)
    mag = (torch.maximum(mag, 1e-10 * top) + lam[:, None] * top) * size[:, 0]
    along = (v.transpose(1, 2) @ g.unsqueeze(-1)).squeeze(-1)  # (P, n): g in the eigenvectors
    step = torch.nan_to_num(-(v @ (along / mag).unsqueeze(-1)).squeeze(-1))
    return torch.where(finite[:, None], step, 0.0), finite


def hessian_update(hess: torch.Tensor, s: torch.Tensor, dg: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """The BFGS update of each point's Hessian (P, n, n) for a step s (P, n) that changed the gradient by dg,
    where the curvature condition holds (s . dg > 0) and ``where`` (P,)."""
    sy = (s * dg).sum(1)  # (P,)
    hs = (hess @ s.unsqueeze(-1)).squeeze(-1)  # (P, n)
    shs = (s * hs).sum(1)
    ok = where & (sy > 1e-12 * s.norm(dim=1) * dg.norm(dim=1)) & (shs > 0)
    sy, shs = torch.where(ok, sy, 1.0), torch.where(ok, shs, 1.0)
    change = (
        dg.unsqueeze(-1) * dg.unsqueeze(1) / sy[:, None, None] - hs.unsqueeze(-1) * hs.unsqueeze(1) / shs[:, None, None]
    )
    return hess + torch.where(ok[:, None, None], change, 0.0)


def _inverse_update(inv: torch.Tensor, s: torch.Tensor, dg: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """BFGS update of each inverse Hessian (P, n, n) for a step s (P, n) that changed the gradient by dg, where
    ``where`` (P,) and the curvature condition s.dg > 0 hold: (I - r s dg^T) inv (I - r dg s^T) + r s s^T."""
    sy = (s * dg).sum(1)  # (P,)
    ok = where & (sy > 1e-12 * s.norm(dim=1) * dg.norm(dim=1))
    r = torch.where(ok, 1.0 / torch.where(ok, sy, 1.0), 0.0)[:, None, None]  # (P, 1, 1)
    eye = torch.eye(s.shape[1], dtype=s.dtype, device=s.device)
    left = eye - r * s.unsqueeze(-1) * dg.unsqueeze(1)  # (P, n, n)
    return left @ inv @ left.transpose(1, 2) + r * s.unsqueeze(-1) * s.unsqueeze(1)


def _line_search(
    theta: torch.Tensor, f: torch.Tensor, g: torch.Tensor, p: torch.Tensor, value: Callable[..., torch.Tensor],
    idx: torch.Tensor,
) -> torch.Tensor:  # fmt: skip
    """Per point (P,), the longest of the trial lengths 2^-j (j < HALVINGS) along p (P, n) that meets the
    Armijo condition, 0 where none does; ``value(theta, idx)`` is the value (A,) at the points idx (A,)."""
    slope = (g * p).sum(1)  # (P,) negative along a descent direction
    length = torch.zeros_like(f)
    todo = slope < 0
    t = 1.0
    for _ in range(HALVINGS):
        at = todo.nonzero().squeeze(1)
        if at.numel() == 0:
            break
        trial = value(theta[at] + t * p[at], idx[at])  # (A,)
        met = torch.isfinite(trial) & (trial <= f[at] + ARMIJO * t * slope[at])
        length[at[met]] = t
        todo[at[met]] = False
        t *= 0.5
    return length


def polish(
    theta: torch.Tensor, inv: torch.Tensor, value_grad: ValueGrad, max_iter: int, tol_grad: torch.Tensor,
    value: Value | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """BFGS from theta (P, n) with inverse Hessians inv (P, n, n), each point its own line search, until its
    max |gradient| is below tol_grad (P,) or no step lowers its value, at most max_iter iterations.
    ``value_grad(theta_A, idx)`` gives the value (A,) and gradient (A, n) at the points idx (A,); ``value``, the
    same value without the gradient, serves the line searches' trials where given (a trial needs no gradient:
    up to HALVINGS of them per iteration). Returns theta, value, gradient and whether each point ended below its
    tolerance."""
    trial_value = value if value is not None else lambda t, at: value_grad(t, at)[0]
    everyone = torch.arange(theta.shape[0], device=theta.device)
    f, g = value_grad(theta, everyone)
    theta, inv, first = theta.clone(), inv.clone(), inv.clone()
    active = g.abs().amax(1) >= tol_grad  # (P,)
    restarted = torch.ones_like(active)  # the inverse is the first one (no update since)
    for _ in range(max_iter):
        idx = active.nonzero().squeeze(1)
        if idx.numel() == 0:
            break
        p = -(inv[idx] @ g[idx].unsqueeze(-1)).squeeze(-1)  # (A, n) the quasi-Newton direction
        length = _line_search(theta[idx], f[idx], g[idx], p, trial_value, idx)
        step = length[:, None] * p
        f_new, g_new = value_grad(theta[idx] + step, idx)
        keep = (length > 0) & torch.isfinite(f_new) & (f_new <= f[idx])
        inv[idx] = torch.where(keep[:, None, None], _inverse_update(inv[idx], step, g_new - g[idx], keep), first[idx])
        theta[idx] = torch.where(keep[:, None], theta[idx] + step, theta[idx])
        f[idx], g[idx] = torch.where(keep, f_new, f[idx]), torch.where(keep[:, None], g_new, g[idx])
        # a failed search on an updated inverse starts again from the first one; on the first one, the point ends
        active[idx] = (keep | ~restarted[idx]) & (g[idx].abs().amax(1) >= tol_grad[idx])
        restarted[idx] = ~keep
    return theta, f, g, g.abs().amax(1) < tol_grad
