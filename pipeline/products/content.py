"""The content of one forecast file (:func:`products`): the CF-1.8 dataset of one predictive law (:class:`Law`:
its family and parameters, evaluated by the writer: mean, std, quantiles and exceedance probabilities), the
contract's content as :mod:`postcast.pipeline.products.archive` is its layout and reading.

No torch here: the service imports this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from postcast.datasets import laws, schema
from postcast.datasets.core.version import __version__

GAUSSIAN = laws.Gaussian.name
# where a file's exceedance thresholds came from (its attribute threshold_source): the target's own
# (datasets/schema.py), the training climate's quantiles the checkpoint carries, or `forecast --thresholds`
THRESHOLD_SOURCES = (OWN, CLIMATE, GIVEN) = ("target", "training_climate", "given")
# A file carries the parameters of its predictive family (datasets/laws.py: names, long names, units) as
# variables <target>_<parameter>, shape (lat, lon) (Bernstein's coefficients (coefficient, lat, lon)); a
# Gaussian file's parameters are its mean and std.


@dataclass(frozen=True)
class Law:
    """A forecast of any predictive family, evaluated by the writer (no torch here): ``params`` by
    name, each (lat, lon) or (K, lat, lon); ``quantiles`` (Q, lat, lon) at the levels and ``exceedance``
    (T, lat, lon) at the thresholds; ``moments``: how the mean and std were computed."""

    family: str
    params: dict[str, np.ndarray]
    quantiles: np.ndarray
    exceedance: np.ndarray
    moments: str

    @classmethod
    def of(
        cls, family: str, params: dict[str, np.ndarray], quantiles: tuple[float, ...], thresholds: tuple[float, ...]
    ) -> Law:
        """The forecast of the ``family`` law with ``params`` ((lat, lon) each, Bernstein's coef (K, lat, lon)):
        its quantiles and exceedance probabilities by the law itself (:mod:`postcast.datasets.laws`), float64."""
        law = laws.get(family)
        shape = next(iter(params.values())).shape[-2:]  # (lat, lon)
        quant = [law.quantile(params, q) for q in quantiles]
        exceed = [law.sf(params, t) for t in thresholds]
        return cls(
            family,
            params,
            np.stack(quant) if quant else np.zeros((0, *shape)),  # (Q, lat, lon)
            np.stack(exceed) if exceed else np.zeros((0, *shape)),
            law.moments_from,
        )  # (T, lat, lon)


def _parameter_variables(
    law: Law, target: str, units: str
) -> dict[str, tuple[tuple[str, ...], np.ndarray, dict[str, Any]]]:
    """``<target>_<parameter>`` of a non-Gaussian law, with its long name and units (datasets/laws.py)."""
    out = {}
    for name, values in law.params.items():
        param = laws.get(law.family).parameter(name)
        what, unit = param.long_name, param.units_of(units)
        dims = (("coefficient",) if values.ndim == 3 else ()) + ("forecast_reference_time", schema.LAT, schema.LON)
        out[f"{target}_{name}"] = (
            dims,
            np.expand_dims(values, -3).astype(np.float64),  # exact: the law's source
            {"long_name": f"{target} {law.family} parameter {name}: {what}", "units": unit},
        )
    return out


def products(
    mu: np.ndarray,
    sigma: np.ndarray,
    *,
    target: schema.Target,
    init: pd.Timestamp,
    step_h: int,
    lat: np.ndarray,
    lon: np.ndarray,
    quantiles: tuple[float, ...],
    thresholds: tuple[float, ...],
    attrs: dict[str, Any],
    law: Law | None = None,
    members: np.ndarray | None = None,
) -> xr.Dataset:
    """The CF dataset of one forecast: mean and std ``mu``, ``sigma`` ((lat, lon), target units), ``law``
    (None: the Gaussian N(mu, sigma^2)) and the raw ensemble's ``members`` of the target ((M, lat, lon),
    target units; None: not stored), shown beside the law."""
    law = law or Law.of(GAUSSIAN, {"mu": mu, "sigma": sigma}, quantiles, thresholds)
    ds = xr.Dataset(
        _law_variables(law, mu, sigma, target),
        coords={**_times(init, step_h), **_axes(target, lat, lon, quantiles, thresholds)},
        attrs={**_global_attrs(law, target.name), **attrs},
    )
    if members is not None:
        ds = _with_members(ds, members, target.name, target.units)
    return _cf_encoded(ds, target)


def _law_variables(law: Law, mu: np.ndarray, sigma: np.ndarray, tg: schema.Target) -> dict[str, Any]:
    """The data variables of ``law`` of ``tg``: its mean and std (lat, lon), its parameters (a Gaussian's are
    the mean and std), its quantiles and exceedance probabilities, each on a forecast_reference_time axis."""
    t_name, dims = tg.name, ("forecast_reference_time", schema.LAT, schema.LON)
    std_name = {"standard_name": tg.standard_name} if tg.standard_name else {}  # ws10: wind_speed
    how = f"{law.family} law, from {law.moments}"
    return {
        f"{t_name}_mean": (
            dims,
            mu[None].astype(np.float32),
            {**std_name, "long_name": f"{t_name} predictive mean", "units": tg.units, "comment": how},
        ),
        f"{t_name}_std": (
            dims,
            sigma[None].astype(np.float32),
            {"long_name": f"{t_name} predictive standard deviation", "units": tg.units, "comment": how},
        ),
        **({} if law.family == GAUSSIAN else _parameter_variables(law, t_name, tg.units)),
        f"{t_name}_quantile": (
            ("quantile", *dims),
            law.quantiles[:, None].astype(np.float32),  # (Q, 1, lat, lon)
            {**std_name, "long_name": f"{t_name} predictive quantiles", "units": tg.units},
        ),
        f"{t_name}_exceedance_probability": (
            ("threshold", *dims),
            law.exceedance[:, None].astype(np.float32),  # (T, 1, lat, lon)
            {
                "long_name": f"probability that {t_name} exceeds the threshold",
                "units": "1",
                "valid_min": np.float32(0.0),
                "valid_max": np.float32(1.0),
            },
        ),
    }


def _times(init: pd.Timestamp, step_h: int) -> dict[str, Any]:
    """The CF time coordinates: the forecast's start, its valid time and the lead between them."""
    return {
        "forecast_reference_time": (
            "forecast_reference_time",
            [init.to_datetime64()],
            {"standard_name": "forecast_reference_time"},
        ),
        "time": (
            "forecast_reference_time",
            [(init + pd.Timedelta(hours=step_h)).to_datetime64()],
            {"standard_name": "time", "long_name": "valid time"},
        ),
        "forecast_period": ((), np.float64(step_h), {"standard_name": "forecast_period", "units": "hours"}),
    }


