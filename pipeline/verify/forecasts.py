"""Gathering what evaluation scores, for one target, lead and split: the truth, the raw members, the
Gaussian forecasts of every entry (:func:`verification_dataset`, dims ``forecast, init_time, latitude,
longitude``), checkpoints of another predictive family (:class:`FamilyForecast`), and the predictions of
a checkpoint over the store (:func:`predict_checkpoint`), with a checkpoint that does not fit the store
named before anything is predicted (:func:`check_fits`). Scoring is :mod:`postcast.pipeline.verify.evaluate`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pandas as pd
import torch
import xarray as xr

from postcast.datasets import contract, laws, schema
from postcast.datasets.core.errors import BadInputError, MissingInputError
from postcast.datasets.loaders.datamodule import DataConfig, StoreDataset
from postcast.datasets.sample import SampleSpec
from postcast.models import distributions
from postcast.models.hyperparameters import ModelMeta
from postcast.pipeline.checkpoints import OpenedCheckpoint, one_thread

log = logging.getLogger(__name__)

RAW, ORACLE, ENSEMBLE = "raw", "oracle", "raw_ensemble"
SIGMA_FLOOR = 1e-6  # (target units) the least Gaussian spread scored: N(mu, 1e-6^2)'s CRPS is |y - mu| to 1e-6


def step_field(ds: xr.Dataset, name: str, step_h: int, level: int | None) -> xr.DataArray:
    da = ds[name].sel({schema.STEP: pd.Timedelta(hours=step_h)})
    if schema.LEVEL in da.dims:
        da = da.sel({schema.LEVEL: level})
    return da


def target_members(ds: xr.Dataset, target: schema.Target, step_h: int) -> xr.DataArray:
    """The members (init_time, member, lat, lon) of ``target`` at the lead: a variable's, or a derived
    target's computed per member from its inputs (ws10 from u10/v10; tp24 from tp at the lead and 24 h before)."""
    tg = target
    if not tg.derived:
        return step_field(ds, tg.variable, step_h, tg.level)
    first = step_field(ds, tg.inputs[0][0], step_h + tg.inputs[0][1], None)
    values = tg.members(lambda v, off: np.asarray(step_field(ds, v, step_h + off, None).values, dtype=np.float64))
    return first.drop_vars(schema.STEP).copy(data=values).rename(target.name)


def baseline(target: schema.Target) -> str:
    """The forecast the others are measured against: the raw ensemble's Gaussian (mean, std) for a Gaussian
    target (ENS-10's convention), the members themselves (fair CRPS) for any other family's target."""
    return RAW if target.family == distributions.Gaussian.name else ENSEMBLE


def verification_dataset(
    store: xr.Dataset,
    target: schema.Target,
    split: str,
    step_h: int = schema.TARGET_STEP_H,
    dates: slice = slice(None),
) -> xr.Dataset:
    """Truth, raw members, the raw ensemble's Gaussian (its members' mean and population std) and a
    Gaussian oracle's of ``target`` on one split (``dates``: those positions of its dates only, read alone);
    another family's oracle parameters as ``oracle_<param>``."""
    tg = target
    truth = step_field(store, contract.truth_name(tg.name), step_h, tg.level)
    rows = contract.split_rows(store, split, target=tg, step_h=step_h)
    if not rows.size:
        msg = f"no init date with truth for {tg.name} at +{step_h} h in split {split!r}"
        raise MissingInputError(msg)
    rows = rows[dates]
    sub = store.isel({schema.INIT_TIME: rows})
    members = target_members(sub, target, step_h)
    if tg.derived:
        mu, sigma = [members.mean(schema.MEMBER)], [members.std(schema.MEMBER)]
    else:
        mu = [step_field(sub, contract.ens_mean(tg.variable), step_h, tg.level)]
        sigma = [step_field(sub, contract.ens_std(tg.variable), step_h, tg.level)]
    names = [RAW]
    oracle = {p: step_field(sub, n, step_h, tg.level) for p, n in contract.oracle_parameters(tg).items() if n in sub}
    if tg.family == distributions.Gaussian.name and oracle:
        mu.append(oracle["mu"])
        sigma.append(oracle["sigma"])
        names.append(ORACLE)
    drop = [c for c in (schema.STEP, schema.LEVEL, contract.SPLIT) if c in sub.coords]
    family_oracle = {} if tg.family == distributions.Gaussian.name else {f"oracle_{p}": v for p, v in oracle.items()}
    out = (
        xr.Dataset(
            {
                "truth": truth.isel({schema.INIT_TIME: rows}),
                "members": members,
                "mu": xr.concat([m.drop_vars(drop, errors="ignore") for m in mu], dim="forecast"),
                "sigma": xr.concat([s.drop_vars(drop, errors="ignore") for s in sigma], dim="forecast"),
                **family_oracle,
            }
        )
        .drop_vars(drop, errors="ignore")
        .assign_coords(forecast=names)
        .astype(np.float64)
        .compute()
    )
    out = out.transpose("forecast", schema.INIT_TIME, schema.MEMBER, schema.LAT, schema.LON)
    out["sigma"] = out["sigma"].clip(min=SIGMA_FLOOR)
    out.attrs.update(target=tg.name, step_h=step_h, split=split, units=tg.units)
    return out


