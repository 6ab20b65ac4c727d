"""A loaded forecast as the service serves it: the field of one product, checked (:func:`check`), with its
nearest-grid-point locators and the keys of its quantiles and thresholds, prepared once per loaded file;
and the longitudes of a box or point in the convention they were asked in (-180..180 or 0..360)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from postcast.datasets import laws
from postcast.pipeline.products.archive import Field, Product, UnreadableProduct


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
    # what every answer of this file shares, built once on first use (postcast.serve.app: the point answer's
    # encoded head and law; postcast.serve.rendering: the map headers); it lives and goes with the loaded file (the
    # catalog keys it by path and signature), so a replaced file starts afresh
    memo: dict[Any, Any] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, p: Product, f: Field) -> Served:
        """The product ``p`` as served; :class:`UnreadableProduct` when its content fails :func:`check`."""
        check(p, f)
        return cls(
            f,
            Locator(f.lat, False),
            Locator(f.lon, True),
            p.init.isoformat(),
            p.valid.isoformat(),
            tuple(f"{q:g}" for q in f.quantile_levels),
            tuple(f"{t:g}" for t in f.thresholds),
        )


def check(p: Product, f: Field) -> None:
    """What no answer may carry (JSON has no NaN; a probability lies in [0, 1]; a CDF never runs backwards):
    quantile levels in (0, 1) and increasing, finite thresholds, quantiles that do not decrease as the level
    rises, exceedance probabilities in [0, 1] that do not rise with the threshold, finite raw members and
    parameters inside their family's domain (:meth:`postcast.datasets.laws.Family.valid`) at every point; else
    :class:`UnreadableProduct` naming what is wrong (the file is skipped and listed by /health)."""
    levels, exceed = f.quantile_levels, f.exceedance
    faults = {
        "quantile levels outside (0, 1)": ~((levels > 0) & (levels < 1)),
        "quantile levels not increasing": np.diff(levels) <= 0,
        "non-finite thresholds": ~np.isfinite(f.thresholds),
        "non-finite quantiles": ~np.isfinite(f.quantiles),
        "quantiles that decrease as the level rises": _falls(f.quantiles, levels),
        "exceedance probabilities outside [0, 1]": ~((exceed >= 0) & (exceed <= 1)),
        "exceedance probabilities that rise with the threshold": _falls(-exceed, f.thresholds),
        "raw members not finite": ~np.isfinite(f.members) if f.members is not None else np.zeros(0, bool),
        f"{f.family} parameters outside the family's domain": ~laws.get(f.family).valid(f.params),
    }
    found = [f"{what} ({int(bad.sum())} values)" for what, bad in faults.items() if bad.any()]
    if found:
        msg = f"{p.path}: {'; '.join(found)}: rewrite it with `postcast forecast`"
        raise UnreadableProduct(msg)


FALL_TOL = 1e-6  # relative: numerical noise of a law's quantiles (16 float32 steps), not a reversed CDF


def _falls(values: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Where ``values`` (K, lat, lon) decrease, beyond noise, from one of the ascending ``at`` (K,) to the next:
    (K - 1, lat, lon); none when ``at`` are not ascending (a fault of their own)."""
    if values.shape[0] < 2 or (np.diff(at) <= 0).any():
        return np.zeros(0, bool)
    with np.errstate(invalid="ignore"):  # NaN is a fault of its own
        return np.diff(values, axis=0) < -FALL_TOL * (1.0 + np.abs(values[1:]))


def box_columns(lon: np.ndarray, west: float, east: float) -> tuple[np.ndarray, np.ndarray]:
    """The indices of the grid longitudes ``lon`` inside the box from ``west`` eastwards to ``east``, west to
    east, and those longitudes counted from ``west`` (so -10..10 gives -10, -5, 0, 5, 10 and 350..10 gives
    350, 355, 0, 5, 10); a box 360 deg wide is every column; ``west`` > ``east`` crosses 0 deg."""
    width = east - west if east >= west else east - west + 360.0
    offset = np.mod(lon - west, 360.0)  # degrees east of the box's west edge
    inside = np.ones(lon.shape, bool) if width >= 360.0 else offset <= width + 1e-9
    idx = np.flatnonzero(inside)
    idx = idx[np.argsort(offset[idx], kind="stable")]
    shown = west + offset[idx]
    return idx, np.where(shown >= 360.0, shown - 360.0, shown)


def as_asked(grid_lon: float, asked: float) -> float:
    """A grid longitude in the convention of the one asked for: -180..180 for a negative one (lon=-170 is
    answered -170, not 190), else 0..360."""
    if asked < 0:
        return grid_lon - 360.0 if grid_lon > 180.0 else grid_lon
    return grid_lon + 360.0 if grid_lon < 0 else grid_lon
