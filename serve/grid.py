"""A loaded forecast as the service serves it: the field of one product with its nearest-grid-point
locators and the keys of its quantiles and thresholds, prepared once per loaded file."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from postcast.pipeline.archive import Field, Product


def _nearest(values: np.ndarray, x: float, periodic: bool = False) -> int:
    """The index of the value nearest ``x`` (``periodic``: distances in degrees around the circle)."""
    d = np.abs(values - x)
    if periodic:
        d = np.minimum(d, 360.0 - d)
    return int(np.argmin(d))


class Locator:
    """Nearest grid indices: arithmetic on a regular axis (the ENS-10 grids), argmin otherwise."""

    def __init__(self, values: np.ndarray, periodic: bool) -> None:
        self.values, self.periodic = values, periodic
        steps = np.diff(values)
        self.regular = values.size > 1 and bool(np.allclose(steps, steps[0])) and steps[0] > 0
        self.start, self.step, self.n = float(values[0]), float(steps[0]) if values.size > 1 else 1.0, values.size
        if self.regular and periodic:
            self.regular = abs(self.n * self.step - 360.0) < 1e-6  # wraps exactly

    def __call__(self, x: float) -> int:
        if not self.regular:
            return _nearest(self.values, x, self.periodic)
        k = round((x - self.start) / self.step)
        return k % self.n if self.periodic else min(max(k, 0), self.n - 1)


@dataclass(frozen=True)
class Served:
    """What a point query needs of a product, prepared once per loaded file."""

    field: Field
    lat: Locator
    lon: Locator
    init: str
    valid: str
    quantile_keys: tuple[str, ...]
    threshold_keys: tuple[str, ...]

    @classmethod
    def of(cls, p: Product, f: Field) -> Served:
        return cls(
            f,
            Locator(f.lat, False),
            Locator(f.lon, True),
            p.init.isoformat(),
            p.valid.isoformat(),
            tuple(f"{q:g}" for q in f.quantile_levels),
            tuple(f"{t:g}" for t in f.thresholds),
        )
