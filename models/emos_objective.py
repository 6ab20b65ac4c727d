"""What the local EMOS fit minimises (:mod:`postcast.models.emos_fit`): the training data per point
(:class:`PointData`), what is fitted (:class:`Model`: the family and the form of its coefficients) and each
point's mean training CRPS of coefficients theta with its gradient and Hessian in them (:func:`crps_per_point`,
:func:`value_grad`, :func:`hessian`), every point at once, float64.

The raw outputs are linear in the coefficients (raw_t = J_t theta at date t), so the Hessian is
H_p = sum_t J_t^T H_t J_t from each date's K x K Hessian H_t, by forward differences of the gradient in the raw
outputs: K backward passes (3 for the csg) instead of one per coefficient (5).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from postcast.datasets import laws
from postcast.models import distributions, emos_forms


@dataclass(frozen=True)
class Prior:
    """A quadratic penalty that shrinks each point's coefficients towards a centre: the objective gains
    sum_j weight_j (theta_j - centre_j)^2 per point, each (P, n); a weight of 0 leaves a coefficient free."""

    centre: torch.Tensor
    weight: torch.Tensor

    def take(self, idx: torch.Tensor) -> Prior:
        return Prior(self.centre[idx], self.weight[idx])

    def value(self, theta: torch.Tensor) -> torch.Tensor:
        return (self.weight * (theta - self.centre) ** 2).sum(1)  # (P,)

    def grad(self, theta: torch.Tensor) -> torch.Tensor:
        return 2.0 * self.weight * (theta - self.centre)  # (P, n)


@dataclass(frozen=True)
class PointData:
    """Training data per point, points first: each (P, N) float64 (N dates); ``w`` weights each date by
    1 / (finite truths at the point), 0 where the truth is missing (its ``y`` filled with ``m``); ``u`` the
    standard form's unit of the point each sample belongs to (:mod:`postcast.models.emos_forms`), or None;
    ``season`` (P, N, 2) the sine and cosine of each sample's day of year, the seasonal form's predictors, or None."""

    xm: torch.Tensor
    xs: torch.Tensor
    m: torch.Tensor
    s: torch.Tensor
    y: torch.Tensor
    w: torch.Tensor
    u: torch.Tensor | None = None
    season: torch.Tensor | None = None
    prior: Prior | None = None

    @classmethod
    def from_fields(
        cls,
        xm: torch.Tensor,
        xs: torch.Tensor,
        m: torch.Tensor,
        s: torch.Tensor,
        y: torch.Tensor,
        min_std: float,
        sin: torch.Tensor | None = None,
        cos: torch.Tensor | None = None,
    ) -> PointData:
        """From (N, H, W) fields: normalised ensemble mean and std, the raw ensemble's m and s, the truth y, and
        the season's sine and cosine of each date (both or neither)."""

        def points(t: torch.Tensor) -> torch.Tensor:
            return t.detach().double().flatten(1).T.contiguous()  # (N, H, W) -> (P, N)

        yp, mp = points(y), points(m)
        ok = torch.isfinite(yp)
        count = ok.sum(1, keepdim=True).clamp_min(1)
        season = None if sin is None or cos is None else torch.stack([points(sin), points(cos)], dim=-1)
        return cls(
            points(xm),
            points(xs),
            mp,
            points(s).clamp_min(min_std),
            torch.where(ok, yp, mp),
            ok.double() / count,
            season=season,
        )

    def take(self, idx: torch.Tensor) -> PointData:
        """The points ``idx`` (A,) of each field, (A, N)."""
        xm, xs, m, s, y, w = (t[idx] for t in (self.xm, self.xs, self.m, self.s, self.y, self.w))
        u, season = (None if t is None else t[idx] for t in (self.u, self.season))
        return PointData(xm, xs, m, s, y, w, u, season, None if self.prior is None else self.prior.take(idx))

    def with_unit(self, unit: torch.Tensor) -> PointData:
        """This data with each point's unit ``unit`` (P,) for every date (fixed from the training spread)."""
        return replace(self, u=unit.to(self.s)[:, None].expand_as(self.s))

    def training_unit(self, min_std: float = 1e-6) -> torch.Tensor:
        """Each point's unit from its own dates (P,): the root mean square of its spread."""
        return emos_forms.rms_spread(self.s, self.w, min_std)


