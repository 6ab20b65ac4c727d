"""The local EMOS's model forms: how a point's coefficients make the head's raw outputs at each date.

Both forms predict a location-scale law through the head of :mod:`postcast.models.distributions`, whose raw
outputs (a, b) give location m + s a and scale s exp(b) from the raw ensemble's mean m and (floored) std s.
With x_mean, x_std the target's normalised ensemble mean and std (per point, the training store's statistics):

``spread`` (postcast's first form): a = a0 + a1 x_mean, b = b0 + b1 x_std, so the location is
    m + s (a0 + a1 x_mean) and the scale s exp(b0 + b1 x_std): both scale with the date's own spread.
``standard`` (Gneiting et al. 2005; Thorarinsdottir and Gneiting 2010 for the truncated normal; the form
    operational suites fit): location m + u (a0 + a1 x_mean), linear in the ensemble mean, and
    scale^2 = c^2 + d^2 s^2 with c = u b0, d = b1 (squared, as IMPROVER fits it), where u is the point's unit, the
    root mean square of its training spread (fixed before the fit, kept in the model). The constant c^2 is a
    floor: a date whose members happen to agree still gets a spread, where the spread form's s exp(b) collapses
    with s. Squares rather than exponentials: an optimum at c = 0 or d = 0 is then an ordinary minimum at b0 = 0
    or b1 = 0, which Newton's method reaches in a step or two (with c = u exp(b0) the fit walked b0 towards
    -inf, its gradient decaying like exp(2 b0), and hit its iteration ceiling on the targets world), and the raw
    ensemble is theta = (0, 0, 0, 1) exactly.

``sh`` (after Scheuerer and Hamill 2015, the censored shifted gamma's operational form): the gamma X of
    Y = max(0, X - shift) has mean (max(m, 0) + shift) (1 + max(m, 0) / u)^a1 exp(a0), std sqrt(c^2 + d^2 s^2)
    (c = u b0, d = b1, as the standard form's scale) and shift u softplus(c2), a constant of the point. The
    spread form's shift s softplus(c2) and std s exp(b) both collapse on a date whose members agree (all dry),
    where this form keeps the point's floor; and its mean grows like exp(a1 x_mean), which ran away at the wet
    test dates, where this form's grows like a power of the ensemble mean (Scheuerer and Hamill's is linear in
    it). The power reads the raw ensemble mean in units of the point's spread, so it is the same law in mm or m
    (checkpoint format 4 read the normalised x_mean clamped at 0: every date drier than the point's training
    mean predicted alike). Its raw outputs: a = a0 + a1 log(1 + max(m, 0) / u), b as the standard form's and
    c = softplus^-1((u / s) softplus(c2)), so that the head's shift s softplus(c) is u softplus(c2).

Seasonal terms (``season: true``, every form): the location's bracket gains a_sin sin(day) + a_cos cos(day),
day the init date's angle in the year (the sample's season features), two more coefficients per point after the
others: a bias that follows the season, which a fit of all training dates otherwise takes for noise (Lang et al.
2020 compare such harmonic terms with training on a sliding window). In the sh form they enter the log of the
gamma's mean, so the season scales the mean by exp(a_sin sin + a_cos cos).

In raw outputs the standard form is a = (u / s)(a0 + a1 x_mean) (linear in the coefficients) and
b = log(sqrt(c^2 + d^2 s^2) / s) (not linear in b0, b1): :func:`columns` gives each coefficient's column of the
Jacobian d raw / d theta at a date, :func:`curvature` the second-derivative term that b adds to the Hessian,
so the fit's Gauss-Newton-like Hessian sum_t J_t^T H_t J_t stays exact. A further output of a family with more
than two (none of the location-scale families has one) is a constant per point in either form.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

FORMS = ("spread", "standard", "sh")
Column = tuple[int, torch.Tensor | None]  # (raw output, its factor per date (P, N); None for 1)


class Data(Protocol):
    """What a form reads of a point's training data, each (P, N): see :class:`emos_objective.PointData`."""

    @property
    def xm(self) -> torch.Tensor: ...
    @property
    def xs(self) -> torch.Tensor: ...
    @property
    def m(self) -> torch.Tensor: ...
    @property
    def s(self) -> torch.Tensor: ...
    @property
    def u(self) -> torch.Tensor | None: ...
    @property
    def season(self) -> torch.Tensor | None: ...


SEASON = 2  # the seasonal form's coefficients: of the sine and cosine of the day of year, in the location


def coefficients(outputs: int, d: Data) -> int:
    """Coefficients per point, n, of a head with ``outputs`` raw outputs: (a0, a1, b0, b1), a constant for each
    output past two, and the seasonal terms' :data:`SEASON` where the data carry the season."""
    return 4 + outputs - 2 + (0 if d.season is None else SEASON)


