"""The synthetic world's weather: geography, latent fields (flow, moisture, extremes, season), member
perturbations and the member fields of every schema variable, one generator per variable
(:func:`generates`, :data:`GENERATORS`). Every field is a deterministic function of the seed and the date."""

from __future__ import annotations

import functools
import math
import zlib
from collections.abc import Callable

import numpy as np
import pandas as pd

from postcast.datasets import schema
from postcast.datasets.schema import GRAVITY, Grid
from postcast.datasets.synth.waves import GaussianWaves, _rng, static_fields

GEOGRAPHY_SEED = 20180101  # the static land/sea pattern and local biases are shared by all seeds

# Error growth with lead time: spread, bias and truth noise scale with g(step).
LEAD_GROWTH = {0: 0.15, 24: 0.6, 48: 1.0}
UNDERDISPERSION = 1.7  # k: true error std / ensemble spread (spread/skill ~ 1/k before bias)

# Standard-atmosphere geopotential heights (m) and temperatures (K) on the ENS-10 levels.
_H_STD = {
    10: 31060.0,
    50: 20580.0,
    100: 16180.0,
    200: 11790.0,
    300: 9160.0,
    400: 7180.0,
    500: 5570.0,
    700: 3010.0,
    850: 1460.0,
    925: 760.0,
    1000: 110.0,
}
_T_STD = {
    10: 227.0,
    50: 211.0,
    100: 206.0,
    200: 217.0,
    300: 229.0,
    400: 242.0,
    500: 253.0,
    700: 270.0,
    850: 279.0,
    925: 283.0,
    1000: 288.0,
}
_JET = {
    10: 8.0,
    50: 10.0,
    100: 15.0,
    200: 35.0,
    300: 30.0,
    400: 24.0,
    500: 18.0,
    700: 10.0,
    850: 6.0,
    925: 4.0,
    1000: 3.0,
}  # m/s, zonal-mean westerly jet maximum


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


# variable name -> the Weather method that makes its member fields (member, lat, lon): one entry per
# schema variable, registered where the method is defined
Generator = Callable[["Weather", int, pd.Timestamp, int, pd.Timestamp], np.ndarray]
GENERATORS: dict[str, Generator] = {}


def generates(name: str) -> Callable[[Generator], Generator]:
    def register(method: Generator) -> Generator:
        GENERATORS[name] = method
        return method

    return register


class Weather:
    """The forecast side of the synthetic world for one seed and grid (geography, latent weather, member
    fields); every method is a pure function. :class:`postcast.datasets.synth.truth.World` adds the truth."""

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

    # ---- time-indexed latent fields (cached per process) ----
    @functools.lru_cache(maxsize=32)  # noqa: B019 - worlds are few and long-lived
    def _waves(self, stream: str, year: int, sub: int = 0) -> GaussianWaves:
        periods = (15.0, 90.0) if stream == "own" else (6.0, 40.0)
        return GaussianWaves(_rng(self.seed, _STREAM[stream], year, sub), periods=periods)

    @functools.lru_cache(maxsize=64)  # noqa: B019
    def _events(self, year: int) -> np.ndarray:
        """Extreme events of a year: rows (time_day, lat, lon, amplitude, radius_deg, duration_day)."""
        rng = _rng(self.seed, _STREAM["events"], year)
        k = rng.poisson(8.0)
        return np.column_stack(
            [
                rng.uniform(0, 366, k),
                np.rad2deg(np.arcsin(rng.uniform(-0.95, 0.95, k))),
                rng.uniform(0, 360, k),
                rng.choice([-1.0, 1.0], k) * rng.uniform(2.5, 4.0, k),
                rng.uniform(8.0, 15.0, k),
                rng.uniform(1.5, 3.0, k),
            ]
        )

    def _event_field(self, year: int, day: float) -> np.ndarray:
        out = np.zeros(self.grid.shape)
        for te, la, lo, amp, rad, dur in self._events(year):
            w = math.exp(-0.5 * ((day - te) / dur) ** 2)
            if w < 1e-3:
                continue
            c = (
                np.sin(np.deg2rad(la)) * self.sinlat
                + np.cos(np.deg2rad(la)) * self.coslat * np.cos(np.deg2rad(self.lon - lo))[None, :]
            )
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
            msg = (
                f"no synthetic generator for variable {name!r}: add a World method decorated "
                f"@generates({name!r}) to class Weather in datasets/synth/weather.py"
            )
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
        clim = (
            101325.0
            + 1500.0 * (np.exp(-(((self.abslat - 30.0) / 10.0) ** 2)) - np.exp(-(((self.abslat - 60.0) / 10.0) ** 2)))
            - 600.0 * self.land * lat["season"]
        )
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
