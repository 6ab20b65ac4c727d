"""The skill benchmark's operational reference for tp24 (benchmarks/emos_standard.py): Scheuerer and Hamill's
censored-shifted-gamma CRPS, written out in numpy there, against numerical integration of its distribution
function and against scoringrules; and its per-point fit, which must reach at least the training CRPS of the law
that made the data."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import scoringrules as sr
import xarray as xr
from scipy import integrate, special, stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # the benchmark's own module

import emos_standard

from postcast.datasets.loaders.datamodule import DataConfig, StoreDataset
from postcast.datasets.sample import SampleSpec


def crps_by_integration(k: float, theta: float, shift: float, y: float) -> float:
    """int_0^inf (F(x) - 1{x >= y})^2 dx with F(x) = P_k((x + shift) / theta), split at y."""

    def cdf(x: float) -> float:
        return float(special.gammainc(k, (x + shift) / theta))

    below = integrate.quad(lambda x: cdf(x) ** 2, 0.0, y, epsabs=1e-13, limit=200)[0] if y > 0 else 0.0
    above = integrate.quad(lambda x: (1.0 - cdf(x)) ** 2, y, np.inf, epsabs=1e-13, limit=200)[0]
    return below + above


def test_the_references_csgd_crps_is_the_integral_of_its_distribution_function():
    cases = [(0.5, 2.0, 0.3, 0.0), (0.5, 2.0, 0.3, 1.7), (3.0, 0.7, 1.5, 0.0), (3.0, 0.7, 1.5, 4.2)]
    cases.append((12.0, 0.2, 0.1, 2.0))
    k, theta, shift, y = (np.array(c) for c in zip(*cases, strict=True))
    ours = emos_standard.crps_csgd(k, theta, shift, y)
    expected = [crps_by_integration(*c) for c in cases]
    np.testing.assert_allclose(ours, expected, rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(ours, sr.crps_csg0(y, k, scale=theta, shift=shift), rtol=1e-8)


@pytest.mark.system  # scipy's fit: 15 s on 2 cores
def test_the_scheuerer_hamill_fit_reaches_the_law_that_made_the_data():
    """Dates drawn from Scheuerer and Hamill's law at known coefficients: the fitted point's training CRPS is at
    most that of the true coefficients (with their shift held at the climatological one the fit uses)."""
    g = np.random.default_rng(3)
    n, truth = 200, np.array([-0.5, 1.2, 0.4, 0.8, 0.6])
    m = g.gamma(0.8, 3.0, n)
    s = m * g.uniform(0.3, 1.0, n) + 0.05
    k, theta, shift = emos_standard.scheuerer_hamill(truth, m, s)
    y = np.maximum(0.0, g.gamma(k, theta) - shift)
    w = np.ones(n)
    x = emos_standard.fit_point(m, s, y, w, "csg")
    fitted = emos_standard.reference_crps(x, m, s, y, "csg").mean()
    at_truth = emos_standard.reference_crps(np.append(truth[:4], x[4]), m, s, y, "csg").mean()
    assert np.isfinite(fitted) and fitted <= at_truth + 1e-9
    assert x[4] >= 0.0


def tnormal_crps_by_integration(mu: float, sigma: float, y: float) -> float:
    """int_0^inf (F(x) - 1{x >= y})^2 dx for the normal (mu, sigma) truncated to [0, inf), F from scipy's
    truncnorm (which keeps the far tail in log space), split at y and at the law's 1 - 1e-13 quantile."""
    a = -mu / sigma
    law = stats.truncnorm(a, np.inf, loc=mu, scale=sigma)
    top = max(float(law.ppf(1.0 - 1e-13)), y)
    below = integrate.quad(lambda x: law.cdf(x) ** 2, 0.0, y, epsabs=1e-14, limit=400)[0] if y > 0 else 0.0
    above = integrate.quad(lambda x: law.sf(x) ** 2, y, top, epsabs=1e-14, limit=400)[0]
    return below + above


def test_the_references_truncated_normal_crps_holds_far_in_the_lower_tail():
    """Where mu / sigma is far below 0 (calm points of the ws10 world, where the fits go: mu -800 m/s, sigma 9) the
    law is nearly exponential and Phi(mu / sigma)^2 underflows; the closed form must still be the integral.
    It was not: 0.045 off at mu / sigma = -7.8, NaN below about -27."""
    cases = [(1.0, 2.0, 0.5), (-3.0, 1.0, 0.2), (-7.8, 1.0, 0.05), (-12.0, 1.5, 0.3), (-61.2, 2.73, 0.02)]
    cases.append((-806.0, 9.35, 0.02))
    mu, sigma, y = (np.array(c) for c in zip(*cases, strict=True))
    expected = [tnormal_crps_by_integration(*c) for c in cases]
    np.testing.assert_allclose(emos_standard.crps_tnormal(mu, sigma, y), expected, rtol=1e-7, atol=1e-12)
    ordinary = slice(0, 2)  # where scoringrules is exact (tests/test_distributions.py)
    np.testing.assert_allclose(
        emos_standard.crps_tnormal(mu[ordinary], sigma[ordinary], y[ordinary]),
        sr.crps_tnormal(y[ordinary], mu[ordinary], sigma[ordinary], 0.0, np.inf),
        rtol=1e-9,
    )


@pytest.mark.system  # the derived store: about 20 s to build
def test_the_oracles_crps_is_read_at_the_samples_points_and_dates(derived_store):
    """The ceiling beside the standard form: the oracle's CRPS per point and date of a split, from the law's
    parameters in the store, lined up with the samples' (P, N) truths (the points row-major, the split's dates);
    scoringrules at the store's fields picked by date is the reference. Truths that are not the store's refuse."""
    cfg = DataConfig(store=str(derived_store), sample=SampleSpec(target="ws10", variables=("u10", "v10")))
    val = StoreDataset(cfg, "val")
    ds = xr.open_zarr(derived_store).sel(step=np.timedelta64(48, "h")).isel(init_time=val.indices)
    dates = [ds[v].transpose("latitude", "longitude", "init_time").values for v in ("truth_ws10", "oracle_mu_ws10")]
    y, mu = (a.reshape(-1, len(val.indices)).astype(np.float64) for a in dates)
    sigma = ds["oracle_sigma_ws10"].transpose("latitude", "longitude", "init_time").values.reshape(y.shape)
    crps = emos_standard._oracle(str(derived_store), val, y, "truncnormal")
    expected = sr.crps_tnormal(y, mu, sigma.astype(np.float64), 0.0, np.inf)
    exact = mu / sigma > -3.0  # where scoringrules is exact (tests/test_distributions.py)
    assert np.isfinite(crps).all() and exact.mean() > 0.9
    np.testing.assert_allclose(crps[exact], expected[exact], rtol=1e-9)
    with pytest.raises(SystemExit, match="not the store's"):
        emos_standard._oracle(str(derived_store), val, y[::-1], "truncnormal")
