"""What a post-processor reads, declared once: :class:`SampleSpec`, and :class:`Sampler`, which turns
one init date of canonical data into a sample (numpy, physical units; no torch here).

The spec travels in every checkpoint; the store DataModule, the compressed dataloader and
``postcast forecast`` all build samples with :class:`Sampler`, so they agree by construction.

One sample = one init date at the spec's lead (48 h by default), on the whole grid:

* ``fields`` (2V [+ T], H, W) float32: for each input variable (at the target's level, or the surface),
  the ensemble mean and the ensemble std, in physical units (NaN where the field is undefined,
  e.g. SST over land); for a derived target, then T channels of its own members' statistics: mean, std
  and, for a target with ``dry_below`` (tp24), the fraction of dry members. The model normalises them
  (models/module.py), not the loader;
* ``features`` (F, H, W) float32: optional location features sin(lat), cos(lat) sin(lon),
  cos(lat) cos(lon), then the land channel (1 over land, 0 over sea: where SST, undefined over land, has no
  ensemble mean), then season features sin/cos(2 pi doy / 365.25);
* ``y`` (H, W): the truth of the target (NaN where missing);
* ``m``, ``s`` (H, W): the raw ensemble mean and population std of the target (for the head); a derived
  target's (``ws10``, ``tp24``: :class:`postcast.datasets.schema.Target`) are taken over its members,
  computed per member from the store's member fields (``u10``, ``v10``; ``tp`` at the lead and 24 h before);
* the oracle when the data has it (synthetic data): ``oracle_mean``/``oracle_std`` (H, W) for a Gaussian
  target, ``oracle_<parameter>`` (``oracle_shape``) for another family;
* ``members`` (M, V, H, W) float32 when ``members`` is set: every member of every input variable.

Input variables are names (``t``: at the target's level) or ``name@level`` (``u@850``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import cached_property
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
import xarray as xr

from postcast.datasets import contract, laws, schema
from postcast.datasets.core.errors import ConfigError, MissingInputError

Sample = dict[str, np.ndarray]
NORMALISATIONS = ("point", "channel")  # a model's input statistics: each grid point's own, or one per channel


class Input(NamedTuple):
    """One input variable as a model reads it: its spec (``u@850``), variable, level (None: surface, or
    the data's first level for a pressure variable of a surface target) and whether it has levels."""

    spec: str
    variable: str
    level: int | None
    pressure: bool


def parse_variable(spec: str) -> tuple[str, int | None]:
    """``"u@850"`` -> ("u", 850); ``"t"`` -> ("t", None)."""
    name, _, level = spec.partition("@")
    if not level:
        return name, None
    if not level.isdigit() or int(level) not in schema.LEVELS:
        msg = f"input variable {spec!r}: level {level!r} is not one of {list(schema.LEVELS)} hPa"
        raise ConfigError(msg)
    return name, int(level)


@dataclass(frozen=True)
class SampleSpec:
    """What a post-processor reads (saved in its checkpoint)."""

    target: str = schema.DEFAULT_TARGET  # a key of schema.TARGETS (resolved: :attr:`resolved_target`)
    variables: tuple[str, ...] | None = None  # None: all pressure (pressure-level target) or surface variables;
    # entries "name" (pressure variables at the target level) or "name@level" ("u@850")
    step_h: int = schema.TARGET_STEP_H
    location_features: bool = True
    land_feature: bool = False  # the land-sea mask as a channel, read from SST's gaps (:attr:`land_source`)
    season_features: bool = True
    members: bool = False  # also read the raw members (Transformer, global EMOS)

    def __post_init__(self) -> None:
        bad = [v for v in self.variables or () if parse_variable(v)[0] not in schema.VARIABLES]
        problems = [
            *(
                [f"target {self.target!r}: use one of {list(schema.TARGETS)}"]
                if self.target not in schema.TARGETS
                else []
            ),
            *(
                [f"unknown input variables {bad}; known: {list(schema.VARIABLES)} (optionally name@level)"]
                if bad
                else []
            ),
            *([f"step_h {self.step_h}: a lead time in hours must be >= 0"] if self.step_h < 0 else []),
            *self._window_problem(),
        ]
        if problems:
            raise ConfigError("; ".join(problems))

    def _window_problem(self) -> list[str]:
        """An accumulated target needs its whole window before the lead (tp24: 24 h)."""
        derive = schema.TARGETS[self.target].derive if self.target in schema.TARGETS else None
        if derive is None or self.step_h < 0 or self.step_h >= derive.window_h:
            return []
        return [
            f"step_h {self.step_h}: {self.target} accumulates over the {derive.window_h} h before the lead, "
            f"which +{self.step_h} h does not have; give --data.cfg.sample.step_h {derive.window_h} or more"
        ]

    @cached_property
    def resolved_target(self) -> schema.Target:
        """The :class:`~postcast.datasets.schema.Target` the spec names (checked when the spec is made)."""
        return schema.target(self.target)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SampleSpec:
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        if known.get("variables") is not None:
            known["variables"] = tuple(known["variables"])
        return cls(**known)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["variables"] = list(self.variables) if self.variables is not None else None
        return out

    # --- what is read ----------------------------------------------------------------------------
    @property
    def input_variables(self) -> tuple[str, ...]:
        if self.variables is not None:
            return self.variables
        pl = self.resolved_target.level is not None
        src = schema.PL_VARIABLES if pl else schema.SFC_VARIABLES
        return tuple(v.name for v in src)

    def inputs(self) -> list[Input]:
        """Every input with its level resolved (the target's for pressure variables without one)."""
        tg = self.resolved_target
        out = []
        for spec in self.input_variables:
            name, level = parse_variable(spec)
            pressure = schema.VARIABLES[name].on_levels
            out.append(Input(spec, name, (level or tg.level) if pressure else None, pressure))
        return out

    @property
    def target_fields(self) -> tuple[str, ...]:
        """The channels a derived target adds after the inputs' (its members' mean, std and dry fraction);
        () for a variable target, whose statistics are among the inputs'."""
        tg = self.resolved_target
        if not tg.derived:
            return ()
        dry = (f"dry_fraction_{self.target}",) if tg.dry_below is not None else ()
        return (contract.ens_mean(self.target), contract.ens_std(self.target), *dry)

    @property
    def n_member_variables(self) -> int:
        """Variables V' of ``members`` (M, V', H, W): the inputs', then a derived target's own members (the
        models that read the target's members, global EMOS and the Transformer, find it at V)."""
        return len(self.input_variables) + int(self.resolved_target.derived)

    @property
    def n_fields(self) -> int:
        """Channels of ``fields``: ensemble mean and std of each input variable, then the target's own."""
        return 2 * len(self.input_variables) + len(self.target_fields)

    @property
    def n_features(self) -> int:
        return 3 * self.location_features + self.land_feature + 2 * self.season_features

    @property
    def land_source(self) -> str:
        """The variable whose gaps are the land channel: the one ENS-10 leaves undefined over land (SST). An
        ENS-10 store has no static field, but every one holds SST, NaN over land at every date."""
        return next(v.name for v in schema.SFC_VARIABLES if v.missing_over_land)

    @property
    def n_channels(self) -> int:
        """Channels a network sees: the normalised fields, then the features."""
        return self.n_fields + self.n_features

    def field_keys(self) -> list[str]:
        """Names of the ``fields`` channels in order (``ens_mean_u@850``, ``ens_std_u@850``, ...)."""
        return [
            *(k for i in self.input_variables for k in (contract.ens_mean(i), contract.ens_std(i))),
            *self.target_fields,
        ]

    @property
    def target_variable_index(self) -> int:
        """Position of the target variable (at the target level) among the input variables; a derived
        target's statistics come after the inputs' (channels 2V, 2V + 1): position V."""
        tg = self.resolved_target
        if tg.derived:
            return len(self.input_variables)
        for i, (name, level) in enumerate(parse_variable(v) for v in self.input_variables):
            if name == tg.variable and level in (None, tg.level):
                return i
        msg = f"the target variable {tg.variable!r} is not among the inputs {list(self.input_variables)}"
        raise ConfigError(msg)

    def store_variables(self, *, oracle: bool = False) -> list[str]:
        """The store variables a sample reads."""
        tg = self.resolved_target
        names = [n for i in self.inputs() for n in (contract.ens_mean(i.variable), contract.ens_std(i.variable))]
        if self.members:
            names += [i.variable for i in self.inputs()]
        if tg.derived:  # its members are computed from the member fields it is derived from
            names += list(tg.input_variables)
        else:
            names += [contract.ens_mean(tg.variable), contract.ens_std(tg.variable)]
        if self.land_feature:
            names.append(contract.ens_mean(self.land_source))
        names.append(contract.truth_name(self.target))
        if oracle:
            names += list(contract.oracle_parameters(tg).values())
        return list(dict.fromkeys(names))

    def raw_needs(self) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """Raw variables and pressure levels a sample is computed from (the target's included)."""
        tg = self.resolved_target
        variables = {*tg.input_variables, *(i.variable for i in self.inputs())}
        variables |= {self.land_source} if self.land_feature else set()
        levels = {(i.level or schema.LEVELS[0]) for i in self.inputs() if i.pressure}
        levels |= {tg.level} if tg.level else set()
        return tuple(sorted(variables)), tuple(sorted(levels))

    # --- selection and statistics ----------------------------------------------------------------
    def select(self, da: xr.DataArray, level: int | None = None, offset_h: int = 0) -> np.ndarray:
        """The spec's lead (plus ``offset_h``) and ``level`` (else the target's, else the first) of ``da`` (positional
        indexing on the Variable: ~30x cheaper than DataArray.sel). A lead the data lacks is a ConfigError
        naming the leads it holds and ``--data.cfg.sample.step_h``
        (:func:`~postcast.datasets.contract.step_position`)."""
        pos: dict[str, int] = {}
        if schema.STEP in da.dims:
            pos[schema.STEP] = contract.step_position(da.get_index(schema.STEP), self.step_h + offset_h)
        if schema.LEVEL in da.dims:
            lv = level if level is not None else self.resolved_target.level
            levels = da[schema.LEVEL].values
            if lv is not None and lv not in levels:
                msg = f"{da.name}: level {lv} hPa is not in the data (it has {levels.tolist()})"
                raise MissingInputError(msg)
            pos[schema.LEVEL] = int(da.get_index(schema.LEVEL).get_loc(lv if lv is not None else levels[0]))
        return np.asarray(da.variable.isel(pos).values)

    def normalisation(self, stats: xr.Dataset, per: str = "point") -> tuple[np.ndarray, np.ndarray]:
        """(mean, std), each (n_fields, H, W) float32: the training statistics of the ``fields`` channels, per
        grid point (``per="point"``) or one mean and std per channel over the grid (``"channel"``:
        :func:`pooled`, broadcast to (H, W)); std floored at 1e-3 of its mean, so constant points divide by > 0."""
        if per not in NORMALISATIONS:
            msg = f"normalisation per {per!r}: choose one of {list(NORMALISATIONS)}"
            raise ConfigError(msg)
        means, stds = [], []
        for i in self.inputs():
            for name in (contract.ens_mean(i.variable), contract.ens_std(i.variable)):
                mean = self.select(stats[contract.point_mean(name)], i.level).astype(np.float32)
                std = self.select(stats[contract.point_std(name)], i.level).astype(np.float32)
                mean, std = pooled(mean, std) if per == "channel" else (mean, std)
                floor = max(float(np.nanmean(std)) * 1e-3, 1e-12)
                means.append(np.nan_to_num(mean))
                stds.append(np.maximum(np.nan_to_num(std), floor))
        if self.target_fields:
            target = zip(*self._target_normalisation(stats), strict=True)
            for mean, std in (pooled(m, s) if per == "channel" else (m, s) for m, s in target):
                means.append(mean)
                stds.append(std)
        return np.stack(means), np.stack(stds)

    def _target_normalisation(self, stats: xr.Dataset) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """A derived target's channels, each (H, W): its members' mean by the truth's training mean and std
        at the point, their std by the truth's std, the dry fraction as it is (0..1). The std is floored at
        a tenth of its mean over the grid: where the training truth never varies (always dry), a finer
        floor makes the channel huge and a model's coefficient on it overflows."""
        truth = contract.truth_name(self.target)
        if contract.point_mean(truth) not in stats:
            msg = (
                f"the store's statistics have no {truth}: train {self.target} on a store ingested with its "
                f"truth (synthetic: SynthConfig targets)"
            )
            raise MissingInputError(msg)
        mean = np.nan_to_num(self.select(stats[contract.point_mean(truth)]).astype(np.float32))
        std = np.nan_to_num(self.select(stats[contract.point_std(truth)]).astype(np.float32))
        std = np.maximum(std, max(float(std.mean()) * 0.1, 1e-6))
        zero, one = np.zeros_like(mean), np.ones_like(mean)
        return [mean, zero, zero][: len(self.target_fields)], [std, std, one][: len(self.target_fields)]


def pooled(mean: np.ndarray, std: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One channel's per-point training statistics (H, W) pooled over the points that have them (NaN: none,
    e.g. SST over land) and broadcast back to (H, W): the mean of the point means, and the total std (within the
    points and between them: sqrt(mean(std^2 + (mean - pooled mean)^2)))."""
    m = np.nanmean(mean)
    s = np.sqrt(np.nanmean(std.astype(np.float64) ** 2 + (mean - m) ** 2))
    return np.full_like(mean, m), np.full_like(std, s)


class Sampler:
    """Builds the samples of a :class:`SampleSpec` on one grid (``lat``, ``lon``: 1-D, degrees)."""

    def __init__(self, spec: SampleSpec, lat: np.ndarray, lon: np.ndarray, *, oracle: bool = False):
        self.spec, self.lat, self.lon, self.oracle = spec, np.asarray(lat), np.asarray(lon), oracle
        self._location = self._location_features() if spec.location_features else None

    def _location_features(self) -> np.ndarray:
        lat = np.deg2rad(self.lat)[:, None] * np.ones((1, self.lon.size))
        lon = np.deg2rad(self.lon)[None, :] * np.ones((self.lat.size, 1))
        return np.stack([np.sin(lat), np.cos(lat) * np.sin(lon), np.cos(lat) * np.cos(lon)]).astype(np.float32)

    def features(self, day: xr.Dataset) -> np.ndarray:
        """(F, H, W) float32 of one init date: location features, the land channel (:meth:`land`), then season
        features of its init time."""
        shape = (self.lat.size, self.lon.size)
        parts = [self._location] if self._location is not None else []
        if self.spec.land_feature:
            parts.append(self.land(day)[None])
        if self.spec.season_features:
            ang = 2 * np.pi * pd.Timestamp(day[schema.INIT_TIME].values).day_of_year / 365.25
            parts.append(np.stack([np.full(shape, np.sin(ang), np.float32), np.full(shape, np.cos(ang), np.float32)]))
        return np.concatenate(parts) if parts else np.zeros((0, *shape), np.float32)

    def nbytes(self, n_members: int) -> int:
        """Bytes of one sample (every field is float32 of the grid's shape)."""
        oracle = len(contract.oracle_parameters(self.spec.resolved_target)) if self.oracle else 0
        planes = (
            self.spec.n_channels + 3 + oracle + (n_members * self.spec.n_member_variables if self.spec.members else 0)
        )
        return 4 * planes * self.lat.size * self.lon.size

    def sample(self, day: xr.Dataset) -> Sample:
        """The sample of one init date of canonical data (member fields, ``ens_mean_*``/``ens_std_*``,
        optionally truth and oracle; see the module docstring); ``y`` is NaN without truth."""
        spec = self.spec
        fields, members = [], []
        for i in spec.inputs():
            fields += [
                spec.select(day[contract.ens_mean(i.variable)], i.level),
                spec.select(day[contract.ens_std(i.variable)], i.level),
            ]
            if spec.members:
                members.append(spec.select(day[i.variable], i.level))  # (M, H, W)
        truth = contract.truth_name(spec.target)
        derived = self.derived_members(day)  # (M, H, W) target units, or None for a variable target
        if members and derived is not None:
            members.append(derived.astype(np.float32))
        target = self.target_statistics(day, derived)  # m, s, [dry] (H, W) target units
        fields += list(target.values())[: len(spec.target_fields)]  # a derived target's own channels
        out: Sample = {
            "fields": np.stack(fields).astype(np.float32),  # (2V [+ T], H, W) physical units
            "features": self.features(day),  # (F, H, W)
            "m": target["m"],
            "s": target["s"],  # (H, W) raw units
        }
        out["y"] = (spec.select(day[truth]) if truth in day else np.full(out["m"].shape, np.nan)).astype(np.float32)
        if members:
            out["members"] = np.stack(members, axis=1).astype(np.float32)  # (M, V', H, W): n_member_variables
        if self.oracle:
            names = contract.oracle_parameters(spec.resolved_target)
            for param in laws.get(spec.resolved_target.family).parameters:  # oracle_mean, ...; oracle_shape, ...
                out[f"oracle_{param.oracle_stem}"] = spec.select(day[names[param.name]]).astype(np.float32)  # (H, W)
        return out

    def land(self, day: xr.Dataset) -> np.ndarray:
        """(H, W) float32: 1 where the land source (SST) has no ensemble mean at the spec's lead, else 0."""
        return np.isnan(self.spec.select(day[contract.ens_mean(self.spec.land_source)])).astype(np.float32)

    def derived_members(self, day: xr.Dataset) -> np.ndarray | None:
        """A derived target's members (M, H, W) float64 in its units, from the fields it is derived from; None
        for a variable target."""
        spec, tg = self.spec, self.spec.resolved_target
        if not tg.derived:
            return None
        return tg.members(lambda v, offset_h: spec.select(day[v], offset_h=offset_h).astype(np.float64))

    def target_statistics(self, day: xr.Dataset, derived: np.ndarray | None = None) -> Sample:
        """``m``, ``s`` (H, W) float32: the target's ensemble mean and population std (a variable target's
        from the store's ``ens_mean_*``/``ens_std_*``, a derived one's over its members: ``derived``, else
        :meth:`derived_members`), and ``dry`` (H, W), the fraction of members below ``dry_below``, for a
        target that has one."""
        spec, tg = self.spec, self.spec.resolved_target
        if not tg.derived:
            return {
                "m": spec.select(day[contract.ens_mean(tg.variable)]).astype(np.float32),
                "s": spec.select(day[contract.ens_std(tg.variable)]).astype(np.float32),
            }
        x = derived if derived is not None else self.derived_members(day)  # (M, H, W)
        assert x is not None
        out = {"m": x.mean(axis=0).astype(np.float32), "s": x.std(axis=0).astype(np.float32)}
        if tg.dry_below is not None:
            out["dry"] = (x < tg.dry_below).mean(axis=0).astype(np.float32)
        return out
