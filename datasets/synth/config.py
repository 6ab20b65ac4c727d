"""What the synthetic world generates: :class:`SynthConfig`, the typed configuration (kind ``synth``)."""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd

from postcast.datasets import schema
from postcast.datasets.core import config
from postcast.datasets.core.errors import ConfigError
from postcast.datasets.schema import TARGETS, Grid


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
    variables: tuple[str, ...] = ()  # forecast variables written (canonical names); () = all 18
    regimes: bool = False  # the regime world: the Gaussian targets' error follows 4 regimes (synth/truth.py REGIMES)

    def __post_init__(self) -> None:
        Grid(self.resolution)  # validates
        object.__setattr__(self, "targets", tuple(self.targets))  # a list from YAML or to_dict
        object.__setattr__(self, "variables", tuple(self.variables))
        odd = [v for v in self.variables if v not in schema.VARIABLES]
        if odd:
            msg = f"variables {odd}: choose from {list(schema.VARIABLES)}, or leave out for all of them"
            raise ConfigError(msg)
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

    @functools.cached_property
    def init_times(self) -> pd.DatetimeIndex:
        """Every init date (computed once: each task of the lazy dataset reads it)."""
        return schema.init_times(self.year_list, self.month_days)

    @property
    def sorted_levels(self) -> tuple[int, ...]:
        return tuple(sorted(self.levels))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["years"] = list(self.years)
        d["levels"] = list(self.levels)
        d["targets"] = list(self.targets)
        d["variables"] = list(self.variables)
        if not self.regimes:  # the default world's attributes (and so its stores' checksums) stay as they were
            del d["regimes"]
        return d