def oracle_forecast(ver: xr.Dataset) -> dict[str, FamilyForecast]:
    """{"oracle": the oracle's law} for a target of another family than the Gaussian, from the parameters
    :func:`verification_dataset` carries; {} without them (a Gaussian oracle is among ``mu``/``sigma``)."""
    params = {str(k).removeprefix("oracle_"): ver[k] for k in ver.data_vars if str(k).startswith("oracle_")}
    if not params:
        return {}
    family = distributions.get(schema.target(ver.attrs["target"]).family)
    return {ORACLE: FamilyForecast(family(**{p: torch.from_numpy(v.values) for p, v in params.items()}))}


def check_shape(ver: xr.Dataset, name: str, shape: tuple[int, ...]) -> None:
    if shape != ver["truth"].shape:
        msg = f"forecast {name!r} has shape {shape}, the truth {ver['truth'].shape}: a checkpoint of another grid?"
        raise BadInputError(msg)


def add_forecast(ver: xr.Dataset, name: str, mu: np.ndarray, sigma: np.ndarray) -> xr.Dataset:
    """Append one Gaussian forecast (init_time, lat, lon) to a verification dataset, its sigma floored
    like the raw ensemble's (a model's sigma = s exp(b) underflows to 0 in float32 for b < -104)."""
    check_shape(ver, name, mu.shape)
    sigma = np.maximum(sigma, SIGMA_FLOOR)
    new = xr.Dataset({"mu": (ver["truth"].dims, mu), "sigma": (ver["truth"].dims, sigma)}).expand_dims(forecast=[name])
    merged = xr.concat([ver[["mu", "sigma"]], new.assign_coords(ver["truth"].coords)], dim="forecast")
    merged = merged.transpose("forecast", *ver["truth"].dims)
    return ver.drop_vars(["mu", "sigma", "forecast"]).assign(mu=merged["mu"], sigma=merged["sigma"])


@dataclass(frozen=True)
class FamilyForecast:
    """A predictive distribution of :mod:`postcast.models.distributions` (parameters (T, lat, lon)) as
    numpy float64 in and out: the :class:`postcast.pipeline.verify.chunk.Predictive` of a checkpoint. Its
    CRPS is the family's closed form in torch; its cdf, survival function, quantiles and moments are the
    law's (:mod:`postcast.datasets.laws`) on the same parameters."""

    dist: distributions.Distribution

    @property
    def name(self) -> str:
        return self.dist.name

    @cached_property
    def law(self) -> laws.Family:
        return laws.get(self.name)

    @cached_property
    def params(self) -> laws.Params:
        """The parameters as the law reads them: (T, lat, lon) each, Bernstein's coef (K, T, lat, lon)."""
        return self.dist.numpy_params()

    @property
    def shape(self) -> tuple[int, ...]:
        """The forecast's shape S (T, lat, lon), that of its median."""
        return self.quantile(0.5).shape

    def _at(self, fn: Callable[[torch.Tensor], torch.Tensor], x: np.ndarray | float) -> np.ndarray:
        with torch.no_grad():
            return fn(torch.as_tensor(np.asarray(x, dtype=np.float64))).double().numpy()

    def crps(self, y: np.ndarray) -> np.ndarray:
        return self._at(self.dist.crps, y)

    def twcrps_above(self, t: np.ndarray, y: np.ndarray) -> np.ndarray | None:
        """The twCRPS of weight 1{z >= t} (t broadcastable to S) at outcomes y (S) in closed form: the CRPS of
        :meth:`~postcast.models.distributions.Distribution.raised` at max(y, t) - max(t, 0); None for a family
        without one. A NaN threshold gives NaN."""
        floor = np.maximum(np.broadcast_to(np.asarray(t, dtype=np.float64), y.shape), 0.0)  # (S)
        law = self.dist.raised(torch.as_tensor(floor))
        if law is None:
            return None
        with torch.no_grad():
            return law.crps(torch.as_tensor(np.maximum(y, t) - floor)).double().numpy()

    def cdf(self, x: np.ndarray) -> np.ndarray:
        return self.law.cdf(self.params, x)

    def cdf_left(self, x: np.ndarray) -> np.ndarray:
        return self.law.cdf_left(self.params, x)

    def sf(self, x: np.ndarray) -> np.ndarray:
        return self.law.sf(self.params, x)

    def quantile(self, tau: float) -> np.ndarray:
        return self.law.quantile(self.params, tau)

    def quantile_where(self, tau: float, mask: np.ndarray) -> np.ndarray:
        """Q(tau) of the distributions where ``mask`` (S, bool) holds: (N,)."""
        return self.law.quantile({k: v[..., mask] for k, v in self.params.items()}, tau)

    def moments(self) -> tuple[np.ndarray, np.ndarray]:
        """(mean, std) (T, lat, lon) in closed form."""
        return self.law.moments(self.params)