def _axes(
    tg: schema.Target, lat: np.ndarray, lon: np.ndarray, levels: tuple[float, ...], thresholds: tuple[float, ...]
) -> dict[str, Any]:
    """The CF axes: the quantiles' probability levels, the thresholds (target units), latitude and longitude."""
    return {
        "quantile": (
            "quantile",
            np.asarray(levels, dtype=np.float64),
            {"long_name": "probability level of the quantile", "units": "1"},
        ),
        "threshold": (
            "threshold",
            np.asarray(thresholds, dtype=np.float64),
            {"long_name": f"{tg.name} threshold", "units": tg.units},
        ),
        schema.LAT: (schema.LAT, lat, {"standard_name": "latitude", "units": "degrees_north", "axis": "Y"}),
        schema.LON: (schema.LON, lon, {"standard_name": "longitude", "units": "degrees_east", "axis": "X"}),
    }


def _global_attrs(law: Law, t_name: str) -> dict[str, Any]:
    """The file's CF global attributes and its law: the family and which variable holds each parameter."""
    names = (
        {"mu": f"{t_name}_mean", "sigma": f"{t_name}_std"}
        if law.family == GAUSSIAN
        else {p: f"{t_name}_{p}" for p in law.params}
    )
    return {
        "Conventions": "CF-1.8",
        "title": f"postcast calibrated forecast of {t_name}",
        "institution": "postcast",
        "source": f"postcast {__version__}",
        "history": f"{pd.Timestamp.now(tz='UTC'):%Y-%m-%dT%H:%M:%SZ} postcast forecast",
        "predictive_distribution": law.family,
        "predictive_parameters": " ".join(f"{p}: {v}" for p, v in names.items()),
    }


def _cf_encoded(ds: xr.Dataset, tg: schema.Target) -> xr.Dataset:
    """``ds`` with each variable's auxiliary coordinates (and a pressure level's), no fill value on the
    coordinates (CF 2.5.1) and the times encoded as hours since 1970."""
    if tg.level is not None:
        ds = ds.assign_coords(
            pressure=((), np.float64(tg.level), {"standard_name": "air_pressure", "units": "hPa", "positive": "down"})
        )
    for name in ds.data_vars:
        ds[name].attrs["coordinates"] = "time forecast_period" + (" pressure" if tg.level is not None else "")
    for name in ds.coords:
        ds[name].encoding["_FillValue"] = None  # CF 2.5.1: no fill values on coordinates
    for name in ("forecast_reference_time", "time"):
        ds[name].encoding.update(
            units="hours since 1970-01-01 00:00:00", calendar="proleptic_gregorian", dtype="float64"
        )
    return ds


def _with_members(ds: xr.Dataset, members: np.ndarray, t_name: str, units: str) -> xr.Dataset:
    """``ds`` with the raw members (M, lat, lon) as ``<target>_raw_member`` on a CF ``realization`` axis."""
    raw = (
        ("realization", "forecast_reference_time", schema.LAT, schema.LON),
        members[:, None].astype(np.float32),
        {"long_name": f"{t_name} of each raw ensemble member (before post-processing)", "units": units},
    )
    realization = (
        "realization",
        np.arange(members.shape[0], dtype=np.int32),
        {"standard_name": "realization", "units": "1"},
    )
    return ds.assign({f"{t_name}_raw_member": raw}).assign_coords(realization=realization)
