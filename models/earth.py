"""Fields on the globe's grid that the grid models share: padding as the globe (:func:`earth_pad`) and the
learned numbers per grid point (:class:`PointEmbedding`), optionally smoothed in space (:func:`smoother`).

Smoothing: a per-point embedding learns each place's static correction from that place's own training dates
alone, so it carries their noise (with N dates, about sigma / sqrt(N) per point). Where the correction is
smooth in space, reading the embedding through a Gaussian filter of a few grid cells pools neighbouring
places (Rasp and Lerch 2018 learn one embedding per station; a field's neighbours add what stations lack).
The filter is a change of variables, not a constraint: any field stays reachable, but the optimiser moves
the smooth part first.
"""

from __future__ import annotations

import torch
from torch import nn

from postcast.datasets.core.errors import BadInputError, ConfigError


def earth_pad(x: torch.Tensor, top: int, bottom: int = -1, left: int = -1, right: int = -1) -> torch.Tensor:
    """Pad (B, C, H, W): periodic in longitude (W), replicated in latitude (H).
    ``earth_pad(x, p)`` pads p on every side."""
    bottom = top if bottom < 0 else bottom
    left = top if left < 0 else left
    right = left if right < 0 else right
    if left or right:
        x = torch.cat([x[..., x.shape[-1] - left :], x, x[..., :right]], dim=-1)
    if top or bottom:  # copies of the edge rows, not F.pad(mode="replicate"): torch 2.11's inductor fails to
        # generate the GPU kernel for its clamped index behind the longitude join ("'((0)) + 719' is not comparable")
        rows = [x[..., :1, :].expand(*x.shape[:-2], top, -1), x, x[..., -1:, :].expand(*x.shape[:-2], bottom, -1)]
        x = torch.cat(rows, dim=-2)
    return x


def _gaussian_rows(distance: torch.Tensor, cells: float) -> torch.Tensor:
    """Row-normalised Gaussian weights (n, n) of a distance matrix in grid cells; standard deviation ``cells``."""
    w = torch.exp(-0.5 * (distance / cells) ** 2)
    return w / w.sum(dim=1, keepdim=True)


def smoother(grid: tuple[int, int], cells: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The Gaussian filter of standard deviation ``cells`` grid cells on a (H, W) grid, as two row-normalised
    matrices: latitude (H, H), truncated at the poles and renormalised, and longitude (W, W), periodic (the
    shorter way round). A field f (..., H, W) is smoothed as ``lat @ f @ lon.T``; a constant stays constant."""
    h, w = grid
    i = torch.arange(h, dtype=torch.float64)
    j = torch.arange(w, dtype=torch.float64)
    d_lon = (j[:, None] - j[None, :]).abs()
    d_lon = torch.minimum(d_lon, w - d_lon)
    lat = _gaussian_rows((i[:, None] - i[None, :]).abs(), cells)
    return lat.float(), _gaussian_rows(d_lon, cells).float()


def check_embedding(name: str, embedding: int, smoothing: float = 0.0) -> None:
    """An architecture's ``embedding`` option, a count >= 0, and its ``smoothing``, in grid cells >= 0
    (ConfigError naming them otherwise)."""
    if embedding < 0:
        msg = f"model.net ({name}) embedding={embedding}: give the learned numbers per grid point, >= 0 (0: none)"
        raise ConfigError(msg)
    if smoothing < 0:
        msg = f"model.net ({name}) smoothing={smoothing}: the filter's width in grid cells, >= 0 (0: none)"
        raise ConfigError(msg)


class PointEmbedding(nn.Module):
    """E learned numbers per grid point (E, H, W), zero at the start, joined to the input channels:
    (B, C, H, W) -> (B, C + E, H, W). E = 0 passes the input through (no parameter). ``smoothing`` > 0:
    the numbers are read through a Gaussian filter of that many grid cells (:func:`smoother`)."""

    def __init__(self, channels: int, grid: tuple[int, int], smoothing: float = 0.0):
        super().__init__()
        self.channels = channels
        self.weight = nn.Parameter(torch.zeros(channels, *grid)) if channels else None  # (E, H, W)
        self.smooth = Smoother(grid, smoothing) if channels and smoothing > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight is None:
            return x
        if x.shape[-2:] != self.weight.shape[-2:]:
            msg = (
                f"the model's embedding was learned on a {tuple(self.weight.shape[-2:])} grid, the input is "
                f"{tuple(x.shape[-2:])}: regrid the inputs to the training grid, or train with embedding: 0"
            )
            raise BadInputError(msg)
        own = self.smooth(self.weight)  # (E, H, W)
        return torch.cat([x, own.expand(x.shape[0], -1, -1, -1)], dim=1)  # (B, C + E, H, W)


class Smoother(nn.Module):
    """(..., H, W) -> (..., H, W): the Gaussian filter of :func:`smoother` (its matrices are not saved in a
    checkpoint: they follow from the grid and the width)."""

    def __init__(self, grid: tuple[int, int], cells: float):
        super().__init__()
        lat, lon = smoother(grid, cells)
        self.lat: torch.Tensor
        self.lon: torch.Tensor
        self.register_buffer("lat", lat, persistent=False)  # (H, H)
        self.register_buffer("lon", lon, persistent=False)  # (W, W)

    def forward(self, f: torch.Tensor) -> torch.Tensor:
        return self.lat @ f @ self.lon.T  # (..., H, W)
