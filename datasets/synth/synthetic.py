"""Synthetic ENS-10: forecasts with the exact ENS-10 schema and a truth whose distribution is known.

How the world is built (all fields are deterministic functions of ``seed`` and the date, so any
chunk can be generated on its own, in any process, in any order):

* **Smooth random fields** come from :class:`GaussianWaves`: a sum of products of zonal and
  meridional sines and cosines with independent Gaussian coefficients. At every point such a field
  is *exactly* N(0, 1) (a cos x + b sin x ~ N(0, s^2) for any x), with large-scale spatial
  correlation. Coefficients vary smoothly in time (a few random frequencies) and the pattern drifts
  eastwards, so weather evolves from date to date; years are independent.
* **Latent weather** at a valid time: a flow anomaly ``psi`` (drives z, t, u, v, msl), a moisture
  anomaly ``h`` (q, w, d, clouds, precipitation), and per-variable anomalies; plus rare intense
  blobs (**extremes**, about 8 per year). A static land/sea mask comes from a fixed geography seed.
* **Members** add state-dependent, lead-growing perturbations to the latent fields, shared across
  variables (correlation 0.8), so the ensemble spread of one variable informs the others.
* **Truth** (ERA5-like) for each target (Z500, T850, T2m) at each step is drawn from a Gaussian
  *conditional on the forecast*: ``y = m + beta + sigma * eps`` where ``m``, ``s`` are the ensemble
  mean and population std of the target, ``beta`` is a bias that depends on location, season and,
  non-linearly, on other variables (850 hPa wind speed, cloud cover, humidity), and
  ``sigma = sqrt((k s (1 + 0.3 tanh(...)))^2 + floor^2)`` with ``k > 1`` (under-dispersion).
  ``eps`` is exactly N(0, 1) at every point. The generator writes ``oracle_mean = m + beta`` and
  ``oracle_std = sigma``: the true predictive distribution, whose CRPS no post-processor can beat.
* **Derived targets** (opt in with ``SynthConfig.targets``): ``ws10`` (each member's 10 m wind speed)
  has a truth drawn from a normal truncated at 0, ``tp24`` (each member's 24 h precipitation, mm) one
  drawn from a censored shifted gamma (dry subtropical land, heavy amounts near extremes), both given
  the forecast; their oracle parameters are stored under :func:`postcast.datasets.contract.oracle_parameters`
  (docs/ens10.md "Targets beyond ENS-10").

Public entry points: :func:`forecast_dataset` and :func:`truth_dataset` return lazy (dask) datasets
in canonical conventions (see :mod:`postcast.datasets.schema`); :class:`SynthConfig` is the typed
configuration.
"""

from __future__ import annotations

import functools
import math
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import dask
import dask.array as da
import numpy as np
import pandas as pd
import xarray as xr
from scipy import special, stats

from postcast.datasets import contract, schema
from postcast.datasets.core import config
from postcast.datasets.core.errors import ConfigError
from postcast.datasets.schema import GRAVITY, TARGETS, Grid, Target

FORMAT_VERSION = 1
GEOGRAPHY_SEED = 20180101  # the static land/sea pattern and local biases are shared by all seeds

# Error growth with lead time: spread, bias and truth noise scale with g(step).
LEAD_GROWTH = {0: 0.15, 24: 0.6, 48: 1.0}
UNDERDISPERSION = 1.7  # k: true error std / ensemble spread (spread/skill ~ 1/k before bias)

# Standard-atmosphere geopotential heights (m) and temperatures (K) on the ENS-10 levels.
_H_STD = {10: 31060.0, 50: 20580.0, 100: 16180.0, 200: 11790.0, 300: 9160.0, 400: 7180.0,
          500: 5570.0, 700: 3010.0, 850: 1460.0, 925: 760.0, 1000: 110.0}
_T_STD = {10: 227.0, 50: 211.0, 100: 206.0, 200: 217.0, 300: 229.0, 400: 242.0, 500: 253.0,
          700: 270.0, 850: 279.0, 925: 283.0, 1000: 288.0}
_JET = {10: 8.0, 50: 10.0, 100: 15.0, 200: 35.0, 300: 30.0, 400: 24.0, 500: 18.0, 700: 10.0,
        850: 6.0, 925: 4.0, 1000: 3.0}  # m/s, zonal-mean westerly jet maximum


