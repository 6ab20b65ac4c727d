"""A local EMOS's training fields on disk by latitude band, so that a fit holds one band's samples of every date
and never all of them (:class:`BandScratch`), and the band size that keeps a fit within its memory budget.

A pooled fit (:mod:`postcast.models.emos_pool`) reads each point's neighbours too: a band is then read with a
halo of rows above and below it (:meth:`BandScratch.halo_bands`), and its samples count as many times as each
point has neighbours (:func:`band_rows`'s ``neighbours``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from postcast.models import distributions
from postcast.models.emos_objective import PointData

FIT_BYTES = 1 << 30  # what the fits of one band of points may hold, whatever the number of training dates
FIELDS = ("xm", "xs", "m", "s", "y")  # the (N, H, W) fields every local EMOS reads (PointData.from_fields)
SEASON_FIELDS = ("sin", "cos")  # and the seasonal form's, when given


def band_rows(family: str, n_dates: int, height: int, width: int, neighbours: int = 1, fits: int = 1) -> int:
    """Latitude rows per band, so that the fits of a band held at once hold about FIT_BYTES together (at least
    one row; a sample of the family holds :attr:`~postcast.models.distributions.Distribution.fit_bytes_per_sample`):
    each point's samples are its ``n_dates`` times the ``neighbours`` whose dates it is fitted on (1: its own
    only), and ``fits`` candidates are fitted on the band at the same time."""
    per_row = distributions.get(family).fit_bytes_per_sample * n_dates * neighbours * width * fits
    return max(1, min(height, FIT_BYTES // max(1, per_row)))


@dataclass(frozen=True)
class HaloBand:
    """A band's points and the rows around it: ``data`` holds rows [first, first + rows) of the grid, points
    row-major, (rows * W, N); the band itself is rows [core.start, core.stop) of the grid."""

    data: PointData
    first: int
    rows: int
    core: slice


class BandScratch:
    """:meth:`add` appends a batch of (B, H, W) fields (:data:`FIELDS`, and :data:`SEASON_FIELDS` when given) to each
    band's file (its raw bytes, dates in order);
    :meth:`bands` reads the bands back as :class:`PointData`, in order; :meth:`halo_bands` with rows around."""

    def __init__(self, folder: Path, height: int, rows: int) -> None:
        self.folder, self.height, self.rows = folder, height, rows
        self.layout: dict[str, tuple[torch.dtype, int]] = {}  # field -> (dtype, width)

    def _slices(self) -> list[slice]:
        return [slice(i, min(i + self.rows, self.height)) for i in range(0, self.height, self.rows)]

    def add(self, fields: dict[str, torch.Tensor]) -> None:
        for key in (*FIELDS, *(k for k in SEASON_FIELDS if k in fields)):
            t = fields[key].detach().cpu().contiguous()  # (B, H, W)
            self.layout[key] = (t.dtype, t.shape[-1])
            for b, rows in enumerate(self._slices()):
                with open(self.folder / f"{key}-{b}.bin", "ab") as f:
                    f.write(t[:, rows].contiguous().numpy().tobytes())

    def _band(self, b: int, device: torch.device | str) -> dict[str, torch.Tensor]:
        """Band b's fields, each (N, rows, W)."""
        rows = self._slices()[b]
        fields = {}
        for key, (dtype, width) in self.layout.items():
            raw = np.fromfile(self.folder / f"{key}-{b}.bin", dtype=torch.empty(0, dtype=dtype).numpy().dtype)
            fields[key] = torch.from_numpy(raw.reshape(-1, rows.stop - rows.start, width)).to(device)
        return fields

    def bands(self, min_std: float, device: torch.device | str = "cpu") -> Iterator[PointData]:
        for b in range(len(self._slices())):
            yield PointData.from_fields(**self._band(b, device), min_std=min_std)

    def halo_bands(self, min_std: float, halo: int, device: torch.device | str = "cpu") -> Iterator[HaloBand]:
        """Each band with up to ``halo`` rows of the grid above and below it (fewer at the grid's edges), read
        from the neighbouring bands' files."""
        slices = self._slices()
        for core in slices:
            first, stop = max(0, core.start - halo), min(self.height, core.stop + halo)
            near = [i for i, s in enumerate(slices) if s.start < stop and s.stop > first]  # bands the rows touch
            parts = [self._band(i, device) for i in near]
            joined = {k: torch.cat([p[k] for p in parts], dim=1) for k in self.layout}  # (N, rows of near, W)
            lo = first - slices[near[0]].start
            fields = {k: t[:, lo : lo + stop - first] for k, t in joined.items()}
            yield HaloBand(PointData.from_fields(**fields, min_std=min_std), first, stop - first, core)
