"""Semi-local EMOS: each point fitted on its own training dates plus those of its neighbours (Lerch and Baran
2017's similarity-based semi-local estimation, with similarity by distance on the grid).

A point with few dates overfits when fitted alone; a regional fit loses what is local. Pooling takes the middle:
point p's objective is its own mean CRPS plus ``weight`` times each neighbour's, over the grid cells within
``radius`` rows and columns of p (longitude wrapping round a global grid), normalised to a weighted mean. Every
neighbour's sample keeps its own inputs (its normalised ensemble mean and spread, its unit u), so the
coefficients stay dimensionless and the fitted model is still one set of coefficients per point, read as a
local EMOS's. ``radius`` 0 or ``weight`` 0 is the local fit itself. Which setting wins is chosen on the
validation dates (:mod:`postcast.models.emos_select`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from postcast.models.emos_objective import PointData, Prior


@dataclass(frozen=True)
class Pooling:
    radius: int = 0  # grid cells, in latitude and longitude
    weight: float = 0.0  # a neighbour's dates count this much relative to the point's own (0: local, 1: equal)

    def __post_init__(self) -> None:
        if self.radius < 0 or not 0.0 <= self.weight <= 1.0:
            msg = f"pooling {self}: radius must be >= 0 grid cells and weight within [0, 1]"
            raise ValueError(msg)

    @property
    def local(self) -> bool:
        return self.radius == 0 or self.weight == 0.0

    @property
    def neighbours(self) -> int:
        """Points whose dates each point is fitted on (itself included)."""
        return 1 if self.local else (2 * self.radius + 1) ** 2

    def label(self) -> str:
        return "local" if self.local else f"radius {self.radius}, weight {self.weight:g}"


def pooled(d: PointData, shape: tuple[int, int], core: slice, pool: Pooling, wrap: bool) -> PointData:
    """The pooled data of the points of rows ``core`` (relative to ``d``'s first row) of the grid block ``d``
    holds, ``shape`` = (rows, W) with points row-major: each point's own dates, then each neighbour's, as one
    series (A, N x neighbours) with weights renormalised per point (0 where no sample has a truth)."""
    rows, width = shape
    if pool.local:
        return d.take(torch.arange(core.start * width, core.stop * width))
    r = pool.radius
    offsets = [(0, 0)] + [(i, j) for i in range(-r, r + 1) for j in range(-r, r + 1) if (i, j) != (0, 0)]
    own = torch.arange(core.start, core.stop)  # (h,) grid rows of the points pooled
    cols = torch.arange(width)
    parts: dict[str, list[torch.Tensor]] = {k: [] for k in ("xm", "xs", "m", "s", "y", "w", "u", "season")}
    for di, dj in offsets:
        near_rows, near_cols = own + di, cols + dj
        if wrap:
            near_cols = near_cols % width
        inside = ((near_rows >= 0) & (near_rows < rows))[:, None] & ((near_cols >= 0) & (near_cols < width))[None]
        idx = near_rows.clamp(0, rows - 1)[:, None] * width + near_cols.clamp(0, width - 1)[None]  # (h, W)
        at = d.take(idx.flatten())  # (h * W, N)
        share = 1.0 if (di, dj) == (0, 0) else pool.weight
        for key in parts:
            value = getattr(at, key)
            if key == "w":
                value = value * share * inside.flatten()[:, None].to(value)
            parts[key].append(value)
    fields = {k: torch.cat(v, dim=1) for k, v in parts.items() if v[0] is not None}  # (h * W, N x neighbours)
    total = fields["w"].sum(1, keepdim=True)
    fields["w"] = torch.where(total > 0, fields["w"] / total.clamp_min(1e-300), 0.0)
    xm, xs, m, s, y = (fields[k] for k in ("xm", "xs", "m", "s", "y"))
    return PointData(xm, xs, m, s, y, fields["w"], fields.get("u"), fields.get("season"))


@dataclass(frozen=True)
class Shrinkage:
    """Coefficients shrunk towards their neighbours' (a penalty, where :class:`Pooling` borrows the neighbours'
    dates): point p's objective gains ``weight`` x its local training CRPS x the squared distance of each
    penalised coefficient from the mean of its local fit's neighbours within ``radius`` grid cells. The scale
    by the point's own CRPS keeps ``weight`` dimensionless (the CRPS is in the target's units, the coefficients
    are not). It costs one fit warm-started from the local one, with the dates of the point alone."""

    radius: int = 1
    weight: float = 0.0

    def __post_init__(self) -> None:
        if self.radius < 1 or not self.weight > 0.0:
            msg = f"shrinkage {self}: radius must be >= 1 grid cell and weight > 0"
            raise ValueError(msg)

    def label(self) -> str:
        return f"shrunk to radius {self.radius}, weight {self.weight:g}"


EVEN = (2, 3)  # the standard and sh forms' b0, b1: the CRPS is even in each, so only |b| is compared


def neighbour_mean(
    theta: torch.Tensor, shape: tuple[int, int], radius: int, wrap: bool, ok: torch.Tensor
) -> torch.Tensor:
    """The mean of each point's neighbours within ``radius`` cells (itself included) of theta (P, n), over the
    points ``ok`` (P,) only (a point with none keeps its own), ``shape`` = (H, W), points row-major. Round a
    global grid (``wrap``) each column counts once, however wide the radius."""
    h, w = shape
    grid = torch.where(ok[:, None], theta, 0.0).reshape(h, w, -1)  # (H, W, n)
    count = ok.to(theta).reshape(h, w, 1)
    total, n = torch.zeros_like(grid), torch.zeros_like(count)
    offsets = range(-radius, radius + 1)
    cols = sorted({dj % w for dj in offsets}) if wrap else [dj for dj in offsets if abs(dj) < w]
    for di in (di for di in offsets if abs(di) < h):
        for dj in cols:
            total += _shifted(grid, di, dj, wrap)
            n += _shifted(count, di, dj, wrap)
    mean = torch.where(n > 0, total / n.clamp_min(1.0), grid)  # (H, W, n)
    return torch.where(n.reshape(-1, 1) > 0, mean.reshape(h * w, -1), theta)


def _shifted(t: torch.Tensor, di: int, dj: int, wrap: bool) -> torch.Tensor:
    """t (H, W, n) read at (row + di, column + dj): 0 beyond the rows, and beyond the columns unless ``wrap``."""
    out = torch.zeros_like(t)
    h, w = t.shape[:2]
    rows_to, rows_from = slice(max(0, -di), min(h, h - di)), slice(max(0, di), min(h, h + di))
    if wrap:
        out[rows_to] = torch.roll(t, -dj, dims=1)[rows_from]
    else:
        cols_to, cols_from = slice(max(0, -dj), min(w, w - dj)), slice(max(0, dj), min(w, w + dj))
        out[rows_to, cols_to] = t[rows_from, cols_from]
    return out


def centres(
    theta: torch.Tensor, shape: tuple[int, int], form: str, radius: int, wrap: bool, free: torch.Tensor
) -> torch.Tensor:
    """Where a local fit theta (P, n) is shrunk to: each point's neighbours' mean coefficients (P, n), each even
    one taken as |b| and given the point's own sign; the points ``free`` (P,) count for none."""
    even = [j for j in EVEN if form != "spread"]
    signed = theta.clone()
    signed[:, even] = theta[:, even].abs()
    centre = neighbour_mean(signed, shape, radius, wrap, ~free)
    centre[:, even] = centre[:, even] * torch.where(theta[:, even] < 0, -1.0, 1.0)
    return centre


def prior(centre: torch.Tensor, crps: torch.Tensor, form: str, shrink: Shrinkage, free: torch.Tensor) -> Prior:
    """The penalty of ``shrink`` towards ``centre`` (P, n) at points of local training CRPS ``crps`` (P,); weight 0
    at the points ``free`` (P,) and on the coefficients :func:`penalised` leaves out."""
    weight = shrink.weight * crps.clamp_min(0.0)[:, None] * penalised(centre.shape[1], form).to(centre)  # (P, n)
    return Prior(centre, torch.where(free[:, None], 0.0, weight))


def penalised(n: int, form: str) -> torch.Tensor:
    """Which of a point's n coefficients are shrunk (n,): all but the sh form's shift (its far basin has no
    finite value to shrink to)."""
    mask = torch.ones(n, dtype=torch.bool)
    if form == "sh":
        mask[4] = False
    return mask