def _seasonal(theta: torch.Tensor, d: Data) -> torch.Tensor | None:
    """The location's seasonal term (P, N): a_sin sin(day) + a_cos cos(day), the last two coefficients; None
    without the season."""
    if d.season is None:
        return None
    return (d.season * theta[:, None, -SEASON:]).sum(-1)


def raw_start(points: int, n: int, form: str, like: torch.Tensor) -> torch.Tensor:
    """Coefficients (points, n) whose law is the raw ensemble's: 0, and d = 1 in the standard form."""
    theta = torch.zeros(points, n, dtype=torch.float64, device=like.device)
    if form != "spread":
        theta[:, 3] = 1.0
    return theta


def nudged(raw: torch.Tensor, form: str) -> list[torch.Tensor]:
    """The standard form's raw start moved off b0 = 0 (c = u / 10), or none: at b0 = 0 the CRPS is even in b0,
    so its gradient there is 0 and a descent from the raw ensemble never takes up the constant c^2 (one point of
    the targets world's t2m stayed at 0.6352 for 100 iterations, where its optimum is lower)."""
    if form == "spread":
        return []
    out = raw.clone()
    out[:, 2] = 0.1
    return [out]


def check(form: str) -> str:
    if form not in FORMS:
        msg = f"model.net.form {form!r}: choose one of {list(FORMS)} (or auto, chosen on the validation dates)"
        raise ValueError(msg)
    return form


def auto(family: str) -> list[str]:
    """The forms ``form: auto`` fits for ``family``: the spread form and the family's operational one."""
    return ["spread", "sh" if family == "csg" else "standard"]


def unit_of(d: Data) -> torch.Tensor:
    """The standard and sh forms' unit per sample, (P, N): the data's own ``u``, which the fit sets from the training
    spread (:func:`rms_spread`)."""
    if d.u is None:
        msg = "the standard form needs each point's unit u (PointData.with_unit)"
        raise ValueError(msg)
    return d.u


def rms_spread(s: torch.Tensor, w: torch.Tensor, floor: float) -> torch.Tensor:
    """Each point's unit: the root mean square of its spread s (P, N) over the dates weighted by w (P, N), (P,)."""
    return ((w * s * s).sum(1) / w.sum(1).clamp_min(1e-300)).sqrt().clamp_min(floor)


@dataclass(frozen=True)
class _Scale:
    """The standard form's scale at each date, each (P, N): raw b = log(sqrt(v) / s) with v = (u b0)^2 + (b1 s)^2,
    and the pieces of its derivatives: uu = u^2 / v, ss = s^2 / v."""

    b: torch.Tensor
    uu: torch.Tensor
    ss: torch.Tensor


def _scale(theta: torch.Tensor, d: Data) -> _Scale:
    u2, s2 = unit_of(d) ** 2, d.s**2  # (P, N)
    v = (u2 * theta[:, 2:3] ** 2 + s2 * theta[:, 3:4] ** 2).clamp_min(1e-300)
    return _Scale(0.5 * torch.log(v) - torch.log(d.s), u2 / v, s2 / v)


@dataclass(frozen=True)
class _Shift:
    """The sh form's raw shift c = softplus^-1(r), r = k softplus(c2), k = u / s, at each date, each (P, N), and
    its derivatives in c2: dc = k sigmoid(c2) / q and d2c = k sigmoid (1 - sigmoid) / q - (k sigmoid)^2 e^-r / q^2,
    q = 1 - e^-r."""

    c: torch.Tensor
    dc: torch.Tensor
    d2c: torch.Tensor


def _shift(theta: torch.Tensor, d: Data) -> _Shift:
    k, c2 = unit_of(d) / d.s, theta[:, 4:5]  # (P, N), (P, 1)
    sig = torch.sigmoid(c2)
    r = (k * torch.nn.functional.softplus(c2)).clamp_min(1e-300)
    q = -torch.expm1(-r)
    big, small = r.clamp_min(30.0), r.clamp_max(30.0)  # each branch finite where the other is chosen (autograd)
    c = torch.where(r > 30.0, big + torch.log1p(-torch.exp(-big)), torch.log(torch.expm1(small)))
    d2c = k * sig * (1.0 - sig) / q - (k * sig) ** 2 * torch.exp(-r) / q**2
    return _Shift(c, k * sig / q, d2c)


def _log_mean(d: Data) -> torch.Tensor:
    """The sh form's predictor of the location, log(1 + max(m, 0) / u) (P, N)."""
    return torch.log1p(d.m.clamp_min(0.0) / unit_of(d))


