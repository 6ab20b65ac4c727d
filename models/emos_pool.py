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

from postcast.models.emos_objective import PointData


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
    return PointData(**fields)
