"""The synthetic truth: each target's true predictive distribution given the forecast (the oracle) and an
ERA5-like draw from it, for a Gaussian, a truncated-normal (``ws10``) and a censored shifted gamma
(``tp24``) target."""

from __future__ import annotations

import functools
import math

import numpy as np
import pandas as pd
from scipy import special, stats

from postcast.datasets import schema
from postcast.datasets.schema import TARGETS, Grid, Target
from postcast.datasets.synth.waves import GaussianWaves, _rng, static_fields
from postcast.datasets.synth.weather import _STREAM, GEOGRAPHY_SEED, LEAD_GROWTH, UNDERDISPERSION, Weather

# The regime world (``SynthConfig.regimes``): at every point and valid time one of four regimes, land or ocean
# (static) by blocked or zonal flow (the flow anomaly psi above BLOCKED: about 31 % of the time), each with
# its own error model for the Gaussian targets: the sign of the flow-dependent bias and the under-dispersion
# (error growth) change with the regime.
REGIMES = ("ocean_zonal", "ocean_blocked", "land_zonal", "land_blocked")
BLOCKED = 0.5  # psi (unit variance) above which the flow counts as blocked
REGIME_UNDERDISPERSION = (1.2, 2.4, 1.6, 3.0)  # k per regime (the default world: UNDERDISPERSION everywhere)


class World(Weather):
    """Deterministic synthetic world for one seed and grid: the weather and, given its forecast, the truth
    and the oracle of every target; every method is a pure function. ``regimes``: the Gaussian targets' error
    follows :data:`REGIMES` (:meth:`regime`), the forecasts are the same."""

    def __init__(self, seed: int, grid: Grid, members: int = schema.N_MEMBERS, regimes: bool = False):
        super().__init__(seed, grid, members)
        self.regimes = regimes
        self._bias_fields = {
            name: GaussianWaves(_rng(GEOGRAPHY_SEED, 10 + i), n_max=5, l_max=5, scale=2.0)(self.lat, self.lon)
            for i, name in enumerate(TARGETS)
        }

    def target_members(self, target: str, init: pd.Timestamp, step_h: int) -> np.ndarray:
        """The target's member values (member, lat, lon), float64, target units; NaN where a derived target
        needs a lead the world lacks (tp24 at +0 h)."""
        tg = schema.target(target)

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
        tg = schema.target(target)
        x = self.target_members(target, init, step_h)
        m, s = x.mean(axis=0), x.std(axis=0)
        eps = self._eps(target, init, step_h)  # (lat, lon) N(0, 1); Phi(eps) ~ U(0, 1) drives the others
        draw = {"gaussian": self._gaussian, "truncnormal": self._wind_speed, "csg": self._amount}[tg.family]
        return {**draw(tg, init, step_h, x, eps), "ens_mean": m, "ens_std": s}

    def regime(self, valid: pd.Timestamp) -> np.ndarray:
        """The regime (lat, lon) int, an index of :data:`REGIMES`: 2 x land + blocked (psi > :data:`BLOCKED`)."""
        blocked = self.latent(valid)["psi"] > BLOCKED
        return (2 * (self.land > 0.5) + blocked).astype(np.int64)

    def _gaussian(
        self, tg: Target, init: pd.Timestamp, step_h: int, x: np.ndarray, eps: np.ndarray
    ) -> dict[str, np.ndarray]:
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
        local = 0.6 * self._bias_fields[tg.name] + 0.5 * season * np.sign(self.sinlat)
        k: float | np.ndarray  # the under-dispersion: true error std / spread
        if self.regimes:
            flow, k = self._regime_error(valid, wind_term, tcc)
            shape = local + flow
        else:
            shape, k = local + 0.6 * wind_term + 0.4 * np.sin(3.0 * (2.0 * tcc - 1.0)), UNDERDISPERSION
            if tg.level is None:  # a surface target: clouds keep land nights warm
                shape = shape + 0.8 * (2.0 * tcc - 1.0) * self.land
        beta = tg.error_scale * g * 0.55 * shape
        state = 1.0 + 0.3 * np.tanh(2.0 * wind_term + (tcc - 0.5))
        sigma = np.sqrt((k * s * state) ** 2 + (0.25 * tg.error_scale * g) ** 2)
        mean = m + beta
        truth = mean + sigma * eps
        return {"mean": mean, "std": sigma, "mu": mean, "sigma": sigma, "truth": truth}

    def _regime_error(
        self, valid: pd.Timestamp, wind_term: np.ndarray, tcc: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The regime world's flow-dependent bias shape and under-dispersion k, each (lat, lon): over the ocean
        the bias follows the 850 hPa wind, with opposite signs in zonal and blocked flow; over land the
        clouds, likewise; blocked flow adds a bias of its own and grows the error faster (larger k)."""
        cloud = 2.0 * tcc - 1.0
        regime = self.regime(valid)
        flow = np.choose(regime, [wind_term, 0.6 - wind_term, cloud, -0.6 - cloud])
        return 0.9 * flow, np.take(np.asarray(REGIME_UNDERDISPERSION), regime)

    def _wind_speed(
        self, tg: Target, init: pd.Timestamp, step_h: int, x: np.ndarray, eps: np.ndarray
    ) -> dict[str, np.ndarray]:
        """N(mu, sigma^2) truncated to [0, inf): the members' speed corrected by place (weaker over land),
        season and the speed itself; sigma grows with the spread (under-dispersion) and in strong wind."""
        m, s = x.mean(axis=0), x.std(axis=0)  # (lat, lon) m/s
        g = LEAD_GROWTH[step_h]
        season = self.latent(init + pd.Timedelta(hours=step_h))["season"]
        strong = np.tanh((m - 8.0) / 4.0)
        shape = 0.8 * self._bias_fields[tg.name] + 0.4 * season * np.sign(self.sinlat) - 0.6 * self.land + 0.5 * strong
        mu = m + tg.error_scale * g * shape
        sigma = np.sqrt((UNDERDISPERSION * s * (1.0 + 0.2 * strong)) ** 2 + (0.3 * tg.error_scale * g) ** 2)
        truth = stats.truncnorm.ppf(special.ndtr(eps), -mu / sigma, np.inf, loc=mu, scale=sigma)
        return {"mu": mu, "sigma": sigma, "truth": truth}

    def _amount(
        self, tg: Target, init: pd.Timestamp, step_h: int, x: np.ndarray, eps: np.ndarray
    ) -> dict[str, np.ndarray]:
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
def world(seed: int, resolution: float, members: int = schema.N_MEMBERS, regimes: bool = False) -> World:
    return World(seed, Grid(resolution), members, regimes)