def raw(theta: torch.Tensor, d: Data, form: str) -> torch.Tensor:
    """The head's raw outputs (P, N, K) for coefficients theta (P, :func:`coefficients`) in ``form``."""
    seasonal = _seasonal(theta, d)  # (P, N) or None
    if form == "sh":
        a = theta[:, 0:1] + theta[:, 1:2] * _log_mean(d)  # (P, N): the log of the gamma's mean, less its fixed part
        if seasonal is not None:
            a = a + seasonal
        return torch.stack([a, _scale(theta, d).b, _shift(theta, d).c], dim=-1)
    location = theta[:, 0:1] + theta[:, 1:2] * d.xm  # (P, N)
    if seasonal is not None:
        location = location + seasonal
    if form == "spread":
        a, b = location, theta[:, 2:3] + theta[:, 3:4] * d.xs
    else:
        a, b = unit_of(d) / d.s * location, _scale(theta, d).b
    extra = theta[:, 4 : theta.shape[1] - (0 if seasonal is None else SEASON)]  # (P, K - 2)
    return torch.cat([a.unsqueeze(-1), b.unsqueeze(-1), extra.unsqueeze(1).expand(-1, a.shape[1], -1)], dim=-1)


def columns(theta: torch.Tensor, d: Data, k: int, form: str) -> list[Column]:
    """Each coefficient's Jacobian column at every date: the raw output it moves and by what factor."""
    extra: list[Column] = [(j, None) for j in range(2, k)]
    season = [] if d.season is None else [d.season[..., j] for j in range(SEASON)]  # each (P, N)
    if form == "spread":
        return [(0, None), (0, d.xm), (1, None), (1, d.xs), *extra, *((0, z) for z in season)]
    sc = _scale(theta, d)
    scale: list[Column] = [(1, sc.uu * theta[:, 2:3]), (1, sc.ss * theta[:, 3:4])]
    if form == "sh":
        return [(0, None), (0, _log_mean(d)), *scale, (2, _shift(theta, d).dc), *((0, z) for z in season)]
    ratio = unit_of(d) / d.s  # (P, N)
    return [(0, ratio), (0, ratio * d.xm), *scale, *extra, *((0, ratio * z) for z in season)]


def curvature(theta: torch.Tensor, d: Data, grad: torch.Tensor, form: str) -> torch.Tensor | None:
    """The Hessian's second-derivative term sum_t dCRPS/db_t d^2 b_t / dtheta^2, (P, n, n), from the gradient in
    the raw outputs ``grad`` (P, N, K); None where the raw outputs are linear in theta (the spread form).
    Standard form, with db/db0 = uu b0 and db/db1 = ss b1: d^2 b / db0^2 = uu (1 - 2 uu b0^2),
    d^2 b / db1^2 = ss (1 - 2 ss b1^2), d^2 b / db0 db1 = -2 uu ss b0 b1; the sh form's shift adds
    dCRPS/dc_t d^2 c_t / dc2^2 (:class:`_Shift`)."""
    if form == "spread":
        return None
    sc, b0, b1 = _scale(theta, d), theta[:, 2:3], theta[:, 3:4]
    gb = grad[..., 1]  # (P, N): dCRPS / db at each date
    out = torch.zeros(theta.shape[0], theta.shape[1], theta.shape[1], dtype=theta.dtype, device=theta.device)
    out[:, 2, 2] = (gb * sc.uu * (1.0 - 2.0 * sc.uu * b0**2)).sum(1)
    out[:, 3, 3] = (gb * sc.ss * (1.0 - 2.0 * sc.ss * b1**2)).sum(1)
    out[:, 2, 3] = out[:, 3, 2] = (gb * -2.0 * sc.uu * sc.ss * b0 * b1).sum(1)
    if form == "sh":
        out[:, 4, 4] = (grad[..., 2] * _shift(theta, d).d2c).sum(1)
    return out


def standardised_error(d: Data, m: torch.Tensor, y: torch.Tensor, form: str) -> torch.Tensor:
    """The error (y - m) (P, N) in the form's unit of location: s (spread) or u (standard)."""
    return (y - m) / (d.s if form == "spread" else unit_of(d))


def scale_start(var: torch.Tensor, form: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(b0, b1), each (P,), whose scale matches a residual variance ``var`` (P,) of :func:`standardised_error`:
    the spread form's s exp(b0); the standard form's c^2 + d^2 s^2 with the variance split evenly (u^2 is the
    mean of s^2)."""
    if form == "spread":
        return (0.5 * torch.log(var.clamp_min(1e-12))).clamp(-20.0, 20.0), torch.zeros_like(var)
    half = (0.5 * var).clamp_min(1e-12).sqrt()
    return half, half.clone()
