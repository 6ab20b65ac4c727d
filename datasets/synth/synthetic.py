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

The code lives in sibling modules by concern, re-exported here (the public module):
:mod:`~postcast.datasets.synth.config` (the configuration), :mod:`~postcast.datasets.synth.waves` (random
fields), :mod:`~postcast.datasets.synth.weather` (geography, latent weather, member fields and their
generators), :mod:`~postcast.datasets.synth.truth` (truth and oracle: :class:`World`) and
:mod:`~postcast.datasets.synth.lazy` (the lazy datasets).
"""

from postcast.datasets.synth.config import SynthConfig
from postcast.datasets.synth.lazy import FORMAT_VERSION, forecast_dataset, synthetic_attrs, truth_dataset
from postcast.datasets.synth.truth import World, world
from postcast.datasets.synth.waves import GaussianWaves, static_fields
from postcast.datasets.synth.weather import (
    GENERATORS,
    GEOGRAPHY_SEED,
    LEAD_GROWTH,
    UNDERDISPERSION,
    Generator,
    Weather,
    generates,
)

__all__ = [
    "FORMAT_VERSION",
    "GENERATORS",
    "GEOGRAPHY_SEED",
    "LEAD_GROWTH",
    "UNDERDISPERSION",
    "GaussianWaves",
    "Generator",
    "SynthConfig",
    "Weather",
    "World",
    "forecast_dataset",
    "generates",
    "static_fields",
    "synthetic_attrs",
    "truth_dataset",
    "world",
]