@config.register("synth")
@dataclass(frozen=True)
class SynthConfig:
    """What to generate. Defaults are the quickstart size (5 deg, 8 dates a year, 2 levels)."""

    seed: int = 0
    resolution: float = 5.0  # degrees; 0.5 is the real ENS-10 grid (361 x 720)
    years: tuple[int, int] = (1998, 2017)  # inclusive range of reforecast years
    dates_per_year: int = 8  # month-days picked evenly from the 105 ENS-10 dates (105 = all)
    levels: tuple[int, ...] = (500, 850)  # hPa; any subset of the 11 ENS-10 levels
    members: int = schema.N_MEMBERS
    format: str = "zarr"  # zarr | grib | netcdf (raw on-disk form written by `postcast synth`)
    chunk_dates: int = 1  # init dates per chunk of the lazy dask arrays
    targets: tuple[str, ...] = schema.ENS10_TARGETS  # whose truth and oracle are drawn (opt in: ws10, tp24)

    def __post_init__(self) -> None:
        Grid(self.resolution)  # validates
        object.__setattr__(self, "targets", tuple(self.targets))  # a list from YAML or to_dict
        unknown = [t for t in self.targets if t not in TARGETS]
        if unknown or not self.targets:
            msg = f"targets {unknown or '[]'}: choose from {list(TARGETS)}"
            raise ConfigError(msg)
        bad = [lv for lv in self.levels if lv not in schema.LEVELS]
        if bad or not self.levels:
            msg = f"levels {bad or '[]'} are not ENS-10 levels; choose from {list(schema.LEVELS)}"
            raise ConfigError(msg)
        if self.years[0] > self.years[1]:
            msg = f"years {self.years}: start after end"
            raise ConfigError(msg)
        if not 1 <= self.members <= 50:
            msg = f"members={self.members}: use 1..50 (ENS-10 has 10)"
            raise ConfigError(msg)
        if self.format not in ("zarr", "grib", "netcdf"):
            msg = f"format {self.format!r}: use zarr, grib or netcdf"
            raise ConfigError(msg)
        if self.dates_per_year < 1:
            msg = f"dates_per_year={self.dates_per_year}: must be >= 1"
            raise ConfigError(msg)

    @property
    def grid(self) -> Grid:
        return Grid(self.resolution)

    @property
    def year_list(self) -> list[int]:
        return list(range(self.years[0], self.years[1] + 1))

    @property
    def month_days(self) -> list[tuple[int, int]]:
        return schema.month_days_subset(self.dates_per_year)

    @property
    def init_times(self) -> pd.DatetimeIndex:
        return schema.init_times(self.year_list, self.month_days)

    @property
    def sorted_levels(self) -> tuple[int, ...]:
        return tuple(sorted(self.levels))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["years"] = list(self.years)
        d["levels"] = list(self.levels)
        d["targets"] = list(self.targets)
        return d


# --- smooth Gaussian random fields ---------------------------------------------------------------
def _rng(*key: int) -> np.random.Generator:
    return np.random.default_rng([abs(int(k)) for k in key])


class GaussianWaves:
    """A smooth random field on the sphere, exactly N(0, 1) at every point and time.

    field(t) = Lat @ C(t) @ Lon(t), with Lat = [cos(l phi), sin(l phi)]_l (n_lat, 2L),
    Lon = [cos(n (lam - c t)), sin(n (lam - c t))]_n (2N, n_lon), and C(t) a (2L, 2N) matrix whose
    entries are N(0, s_ln^2) at every t (sum of R random-frequency oscillations / sqrt(R)); the
    spectrum s^2 is normalised to sum 1, hence unit variance pointwise.
    """

    def __init__(self, rng: np.random.Generator, *, n_max: int = 8, l_max: int = 7, scale: float = 3.0,
                 n_freq: int = 3, periods: tuple[float, float] = (6.0, 40.0), drift: float = 6.0):
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

    def __call__(self, lat: np.ndarray, lon: np.ndarray, t: float = 0.0, *, dlat: bool = False,
                 dlon: bool = False) -> np.ndarray:
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


def static_fields(rng: np.random.Generator, grid: Grid, count: int, *, scale: float = 4.0,
                  n_max: int = 8, l_max: int = 7) -> np.ndarray:
    """``count`` independent smooth fields (count, n_lat, n_lon), each exactly N(0, 1) pointwise
    (the time-frozen case of :class:`GaussianWaves`, batched)."""
    lat, std, lon = _static_basis(grid.resolution, n_max, l_max, scale)
    coef = std[None] * rng.standard_normal((count, *std.shape))  # (count, 2L+2, 2N+2)
    return np.einsum("ya,mab,bx->myx", lat, coef, lon, optimize=True)


# --- the generator -------------------------------------------------------------------------------
def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x)


# Latent streams: each gets its own random numbers (stable ids, never renumber).
_STREAM = {"psi": 1, "h": 2, "own": 3, "events": 4, "eta": 5, "xi": 6, "eps": 7, "white": 8}
_VAR_ID = {v: i + 1 for i, v in enumerate(schema.VARIABLES)}  # random-stream ids of the variables at import


def _var_id(name: str) -> int:
    """A variable's random-stream id: fixed for the schema's variables (the synthetic world is the same
    for a seed), and derived from the name for a variable added later, so adding one changes no other."""
    return _VAR_ID.get(name) or 1000 + zlib.crc32(name.encode()) % 1_000_000


# variable name -> the World method that makes its member fields (member, lat, lon): one entry per
# schema variable, registered where the method is defined
Generator = Callable[["World", int, pd.Timestamp, int, pd.Timestamp], np.ndarray]
GENERATORS: dict[str, Generator] = {}


def generates(name: str) -> Callable[[Generator], Generator]:
    def register(method: Generator) -> Generator:
        GENERATORS[name] = method
        return method

    return register


