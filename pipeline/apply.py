"""A trained post-processor applied to an ensemble held in memory: xarray in, its predictive law out, no file
written (``postcast forecast`` is the same computation on raw files, writing CF files per init time).

:func:`apply_model` takes a model from :func:`postcast.models.module.load_checkpoint` and an
:class:`xarray.Dataset` in the store's layout (:mod:`postcast.datasets.schema`: member fields named
``t``, ``z``, ... with dims (init_time, member, step[, level], latitude, longitude), in the store's units, on
the checkpoint's grid; a store opened with :func:`postcast.datasets.contract.open_store` is one). Missing
ensemble statistics (``ens_mean_*``, ``ens_std_*``) are computed from the members as ingest computes them.
The answer has, per init time and grid point, the law's parameters, its mean and std in closed form, its
quantiles and its probabilities of exceeding thresholds, all by the law of :mod:`postcast.datasets.laws`
and under the names the forecast files use (``<target>_mean``, ``<target>_<parameter>``, ...).
"""

from __future__ import annotations

import numpy as np
import torch
import xarray as xr

from postcast.datasets import contract, laws, schema
from postcast.datasets.core.errors import ConfigError, MissingInputError
from postcast.datasets.loaders.datamodule import to_tensors
from postcast.datasets.sample import Sampler
from postcast.datasets.statistics import ensemble_statistics
from postcast.models.module import PostProcessor
from postcast.pipeline.products.archive import DEFAULT_QUANTILES

Params = dict[str, np.ndarray]  # a law's parameters by name: (T, H, W) each (a vector parameter: (K, T, H, W))


def apply_model(
    model: PostProcessor,
    ensemble: xr.Dataset,
    *,
    quantiles: tuple[float, ...] = DEFAULT_QUANTILES,
    thresholds: tuple[float, ...] = (),
) -> xr.Dataset:
    """``model``'s predictive law on every init time of ``ensemble`` (see the module docstring): a dataset
    over (init_time, latitude, longitude) with ``<target>_<parameter>``, ``<target>_mean``, ``<target>_std``,
    ``<target>_quantile`` (quantile, ...) at ``quantiles`` and ``<target>_exceedance_probability``
    (threshold, ...) above ``thresholds`` (target units)."""
    _check_levels(quantiles)
    day = _with_statistics(ensemble)
    sampler = Sampler(model.spec, day[schema.LAT].values, day[schema.LON].values)
    _check_grid(model, sampler)
    family, params = predict(model, sampler, day)
    return _answer(sampler, day[schema.INIT_TIME].values, family, params, quantiles, thresholds)


def predict(model: PostProcessor, sampler: Sampler, ensemble: xr.Dataset) -> tuple[str, Params]:
    """(family, parameters) of ``model``'s law on each init time of ``ensemble`` (with its statistics): float64,
    each parameter (T, H, W), a vector parameter (K, T, H, W)."""
    per_date: list[Params] = []
    family = ""
    with torch.no_grad():
        for k in range(ensemble.sizes[schema.INIT_TIME]):
            sample = to_tensors(sampler.sample(ensemble.isel({schema.INIT_TIME: k})))
            dist = model.predictive({name: v[None] for name, v in sample.items()})  # parameters (1, H, W)
            family = dist.name
            per_date.append(dist.numpy_params())  # (1, H, W) each, a vector parameter (K, 1, H, W)
    return family, {name: np.concatenate([d[name] for d in per_date], axis=-3) for name in per_date[0]}


def _check_levels(quantiles: tuple[float, ...]) -> None:
    bad = [q for q in quantiles if not 0.0 < q < 1.0]
    if bad:
        msg = f"quantiles {bad}: each must be strictly between 0 and 1"
        raise ConfigError(msg)


def _with_statistics(ensemble: xr.Dataset) -> xr.Dataset:
    """``ensemble`` with an init_time axis and the ensemble mean and std of every member field it lacks."""
    if schema.INIT_TIME not in ensemble.dims:
        if schema.INIT_TIME not in ensemble.coords:
            msg = f"the ensemble has no {schema.INIT_TIME} coordinate: give it the init times of its forecasts"
            raise MissingInputError(msg)
        ensemble = ensemble.expand_dims(schema.INIT_TIME)
    if not ensemble.sizes[schema.INIT_TIME]:
        msg = "the ensemble has no init time: select at least one date"
        raise MissingInputError(msg)
    members = [n for n, v in ensemble.data_vars.items() if schema.MEMBER in v.dims]
    lacking = [n for n in members if contract.ens_mean(str(n)) not in ensemble]
    if not lacking:
        return ensemble
    return xr.merge([ensemble, ensemble_statistics(ensemble[lacking].load())])  # members read once, in memory


def _check_grid(model: PostProcessor, sampler: Sampler) -> None:
    """The ensemble is on the grid the model was trained on (its per-point statistics are that grid's)."""
    want = tuple(model.norm_mean.shape[-2:])  # (H, W) of the checkpoint
    have = (sampler.lat.size, sampler.lon.size)
    if have != want:
        msg = (
            f"the ensemble's grid is {have[0]} x {have[1]} points, the model's {want[0]} x {want[1]}: regrid the "
            "ensemble to the checkpoint's grid first, or use `postcast forecast`, which regrids its input"
        )
        raise ConfigError(msg)


def _answer(
    sampler: Sampler,
    inits: np.ndarray,
    family: str,
    params: Params,
    quantiles: tuple[float, ...],
    thresholds: tuple[float, ...],
) -> xr.Dataset:
    """The law's parameters, moments, quantiles and exceedance probabilities as a dataset (float64)."""
    law, tg = laws.get(family), sampler.spec.resolved_target
    mean, std = law.moments(params)  # (T, H, W) target units
    grid = (schema.INIT_TIME, schema.LAT, schema.LON)
    out = {f"{tg.name}_{name}": (("coefficient", *grid) if v.ndim == 4 else grid, v) for name, v in params.items()}
    out[f"{tg.name}_mean"], out[f"{tg.name}_std"] = (grid, mean), (grid, std)
    quant = [law.quantile(params, q) for q in quantiles]
    exceed = [law.sf(params, t) for t in thresholds]
    empty = np.zeros((0, *mean.shape))
    out[f"{tg.name}_quantile"] = (("quantile", *grid), np.stack(quant) if quant else empty)
    out[f"{tg.name}_exceedance_probability"] = (("threshold", *grid), np.stack(exceed) if exceed else empty)
    coords = {
        schema.INIT_TIME: inits,
        schema.LAT: sampler.lat,
        schema.LON: sampler.lon,
        "quantile": np.asarray(quantiles, dtype=np.float64),
        "threshold": np.asarray(thresholds, dtype=np.float64),
    }
    attrs = {"predictive_distribution": family, "target": tg.name, "units": tg.units, "step_h": sampler.spec.step_h}
    return xr.Dataset(out, coords=coords, attrs=attrs)
