"""Smooth Gaussian random fields on the sphere, exactly N(0, 1) at every point: the synthetic world's
source of weather (:class:`GaussianWaves`, varying in time) and of static patterns (:func:`static_fields`)."""

from __future__ import annotations

import functools
import math

import numpy as np

from postcast.datasets.schema import Grid


def _rng(*key: int) -> np.random.Generator:
    return np.random.default_rng([abs(int(k)) for k in key])


class GaussianWaves:
    """A smooth random field on the sphere, exactly N(0, 1) at every point and time.

    field(t) = Lat @ C(t) @ Lon(t), with Lat = [cos(l phi), sin(l phi)]_l (n_lat, 2L),
    Lon = [cos(n (lam - c t)), sin(n (lam - c t))]_n (2N, n_lon), and C(t) a (2L, 2N) matrix whose
    entries are N(0, s_ln^2) at every t (sum of R random-frequency oscillations / sqrt(R)); the
    spectrum s^2 is normalised to sum 1, hence unit variance pointwise.
    """

    def __init__(
        self,
        rng: np.random.Generator,
        *,
        n_max: int = 8,
        l_max: int = 7,
        scale: float = 3.0,
        n_freq: int = 3,
        periods: tuple[float, float] = (6.0, 40.0),
        drift: float = 6.0,
    ):
        n = np.arange(n_max + 1)
        ll = np.arange(l_max + 1)
        spec = 1.0 / (1.0 + (ll[:, None] ** 2 + n[None, :] ** 2) / scale**2) ** 2  # (L+1, N+1)
        spec /= spec.sum()
        self.n, self.l = n, ll
        self.std = np.sqrt(np.repeat(np.repeat(spec, 2, axis=0), 2, axis=1))  # (2L+2, 2N+2)
        shape = (n_freq, 2 * (l_max + 1), 2 * (n_max + 1))
        self.p = rng.standard_normal(shape)
        self.q = rng.standard_normal(shape)
        self.omega = 2 * np.pi / rng.uniform(*periods, size=n_freq)  # rad / day
        self.drift = drift * rng.uniform(0.5, 1.5)  # deg / day eastward
        self.n_freq = n_freq
        # variance of the meridional / zonal derivative fields, for normalisation
        self.grad_lat_std = math.sqrt(float((spec * ll[:, None] ** 2).sum()))
        self.grad_lon_std = math.sqrt(float((spec * n[None, :] ** 2).sum()))

    def coefficients(self, t: float) -> np.ndarray:
        c = np.cos(self.omega * t)[:, None, None] * self.p + np.sin(self.omega * t)[:, None, None] * self.q
        return self.std * c.sum(axis=0) / math.sqrt(self.n_freq)

    def _lat_basis(self, lat: np.ndarray, deriv: bool = False) -> np.ndarray:
        phi = np.deg2rad(lat)[:, None] * self.l[None, :]  # (n_lat, L+1)
        if deriv:
            cols = np.stack([-np.sin(phi) * self.l, np.cos(phi) * self.l], axis=-1)
        else:
            cols = np.stack([np.cos(phi), np.sin(phi)], axis=-1)
        return cols.reshape(lat.size, -1)  # (n_lat, 2L+2)

    def _lon_basis(self, lon: np.ndarray, t: float, deriv: bool = False) -> np.ndarray:
        lam = np.deg2rad(lon - self.drift * t)[None, :] * self.n[:, None]  # (N+1, n_lon)
        if deriv:
            rows = np.stack([-np.sin(lam) * self.n[:, None], np.cos(lam) * self.n[:, None]], axis=1)
        else:
            rows = np.stack([np.cos(lam), np.sin(lam)], axis=1)
        return rows.reshape(-1, lon.size)  # (2N+2, n_lon)

    def __call__(
        self, lat: np.ndarray, lon: np.ndarray, t: float = 0.0, *, dlat: bool = False, dlon: bool = False
    ) -> np.ndarray:
        """Field (n_lat, n_lon) at time ``t`` (days); ``dlat``/``dlon`` give unit-variance derivatives."""
        out = self._lat_basis(lat, dlat) @ self.coefficients(t) @ self._lon_basis(lon, t, dlon)
        if dlat:
            out /= self.grad_lat_std
        if dlon:
            out /= self.grad_lon_std
        return out


@functools.lru_cache(maxsize=16)
def _static_basis(resolution: float, n_max: int, l_max: int, scale: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(Lat (n_lat, 2L+2), std (2L+2, 2N+2), Lon (2N+2, n_lon)) for :func:`static_fields`."""
    grid = Grid(resolution)
    n, ll = np.arange(n_max + 1), np.arange(l_max + 1)
    spec = 1.0 / (1.0 + (ll[:, None] ** 2 + n[None, :] ** 2) / scale**2) ** 2
    spec /= spec.sum()
    std = np.sqrt(np.repeat(np.repeat(spec, 2, axis=0), 2, axis=1))
    phi = np.deg2rad(grid.latitudes())[:, None] * ll[None, :]
    lat = np.stack([np.cos(phi), np.sin(phi)], axis=-1).reshape(grid.n_lat, -1)
    lam = np.deg2rad(grid.longitudes())[None, :] * n[:, None]
    lon = np.stack([np.cos(lam), np.sin(lam)], axis=1).reshape(-1, grid.n_lon)
    return lat, std, lon


def static_fields(
    rng: np.random.Generator, grid: Grid, count: int, *, scale: float = 4.0, n_max: int = 8, l_max: int = 7
) -> np.ndarray:
    """``count`` independent smooth fields (count, n_lat, n_lon), each exactly N(0, 1) pointwise
    (the time-frozen case of :class:`GaussianWaves`, batched)."""
    lat, std, lon = _static_basis(grid.resolution, n_max, l_max, scale)
    coef = std[None] * rng.standard_normal((count, *std.shape))  # (count, 2L+2, 2N+2)
    out: np.ndarray = lat @ (coef @ lon)  # (count, n_lat, n_lon)
    return out