def check_finite(name: str, ckpt: OpenedCheckpoint, dist: distributions.Distribution, inputs: np.ndarray) -> None:
    """BadInputError (65) naming the parameters a checkpoint predicts NaN or infinite where its inputs, the raw
    ensemble's mean and spread, are finite (``inputs``: (T, lat, lon) bool), and its non-finite weights (a
    diverged training): the scores of such a forecast are not numbers (its NaN probabilities were binned,
    exit 70)."""
    bad = {}
    for key, value in dist.params.items():  # (T, lat, lon) each, a vector parameter (T, lat, lon, K)
        nonfinite = ~torch.isfinite(value).reshape(*inputs.shape, -1).all(-1).numpy()
        if (n := int((nonfinite & inputs).sum())) > 0:
            bad[key] = n
    if not bad:
        return
    weights = [k for k, w in ckpt.model.state_dict().items() if w.is_floating_point() and not torch.isfinite(w).all()]
    shown = ", ".join(f"{k} at {n}" for k, n in bad.items())
    held = f"non-finite weights in {', '.join(weights[:5])}" if weights else "finite weights (an overflow?)"
    msg = (
        f"{name} ({ckpt.path}): the checkpoint predicts non-finite values ({shown} of {int(inputs.sum())} points "
        f"where the raw ensemble is finite); it holds {held}: retrain it, or evaluate another checkpoint"
    )
    raise BadInputError(msg)


@torch.no_grad()
def predict_opened(
    ckpt: OpenedCheckpoint,
    store_path: str,
    store: xr.Dataset,
    split: str,
    batch_size: int = 4,
    dates: slice = slice(None),
) -> tuple[np.ndarray, distributions.Distribution]:
    """(init_times, predictive distribution (T, lat, lon) in float64) of an opened checkpoint on one split of the
    store at ``store_path`` (``store``: it opened; the checkpoint checked against it by :func:`check_fits`), any
    family: samples as its sample spec declares, in physical units (the model normalises them with the statistics
    it carries). ``dates``: those positions of the split's samples only (batches of ``batch_size`` from the
    first)."""
    data = StoreDataset(DataConfig(store=store_path, sample=ckpt.spec), split, store=store)
    positions = range(len(data))[dates]
    if not positions:
        msg = f"{ckpt.path}: no sample of split {split!r} at positions {dates.start}..{dates.stop}"
        raise MissingInputError(msg)
    parts = []
    for start in range(0, len(positions), batch_size):
        items = [data[i] for i in positions[start : start + batch_size]]
        batch = {k: torch.stack([it[k] for it in items]) for k in items[0]}
        with one_thread():  # the same bits wherever the batch is predicted
            parts.append(ckpt.model.predictive(batch))  # parameters (B, lat, lon)
    family = type(parts[0])
    dist = family(**{k: torch.cat([p.params[k] for p in parts]).double() for k in parts[0].params})
    times = store[schema.INIT_TIME].values[np.asarray(data.indices)[positions.start : positions.stop]]
    return times, dist


def check_fits(path: str, meta: ModelMeta, spec: SampleSpec, store: xr.Dataset) -> None:
    """BadInputError naming what differs when a checkpoint was trained on another grid, region or ensemble
    size than the store's, or reads variables the store lacks."""
    grid = (store.sizes[schema.LAT], store.sizes[schema.LON])
    area = schema.Grid.from_coords(store[schema.LAT].values, store[schema.LON].values, regional=True).area
    trained = meta.grid_area
    problems = [
        *([f"grid {meta.grid} (lat x lon), the store {grid}"] if meta.grid != grid else []),
        *([f"area {trained}, the store {area}"] if trained != area else []),
        *(
            [f"inputs {missing}, which the store lacks"]
            if (missing := [n for n in spec.store_variables() if n not in store])
            else []
        ),
        *(
            [f"{meta.n_members} members, the store {store.sizes[schema.MEMBER]}"]
            if spec.members and meta.n_members != store.sizes[schema.MEMBER]
            else []
        ),
    ]
    if problems:
        msg = (
            f"{path}: checkpoint does not fit the store: trained with {'; '.join(problems)}; evaluate it on a "
            "store like the one it was trained on"
        )
        raise BadInputError(msg)


def predict_checkpoint(
    path: str, store_path: str, split: str, batch_size: int = 4
) -> tuple[schema.Target, np.ndarray, np.ndarray, np.ndarray]:
    """(target, init_times, mu, sigma) of a Gaussian checkpoint on one split (its own lead)."""
    ckpt, store = OpenedCheckpoint.open(path), contract.open_store(store_path)
    check_fits(path, ckpt.model.meta, ckpt.spec, store)
    times, dist = predict_opened(ckpt, store_path, store, split, batch_size)
    if not isinstance(dist, distributions.Gaussian):
        msg = f"{path} predicts a {dist.name!r} distribution, not (mu, sigma): score it with postcast evaluate"
        raise BadInputError(msg)
    return ckpt.spec.resolved_target, times, dist.mu.numpy(), dist.sigma.numpy()