@dataclass(frozen=True)
class Model:
    """What is fitted: the predictive family and the form of its coefficients (:mod:`emos_forms`)."""

    family: str
    form: str = "spread"

    def __post_init__(self) -> None:
        emos_forms.check(self.form)
        families = {"spread": None, "standard": laws.location_scale(), "sh": ("csg",)}[self.form]
        if families is not None and self.family not in families:
            msg = f"the {self.form} EMOS form is for the families {list(families)}, not {self.family!r}"
            raise ValueError(msg)


def _raw_crps(raw: torch.Tensor, d: PointData, family: str) -> torch.Tensor:
    """Mean training CRPS at each point (P,) of the raw outputs (P, N, K)."""
    crps = distributions.get(family).from_raw(raw, d.m, d.s).crps(d.y)  # (P, N)
    return (torch.nan_to_num(crps, nan=torch.inf) * d.w).sum(1)


def crps_per_point(theta: torch.Tensor, d: PointData, family: str, form: str = "spread") -> torch.Tensor:
    """Mean training CRPS at each point, (P,), for coefficients theta (P, 4 + K - 2) in ``form``, plus the
    penalty of ``d.prior`` where the data carry one (what the fit minimises)."""
    f = _raw_crps(emos_forms.raw(theta, d, form), d, family)
    return f if d.prior is None else f + d.prior.value(theta)


def _raw_value_grad(raw: torch.Tensor, d: PointData, family: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Each point's CRPS (P,) and its gradient in each date's raw outputs (P, N, K), one backward pass."""
    r = raw.detach().requires_grad_(True)
    f = _raw_crps(r, d, family)
    (grad,) = torch.autograd.grad(f.sum(), r)
    return f.detach(), torch.nan_to_num(grad, nan=0.0, posinf=0.0, neginf=0.0)


def _times(t: torch.Tensor, factor: torch.Tensor | None) -> torch.Tensor:
    return t if factor is None else t * factor


def value_grad(theta: torch.Tensor, d: PointData, model: Model) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each point's CRPS (P,), gradient (P, n) and gradient in the raw outputs (P, N, K) (the points are
    independent: one backward pass)."""
    f, grad = _raw_value_grad(emos_forms.raw(theta, d, model.form), d, model.family)
    coefs = emos_forms.columns(theta, d, grad.shape[-1], model.form)
    g = torch.stack([_times(grad[..., k], x).sum(1) for k, x in coefs], dim=1)  # (P, n): sum_t J_t^T grad_t
    if d.prior is not None:
        f, g = f + d.prior.value(theta), g + d.prior.grad(theta)
    return f, g, grad


def hessian(theta: torch.Tensor, grad: torch.Tensor, d: PointData, model: Model) -> torch.Tensor:
    """Each point's Hessian (P, n, n), sum_t J_t^T H_t J_t (plus the form's curvature term), with each date's
    Hessian in its K raw outputs H_t by forward differences of their gradient ``grad`` (P, N, K): K backward
    passes, not n."""
    raw = emos_forms.raw(theta, d, model.form)  # (P, N, K)
    cols = []  # cols[l][..., k]: d grad_k / d raw_l, each (P, N, K)
    for j in range(raw.shape[-1]):
        h = 1e-6 * (1.0 + raw[..., j].abs())  # (P, N)
        step = torch.zeros_like(raw)
        step[..., j] = h
        cols.append((_raw_value_grad(raw + step, d, model.family)[1] - grad) / h.unsqueeze(-1))
    coefs = emos_forms.columns(theta, d, raw.shape[-1], model.form)
    hess = torch.empty(theta.shape[0], len(coefs), len(coefs), dtype=theta.dtype, device=theta.device)
    for i, (k, x) in enumerate(coefs):
        for j, (m, z) in enumerate(coefs[: i + 1]):
            per_date = 0.5 * (cols[m][..., k] + cols[k][..., m])  # (P, N): H_t[k, m], symmetrised
            hess[:, i, j] = hess[:, j, i] = _times(_times(per_date, x), z).sum(1)
    bend = emos_forms.curvature(theta, d, grad, model.form)
    if bend is not None:
        hess = hess + bend
    return hess if d.prior is None else hess + torch.diag_embed(2.0 * d.prior.weight)
