"""The train / validation / test splits of a store by init year (ENS-10's by default: train 1998-2013,
validation 2014-2015, test 2016-2017; docs/ens10.md, *Splits*): which split a year or an init time falls in,
checked for order and overlap. Ingest fixes them in the store; normalisation statistics come from the training
years only. :mod:`postcast.datasets.schema` re-exports :class:`Splits`, as it does the grid.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from postcast.datasets.core.errors import ConfigError


@dataclass(frozen=True)
class Splits:
    """Year ranges (inclusive) of the train / validation / test splits, by init year."""

    train: tuple[int, int] = (1998, 2013)
    val: tuple[int, int] = (2014, 2015)
    test: tuple[int, int] = (2016, 2017)
    names: tuple[str, ...] = field(default=("train", "val", "test"), repr=False)

    def __post_init__(self) -> None:
        spans = [self.train, self.val, self.test]
        for name, (a, b) in zip(self.names, spans, strict=True):
            if a > b:
                msg = f"split {name!r} has start year {a} after end year {b}"
                raise ConfigError(msg)
        ordered = sorted(spans)
        for (_, b1), (a2, _) in itertools.pairwise(ordered):
            if a2 <= b1:
                msg = f"splits overlap: {self.as_dict()}; give each year to one split only"
                raise ConfigError(msg)

    def as_dict(self) -> dict[str, list[int]]:
        return {"train": list(self.train), "val": list(self.val), "test": list(self.test)}

    @classmethod
    def from_dict(cls, d: dict[str, list[int]] | None) -> Splits:
        if not d:
            return cls()
        unknown = set(d) - {"train", "val", "test"}
        if unknown:
            msg = f"unknown split names {sorted(unknown)}; use train, val, test"
            raise ConfigError(msg)
        base = cls()
        return cls(
            train=tuple(d.get("train", base.train)),  # type: ignore[arg-type]
            val=tuple(d.get("val", base.val)),  # type: ignore[arg-type]
            test=tuple(d.get("test", base.test)),  # type: ignore[arg-type]
        )

    def split_of(self, year: int) -> str | None:
        for name, (a, b) in zip(self.names, (self.train, self.val, self.test), strict=True):
            if a <= year <= b:
                return name
        return None

    def mask(self, times: pd.DatetimeIndex | np.ndarray, split: str) -> np.ndarray:
        """Boolean mask of the init times that fall into ``split``."""
        a, b = getattr(self, split)
        years = pd.DatetimeIndex(times).year
        return np.asarray((years >= a) & (years <= b))