class World:
    """Deterministic synthetic world for one seed and grid; every method is a pure function."""

    def __init__(self, seed: int, grid: Grid, members: int = schema.N_MEMBERS):
        self.seed, self.grid, self.members = seed, grid, members
        self.lat = grid.latitudes()  # ascending, degrees
        self.lon = grid.longitudes()
        phi = np.deg2rad(self.lat)[:, None]
        self.coslat = np.cos(phi) * np.ones((1, self.lon.size))  # (n_lat, n_lon)
        self.sinlat = np.sin(phi) * np.ones((1, self.lon.size))
        abslat = np.abs(self.lat)[:, None] * np.ones((1, self.lon.size))
        self.abslat = abslat
        self.env = 0.3 + 0.7 * np.exp(-(((abslat - 50.0) / 25.0) ** 2))  # storm-track envelope
        geo = GaussianWaves(_rng(GEOGRAPHY_SEED, 0), n_max=6, l_max=6, scale=2.5)(self.lat, self.lon)
        self.land = ((geo > 0.55) | (self.lat[:, None] < -68.0)).astype(np.float64)
        self.land = self.land * np.ones((1, self.lon.size))
        self._bias_fields = {
            name: GaussianWaves(_rng(GEOGRAPHY_SEED, 10 + i), n_max=5, l_max=5, scale=2.0)(self.lat, self.lon)
            for i, name in enumerate(TARGETS)
        }

    # ---- time-indexed latent fields (cached per process) ----
    @functools.lru_cache(maxsize=32)  # noqa: B019 - World objects are few and long-lived
    def _waves(self, stream: str, year: int, sub: int = 0) -> GaussianWaves:
        periods = (15.0, 90.0) if stream == "own" else (6.0, 40.0)
        return GaussianWaves(_rng(self.seed, _STREAM[stream], year, sub), periods=periods)

    @functools.lru_cache(maxsize=64)  # noqa: B019
    def _events(self, year: int) -> np.ndarray:
        """Extreme events of a year: rows (time_day, lat, lon, amplitude, radius_deg, duration_day)."""
        rng = _rng(self.seed, _STREAM["events"], year)
        k = rng.poisson(8.0)
        return np.column_stack([
            rng.uniform(0, 366, k), np.rad2deg(np.arcsin(rng.uniform(-0.95, 0.95, k))),
            rng.uniform(0, 360, k), rng.choice([-1.0, 1.0], k) * rng.uniform(2.5, 4.0, k),
            rng.uniform(8.0, 15.0, k), rng.uniform(1.5, 3.0, k),
        ])

    def _event_field(self, year: int, day: float) -> np.ndarray:
        out = np.zeros(self.grid.shape)
        for te, la, lo, amp, rad, dur in self._events(year):
            w = math.exp(-0.5 * ((day - te) / dur) ** 2)
            if w < 1e-3:
                continue
            c = (np.sin(np.deg2rad(la)) * self.sinlat
                 + np.cos(np.deg2rad(la)) * self.coslat * np.cos(np.deg2rad(self.lon - lo))[None, :])
            ang = np.rad2deg(np.arccos(np.clip(c, -1.0, 1.0)))
            out += amp * w * np.exp(-0.5 * (ang / rad) ** 2)
        return out

    @staticmethod
    def _year_day(t: pd.Timestamp) -> tuple[int, float]:
        return t.year, float(t.day_of_year - 1) + t.hour / 24.0

    @functools.lru_cache(maxsize=64)  # noqa: B019
    def latent(self, valid: pd.Timestamp) -> dict[str, np.ndarray]:
        """Ensemble-centre latent fields at a valid time: psi (+ gradients), h, season."""
        year, day = self._year_day(valid)
        w = self._waves("psi", year)
        psi = w(self.lat, self.lon, day) + self._event_field(year, day)
        season = self.sinlat * math.cos(2 * math.pi * (day - 196.0) / 365.25)  # + in local summer
        return {
            "psi": psi,
            "psi_dlat": w(self.lat, self.lon, day, dlat=True),
            "psi_dlon": w(self.lat, self.lon, day, dlon=True),
            "h": self._waves("h", year)(self.lat, self.lon, day),
            "season": season,
        }

    def own(self, name: str, level: int, valid: pd.Timestamp) -> np.ndarray:
        """A slowly varying anomaly specific to one variable and level (unit variance)."""
        year, day = self._year_day(valid)
        return self._waves("own", year, _var_id(name) * 10000 + level)(self.lat, self.lon, day)

    @functools.lru_cache(maxsize=64)  # noqa: B019
    def member_patterns(self, init: pd.Timestamp) -> np.ndarray:
        """Per-member perturbation patterns eta (member, n_lat, n_lon), exactly N(0, 1) pointwise."""
        rng = _rng(self.seed, _STREAM["eta"], int(init.value // 3_600_000_000_000))
        return static_fields(rng, self.grid, self.members, scale=4.0)

    def spread_factor(self, init: pd.Timestamp, step_h: int) -> np.ndarray:
        """State-dependent spread multiplier: larger in the storm track and in active flow."""
        lat = self.latent(init + pd.Timedelta(hours=step_h))
        return LEAD_GROWTH[step_h] * (0.55 + 0.45 * self.env) * (1.0 + 0.35 * np.tanh(lat["psi"]))

    def perturbation(self, name: str, level: int, init: pd.Timestamp, step_h: int) -> np.ndarray:
        """Member perturbations (member, n_lat, n_lon) of unit scale x spread factor."""
        eta = self.member_patterns(init)
        key = int(init.value // 3_600_000_000_000)
        rng = _rng(self.seed, _STREAM["xi"], key, _var_id(name), level, step_h)
        xi = static_fields(rng, self.grid, self.members, scale=5.0)
        return self.spread_factor(init, step_h)[None] * (0.8 * eta + 0.6 * xi)

    def white(self, *key: int) -> np.ndarray:
        return _rng(self.seed, _STREAM["white"], *key).standard_normal((self.members, *self.grid.shape))

    # ---- member fields of every variable ----
    @functools.lru_cache(maxsize=24)  # noqa: B019 - fields feed several others (t850 -> q, t2m, ...)
    def members_field(self, name: str, level: int, init: pd.Timestamp, step_h: int) -> np.ndarray:
        """Member values (member, n_lat, n_lon), float64, canonical units; level 0 for surface.
        The returned array is cached and shared: do not modify it."""
        valid = init + pd.Timedelta(hours=step_h)
        if name not in GENERATORS:
            msg = (f"no synthetic generator for variable {name!r}: add a World method decorated "
                   f"@generates({name!r}) in datasets/synth/synthetic.py")
            raise KeyError(msg)
        out: np.ndarray = GENERATORS[name](self, level, init, step_h, valid)
        return out

    def _flow_members(self, init: pd.Timestamp, step_h: int, valid: pd.Timestamp) -> np.ndarray:
        """psi for each member: centre + spread-scaled perturbation, (member, lat, lon)."""
        return self.latent(valid)["psi"][None] + 0.5 * self.perturbation("z", 0, init, step_h)

    @generates("z")
    def _f_z(self, level: int, init: pd.Timestamp, step_h: int, valid: pd.Timestamp) -> np.ndarray:
        lat = self.latent(valid)
        h0 = _H_STD[level]
        clim = h0 + (0.09 * h0 + 50.0) * (self.coslat**2 - 0.5) + 0.025 * h0 * lat["season"]
        amp = 0.02 * h0 + 20.0  # m of height per unit psi in the storm track
        # member spread ~6.5 % of the anomaly scale: about 8 m (80 m2 s-2) for Z500 at 48 h
        psi_m = lat["psi"][None] + 0.065 * self.perturbation("z", level, init, step_h)
        return GRAVITY * (clim[None] + amp * self.env[None] * psi_m)

    @generates("t")
    def _f_t(self, level: int, init: pd.Timestamp, step_h: int, valid: pd.Timestamp) -> np.ndarray:
        lat = self.latent(valid)
        tropo = level >= 250
        grad = 40.0 if tropo else -10.0
        clim = _T_STD[level] + grad * (self.coslat**2 - 0.55) + (8.0 if tropo else 3.0) * lat["season"]
        if level >= 850:
            clim = clim + 6.0 * self.land * lat["season"]
        amp = 3.0 + (1.5 if level >= 700 else 0.0)
        anom = 0.8 * lat["psi"] + 0.6 * self.own("t", level, valid)
        pert = 0.19 * self.perturbation("t", level, init, step_h)
        return clim[None] + amp * self.env[None] * (anom[None] + pert)

    def _relative_humidity(self, init: pd.Timestamp, step_h: int, valid: pd.Timestamp) -> np.ndarray:
        h = self.latent(valid)["h"][None] + 0.4 * self.perturbation("q", 0, init, step_h)
        return 0.15 + 0.8 * _sigmoid(1.2 * h + (self.coslat**2 - 0.5)[None])

    @generates("q")
    def _f_q(self, level: int, init: pd.Timestamp, step_h: int, valid: pd.Timestamp) -> np.ndarray:
        t = self._f_t(level, init, step_h, valid)
        es = 611.2 * np.exp(17.67 * (t - 273.15) / (t - 29.65))  # Pa, Bolton (1980)
        qsat = 0.622 * es / (level * 100.0)
        return np.minimum(self._relative_humidity(init, step_h, valid) * qsat, 0.04)

    def _ascent(self, init: pd.Timestamp, step_h: int, valid: pd.Timestamp) -> np.ndarray:
        """Unit-scale ascent index (member, lat, lon): moist, convective regions rise."""
        h = self.latent(valid)["h"][None] + 0.5 * self.perturbation("w", 0, init, step_h)
        return 0.7 * h + 0.5 * np.exp(-((self.abslat / 12.0) ** 2))[None]

    @generates("w")
    def _f_w(self, level: int, init: pd.Timestamp, step_h: int, valid: pd.Timestamp) -> np.ndarray:
        shape = math.sin(math.pi * min(max((level - 100.0) / 900.0, 0.0), 1.0)) + 0.05
        noise = 0.5 * self.white(_VAR_ID["w"], level, int(valid.value // 3_600_000_000_000))
        return -0.15 * shape * (self._ascent(init, step_h, valid) + noise)

    @generates("d")
    def _f_d(self, level: int, init: pd.Timestamp, step_h: int, valid: pd.Timestamp) -> np.ndarray:
        sign = -1.0 if level > 600 else 1.0  # low-level convergence under ascent, divergence aloft
        noise = 0.8 * self.white(_VAR_ID["d"], level, int(valid.value // 3_600_000_000_000))
        return 1.0e-5 * (sign * 0.6 * self._ascent(init, step_h, valid) + noise)

    def _wind(self, comp: str, level: int, init: pd.Timestamp, step_h: int, valid: pd.Timestamp) -> np.ndarray:
        lat = self.latent(valid)
        jet = _JET[level]
        amp = 0.5 * jet + 4.0
        pert = 0.3 * self.perturbation(comp, level, init, step_h)
        if comp == "u":
            clim = jet * np.exp(-(((self.abslat - 40.0) / 12.0) ** 2)) - 5.0 * np.exp(-((self.abslat / 15.0) ** 2))
            anom = -lat["psi_dlat"]
        else:
            clim = np.zeros(self.grid.shape)
            anom = lat["psi_dlon"] / np.maximum(self.coslat, 0.5)  # damped near the poles
        return clim[None] + amp * self.env[None] * (anom[None] + pert)

    @generates("u")
    def _f_u(self, level: int, init: pd.Timestamp, step_h: int, valid: pd.Timestamp) -> np.ndarray:
        return self._wind("u", level, init, step_h, valid)

    @generates("v")
    def _f_v(self, level: int, init: pd.Timestamp, step_h: int, valid: pd.Timestamp) -> np.ndarray:
        return self._wind("v", level, init, step_h, valid)

    # surface
    @generates("msl")
    def _f_msl(self, level: int, init: pd.Timestamp, step_h: int, valid: pd.Timestamp) -> np.ndarray:
        lat = self.latent(valid)
        clim = (101325.0 + 1500.0 * (np.exp(-(((self.abslat - 30.0) / 10.0) ** 2))
                                     - np.exp(-(((self.abslat - 60.0) / 10.0) ** 2)))
                - 600.0 * self.land * lat["season"])
        anom = 0.8 * self._flow_members(init, step_h, valid) + 0.6 * self.own("msl", 0, valid)[None]
        return clim[None] + 900.0 * self.env[None] * anom

    @generates("t2m")
    def _f_t2m(self, level: int, init: pd.Timestamp, step_h: int, valid: pd.Timestamp) -> np.ndarray:
        lat = self.latent(valid)
        t850 = self._f_t(850, init, step_h, valid)
        local = 1.2 * self.own("t2m", 0, valid) + 6.0 * self.land * lat["season"]
        pert = 0.5 * self.perturbation("t2m", 0, init, step_h)
        return t850 + 6.0 + local[None] + pert

    @generates("skt")
    def _f_skt(self, level: int, init: pd.Timestamp, step_h: int, valid: pd.Timestamp) -> np.ndarray:
        noise = 0.3 * self.white(_VAR_ID["skt"], 0, int(valid.value // 3_600_000_000_000))
        return self._f_t2m(0, init, step_h, valid) + 0.8 * self.own("skt", 0, valid)[None] * self.land + noise

    @generates("sst")
    def _f_sst(self, level: int, init: pd.Timestamp, step_h: int, valid: pd.Timestamp) -> np.ndarray:
        lat = self.latent(valid)
        clim = 271.35 + 30.0 * np.clip(self.coslat, 0, 1) ** 2.5 + 1.5 * lat["season"] * (self.abslat < 55)
        sst = np.maximum(clim + 0.4 * self.own("sst", 0, valid), 271.35)
        pert = 0.05 * self.perturbation("sst", 0, init, step_h)
        out = sst[None] + pert
        out[:, self.land > 0.5] = np.nan  # missing over land, as in ENS-10
        return out

    @generates("tcc")
    def _f_tcc(self, level: int, init: pd.Timestamp, step_h: int, valid: pd.Timestamp) -> np.ndarray:
        x = 1.5 * self._ascent(init, step_h, valid) + 0.8 * self.own("tcc", 0, valid)[None] - 0.3
        return _sigmoid(x + 0.8 * self.env[None])

    @generates("tcwv")
    def _f_tcwv(self, level: int, init: pd.Timestamp, step_h: int, valid: pd.Timestamp) -> np.ndarray:
        return 3.8e3 * self._f_q(850, init, step_h, valid)  # kg m-2: ~45 in the tropics, ~4 near the poles

    @generates("tcw")
    def _f_tcw(self, level: int, init: pd.Timestamp, step_h: int, valid: pd.Timestamp) -> np.ndarray:
        tcc = self._f_tcc(0, init, step_h, valid)
        return self._f_tcwv(0, init, step_h, valid) + 0.2 + 0.6 * tcc

    def _rain_rate(self, init: pd.Timestamp, step_h: int) -> np.ndarray:
        """Mean precipitation rate (m / day) over the 24 h ending at ``step_h`` (member, lat, lon)."""
        mid = init + pd.Timedelta(hours=step_h - 12)
        x = 1.6 * self._ascent(init, step_h, mid) + 0.5 * (self.coslat**2)[None] - 1.2
        return 0.004 * _softplus(x)

    @generates("tp")
    def _f_tp(self, level: int, init: pd.Timestamp, step_h: int, valid: pd.Timestamp) -> np.ndarray:
        acc = np.zeros((self.members, *self.grid.shape))
        for s in range(24, step_h + 1, 24):  # accumulated since init: 0 at step 0, grows with lead
            acc = acc + self._rain_rate(init, s)
        return acc

    @generates("cp")
    def _f_cp(self, level: int, init: pd.Timestamp, step_h: int, valid: pd.Timestamp) -> np.ndarray:
        frac = _sigmoid(4.0 * (self.coslat**2 - 0.6) + 0.5 * self.latent(valid)["h"])
        return self._f_tp(0, init, step_h, valid) * frac[None]

    def _surface_wind(self, comp: str, init: pd.Timestamp, step_h: int, valid: pd.Timestamp) -> np.ndarray:
        return (0.75 - 0.25 * self.land)[None] * self._wind(comp, 1000, init, step_h, valid)

    @generates("u10")
    def _f_u10(self, level: int, init: pd.Timestamp, step_h: int, valid: pd.Timestamp) -> np.ndarray:
        return self._surface_wind("u", init, step_h, valid)

    @generates("v10")
    def _f_v10(self, level: int, init: pd.Timestamp, step_h: int, valid: pd.Timestamp) -> np.ndarray:
        return self._surface_wind("v", init, step_h, valid)

    # ---- truth and oracle ----
    def target_members(self, target: str, init: pd.Timestamp, step_h: int) -> np.ndarray:
        """The target's member values (member, lat, lon), float64, target units; NaN where a derived target
        needs a lead the world lacks (tp24 at +0 h)."""
        tg = TARGETS[target]

        def read(name: str, offset_h: int) -> np.ndarray:
            if step_h + offset_h not in LEAD_GROWTH:
                return np.full((self.members, *self.grid.shape), np.nan)
            return self.members_field(name, tg.level or 0, init, step_h + offset_h)

        return tg.members(read)

    def _eps(self, target: str, init: pd.Timestamp, step_h: int) -> np.ndarray:
        """The truth's noise (lat, lon): exactly N(0, 1) pointwise, spatially correlated."""
        key = int(init.value // 3_600_000_000_000)
        rng = _rng(self.seed, _STREAM["eps"], key, list(TARGETS).index(target), step_h)
        smooth = static_fields(rng, self.grid, 1, scale=5.0)[0]
        return math.sqrt(0.7) * smooth + math.sqrt(0.3) * rng.standard_normal(self.grid.shape)

    def oracle(self, target: str, init: pd.Timestamp, step_h: int) -> dict[str, np.ndarray]:
        """True conditional distribution of the target given the forecast, and a draw from it.

        Returns (n_lat, n_lon) float64 arrays: ``truth``, the parameters of the target's family by their
        names in models/distributions.py (``mu``, ``sigma``; ``shape``, ``scale``, ``shift``), the raw
        ensemble ``ens_mean`` / ``ens_std`` (population std) of the target and, for a Gaussian target,
        ``mean`` / ``std`` (= mu, sigma).
        """
        tg = TARGETS[target]
        x = self.target_members(target, init, step_h)
        m, s = x.mean(axis=0), x.std(axis=0)
        eps = self._eps(target, init, step_h)  # (lat, lon) N(0, 1); Phi(eps) ~ U(0, 1) drives the others
        draw = {"gaussian": self._gaussian, "truncnormal": self._wind_speed, "csg": self._amount}[tg.family]
        return {**draw(tg, init, step_h, x, eps), "ens_mean": m, "ens_std": s}

    def _gaussian(self, tg: Target, init: pd.Timestamp, step_h: int, x: np.ndarray,
                  eps: np.ndarray) -> dict[str, np.ndarray]:
        """N(m + beta, sigma^2): beta from location, season, 850 hPa wind and clouds; sigma > spread."""
        m, s = x.mean(axis=0), x.std(axis=0)
        valid = init + pd.Timedelta(hours=step_h)
        uu = self.members_field("u", 850, init, step_h).mean(axis=0)
        vv = self.members_field("v", 850, init, step_h).mean(axis=0)
        ws = np.hypot(uu, vv)  # ensemble-mean 850 hPa wind speed (m/s): a non-linear flow feature
        tcc = self.members_field("tcc", 0, init, step_h).mean(axis=0)
        wind_term = np.tanh((ws - 10.0) / 5.0)
        season = self.latent(valid)["season"]
        g = LEAD_GROWTH[step_h]
        shape = (0.6 * self._bias_fields[tg.name] + 0.5 * season * np.sign(self.sinlat)
                 + 0.6 * wind_term + 0.4 * np.sin(3.0 * (2.0 * tcc - 1.0)))
        if tg.level is None:  # a surface target: clouds keep land nights warm
            shape = shape + 0.8 * (2.0 * tcc - 1.0) * self.land
        beta = tg.error_scale * g * 0.55 * shape
        state = 1.0 + 0.3 * np.tanh(2.0 * wind_term + (tcc - 0.5))
        sigma = np.sqrt((UNDERDISPERSION * s * state) ** 2 + (0.25 * tg.error_scale * g) ** 2)
        mean = m + beta
        truth = mean + sigma * eps
        return {"mean": mean, "std": sigma, "mu": mean, "sigma": sigma, "truth": truth}

    def _wind_speed(self, tg: Target, init: pd.Timestamp, step_h: int, x: np.ndarray,
                    eps: np.ndarray) -> dict[str, np.ndarray]:
        """N(mu, sigma^2) truncated to [0, inf): the members' speed corrected by place (weaker over land),
        season and the speed itself; sigma grows with the spread (under-dispersion) and in strong wind."""
        m, s = x.mean(axis=0), x.std(axis=0)  # (lat, lon) m/s
        g = LEAD_GROWTH[step_h]
        season = self.latent(init + pd.Timedelta(hours=step_h))["season"]
        strong = np.tanh((m - 8.0) / 4.0)
        shape = (0.8 * self._bias_fields[tg.name] + 0.4 * season * np.sign(self.sinlat)
                 - 0.6 * self.land + 0.5 * strong)
        mu = m + tg.error_scale * g * shape
        sigma = np.sqrt((UNDERDISPERSION * s * (1.0 + 0.2 * strong)) ** 2 + (0.3 * tg.error_scale * g) ** 2)
        truth = stats.truncnorm.ppf(special.ndtr(eps), -mu / sigma, np.inf, loc=mu, scale=sigma)
        return {"mu": mu, "sigma": sigma, "truth": truth}

    def _amount(self, tg: Target, init: pd.Timestamp, step_h: int, x: np.ndarray,
                eps: np.ndarray) -> dict[str, np.ndarray]:
        """max(0, X - shift), X ~ Gamma(shape, scale): the shift (so P(dry)) grows in dry regions (land in
        the subtropics) and with the dry members; the mean follows the members' mean corrected by place and
        season; near the year's rare intense events the spread triples (heavy tails)."""
        m, s = x.mean(axis=0), x.std(axis=0)  # (lat, lon) mm
        dry = (x < (tg.dry_below or 0.0)).mean(axis=0)  # the dry members' fraction; NaN x (no lead) counts as wet
        valid = init + pd.Timedelta(hours=step_h)
        g = LEAD_GROWTH[step_h]
        season = self.latent(valid)["season"]
        desert = self.land * np.exp(-(((self.abslat - 25.0) / 10.0) ** 2))
        shift = 1.0 + 3.0 * desert + 2.0 * dry
        local = np.exp(0.3 * self._bias_fields[tg.name] + 0.25 * season * np.sign(self.sinlat))
        mean = 0.5 * shift + m * local + 0.2 * g
        heavy = np.tanh(np.abs(self._event_field(*self._year_day(valid))))
        std = np.sqrt((1.5 * s) ** 2 + (0.6 * g + 0.3 * mean) ** 2) * (1.0 + 2.0 * heavy)
        shape, scale = (mean / std) ** 2, std**2 / mean
        truth = np.maximum(special.gammaincinv(shape, special.ndtr(eps)) * scale - shift, 0.0)
        return {"shape": shape, "scale": scale, "shift": shift, "truth": truth}


@functools.lru_cache(maxsize=8)
def world(seed: int, resolution: float, members: int = schema.N_MEMBERS) -> World:
    return World(seed, Grid(resolution), members)


# --- lazy datasets -------------------------------------------------------------------------------
def _member_block(cfg: SynthConfig, name: str, inits: tuple[pd.Timestamp, ...]) -> np.ndarray:
    """(init, member, step, level, lat, lon) float32 for one variable (level axis of 1 for surface)."""
    w = world(cfg.seed, cfg.resolution, cfg.members)
    var = schema.VARIABLES[name]
    levels = cfg.sorted_levels if var.on_levels else (0,)
    out = np.empty((len(inits), cfg.members, len(schema.STEPS_H), len(levels), *cfg.grid.shape), np.float32)
    for i, t in enumerate(inits):
        for j, step in enumerate(schema.STEPS_H):
            for k, lv in enumerate(levels):
                out[i, :, j, k] = w.members_field(name, lv, t, step)
    return out


def _time_chunks(cfg: SynthConfig) -> tuple[int, ...]:
    n = len(cfg.init_times)
    return tuple(min(cfg.chunk_dates, n - i) for i in range(0, n, cfg.chunk_dates))


def _inits_of(block_info: dict[Any, Any] | None, cfg: SynthConfig, axis: int) -> tuple[pd.Timestamp, ...]:
    start, stop = block_info[None]["array-location"][axis]  # type: ignore[index]
    return tuple(cfg.init_times[start:stop])


def _member_block_mapped(block_info: dict[Any, Any] | None = None, *, cfg: SynthConfig, variable: str) -> np.ndarray:
    return _member_block(cfg, variable, _inits_of(block_info, cfg, 0))


def _lazy_variable(cfg: SynthConfig, var: schema.Variable) -> da.Array:
    """(init_time, member, step[, level], lat, lon) float32 dask array; one task per date chunk.
    Built with ``map_blocks`` so even the 2100-date, 0.5 deg graph costs milliseconds to create."""
    nl = len(cfg.sorted_levels) if var.on_levels else 1
    ny, nx = cfg.grid.shape
    chunks = (_time_chunks(cfg), (cfg.members,), (len(schema.STEPS_H),), (nl,), (ny,), (nx,))
    arr = da.map_blocks(_member_block_mapped, chunks=chunks, dtype=np.float32, meta=np.empty((0,) * 6, np.float32),
                        cfg=cfg, variable=var.name, name=f"synth-{var.name}-{dask.base.tokenize(cfg)}")
    return arr[:, :, :, 0] if var.level_type is schema.LevelType.SURFACE else arr


def _coords(cfg: SynthConfig, with_members: bool = True, levels: bool = True) -> dict[str, Any]:
    times = cfg.init_times
    steps = pd.to_timedelta(list(schema.STEPS_H), unit="h")
    coords: dict[str, Any] = {
        schema.INIT_TIME: times,
        schema.STEP: steps,
        schema.LAT: ("latitude", cfg.grid.latitudes(), {"units": "degrees_north", "standard_name": "latitude"}),
        schema.LON: ("longitude", cfg.grid.longitudes(), {"units": "degrees_east", "standard_name": "longitude"}),
        schema.VALID_TIME: ((schema.INIT_TIME, schema.STEP),
                            times.values[:, None] + steps.values[None, :]),
    }
    if with_members:
        coords[schema.MEMBER] = np.arange(1, cfg.members + 1)
    if levels:
        coords[schema.LEVEL] = ("level", np.array(cfg.sorted_levels), {"units": "hPa"})
    return coords


# The CF attributes moved to the schema (``schema.cf_attrs``); this alias keeps the one remaining
# importer, datasets/sources/, working until it switches.


def forecast_dataset(cfg: SynthConfig, variables: list[str] | None = None) -> xr.Dataset:
    """Lazy synthetic ENS-10 forecasts in canonical conventions (nothing computed until asked)."""
    names = variables or list(schema.VARIABLES)
    data_vars = {}
    for name in names:
        var = schema.VARIABLES[name]
        data_vars[name] = xr.Variable(var.dims, _lazy_variable(cfg, var), schema.cf_attrs(var))
    ds = xr.Dataset(data_vars, coords=_coords(cfg))
    ds.attrs.update(synthetic_attrs(cfg))
    return ds


def _truth_arrays(cfg: SynthConfig) -> list[tuple[str, str, str, str]]:
    """(target, oracle key, store name, label) of every truth and oracle array of the config's targets:
    the truth, then the oracle's parameters (a Gaussian's mean and std, another family's by name)."""
    out = []
    for target in cfg.targets:
        out.append((target, "truth", contract.truth_name(target), "ERA5-like"))
        for param, name in contract.oracle_parameters(target).items():
            out.append((target, param, name, f"oracle {name.split('_')[1]}"))
    return out


def _truth_block(cfg: SynthConfig, inits: tuple[pd.Timestamp, ...]) -> np.ndarray:
    """(array, init, step, lat, lon) float32 for a block of init times, arrays as :func:`_truth_arrays`."""
    w = world(cfg.seed, cfg.resolution, cfg.members)
    arrays = _truth_arrays(cfg)
    out = np.empty((len(arrays), len(inits), len(schema.STEPS_H), *cfg.grid.shape), dtype=np.float32)
    for i, t in enumerate(inits):
        for j, step in enumerate(schema.STEPS_H):
            oracles = {target: w.oracle(target, t, step) for target in cfg.targets}
            for k, (target, key, _, _) in enumerate(arrays):
                out[k, i, j] = oracles[target][key]
    return out


def _truth_block_mapped(block_info: dict[Any, Any] | None = None, *, cfg: SynthConfig) -> np.ndarray:
    return _truth_block(cfg, _inits_of(block_info, cfg, 1))


def truth_dataset(cfg: SynthConfig) -> xr.Dataset:
    """Lazy ERA5-like truth ``truth_<target>`` and the oracle (``oracle_mean_<target>`` /
    ``oracle_std_<target>``, or :func:`postcast.datasets.contract.oracle_parameters`) for every target of
    the config and every step, dims (init_time, step, latitude, longitude)."""
    arrays = _truth_arrays(cfg)
    chunks = ((len(arrays),), _time_chunks(cfg), (len(schema.STEPS_H),), *((n,) for n in cfg.grid.shape))
    arr = da.map_blocks(_truth_block_mapped, chunks=chunks, dtype=np.float32, meta=np.empty((0,) * 5, np.float32),
                        cfg=cfg, name=f"synth-truth-{dask.base.tokenize(cfg)}")
    dims = (schema.INIT_TIME, schema.STEP, schema.LAT, schema.LON)
    data_vars = {name: xr.Variable(dims, arr[k], {"units": "1" if key == "shape" else TARGETS[target].units,
                                                   "target": target, "long_name": f"{label} {target}"})
                 for k, (target, key, name, label) in enumerate(arrays)}
    ds = xr.Dataset(data_vars, coords=_coords(cfg, with_members=False, levels=False))
    ds.attrs.update(synthetic_attrs(cfg))
    return ds


def synthetic_attrs(cfg: SynthConfig) -> dict[str, Any]:
    import json

    return {"postcast_synthetic": json.dumps(cfg.to_dict()), "postcast_synthetic_version": FORMAT_VERSION}
