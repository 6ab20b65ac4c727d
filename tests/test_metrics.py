"""CRPS kernels against float64 references and the peers (properscoring, scoringrules), with the
estimator each one computes pinned; the torch Gaussian CRPS loss and its gradients; latitude
weights against closed forms; postcast.pipeline.verify.scores imports without torch."""

import math
import subprocess
import sys

import numpy as np
import properscoring
import pytest
import scoringrules
import torch

from postcast.compression.metrics import field_errors
from postcast.datasets.core import geo
from postcast.models import distributions, kernels, losses
from postcast.pipeline.verify import scores
from postcast.pipeline.verify.chunk import GaussianForecast

ENGINES = ["numpy", "numba"]


@pytest.fixture(scope="module")
def ens():
    rng = np.random.default_rng(0)
    x = rng.gamma(2.0, 1.0, size=(500, 10)) * 3 - 2  # skewed members, (N, M)
    y = rng.normal(size=500) * 4
    return x, y


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("estimator", ["fair", "standard"])
def test_ensemble_crps_equals_float64_reference(ens, engine, estimator):
    x, y = ens
    got = scores.crps_ensemble(x, y, estimator=estimator, engine=engine)
    ref = scores.crps_ensemble_reference(x, y, estimator=estimator)
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)
    # member axis anywhere, float32 input, extra dims
    x3 = np.moveaxis(x.reshape(20, 25, 10), -1, 0).astype(np.float32)
    got3 = scores.crps_ensemble(x3, y.reshape(20, 25), axis=0, estimator=estimator, engine=engine)
    ref3 = scores.crps_ensemble_reference(x3, y.reshape(20, 25), axis=0, estimator=estimator)
    np.testing.assert_allclose(got3, ref3, rtol=1e-12, atol=1e-12)


def test_estimators_pinned_against_peers(ens):
    """properscoring computes the standard estimator; scoringrules 'fair' the fair one, 'nrg' the
    standard one. The two differ by M/(M-1) on the spread term."""
    x, y = ens
    std = scores.crps_ensemble(x, y, estimator="standard")
    fair = scores.crps_ensemble(x, y, estimator="fair")
    np.testing.assert_allclose(properscoring.crps_ensemble(y, x), std, rtol=1e-12)
    np.testing.assert_allclose(scoringrules.crps_ensemble(y, x, estimator="fair"), fair, rtol=1e-12)
    np.testing.assert_allclose(scoringrules.crps_ensemble(y, x, estimator="nrg"), std, rtol=1e-12)
    assert np.all(fair <= std + 1e-12) and not np.allclose(fair, std)


def test_fair_crps_of_a_large_sample_converges_to_the_gaussian_form():
    rng = np.random.default_rng(1)
    x = rng.normal(0.0, 2.0, size=(4000, 50))
    y = np.full(4000, 0.7)
    fair = scores.crps_ensemble(x, y, estimator="fair").mean()
    closed = float(scores.crps_gaussian(0.0, 2.0, 0.7))
    assert fair == pytest.approx(closed, rel=0.01)


def test_gaussian_crps_values():
    assert float(scores.crps_gaussian(0.0, 1.0, 0.0)) == pytest.approx((math.sqrt(2) - 1) / math.sqrt(math.pi))
    rng = np.random.default_rng(2)
    mu, sd, y = rng.normal(size=100), rng.uniform(0.1, 3, 100), rng.normal(size=100)
    got = scores.crps_gaussian(mu, sd, y)
    np.testing.assert_allclose(got, sd * scores.crps_gaussian(0.0, 1.0, (y - mu) / sd), rtol=1e-12)  # scaling
    np.testing.assert_allclose(got, properscoring.crps_gaussian(y, mu, sd), rtol=1e-10)
    assert np.all(got >= 0)
    assert float(scores.crps_gaussian(1.0, 1e-9, 3.5)) == pytest.approx(2.5, rel=1e-6)  # sigma -> 0: |y - mu|
    with pytest.raises(ValueError, match="sigma must be positive"):
        scores.crps_gaussian(0.0, 0.0, 1.0)


def test_bad_shapes_and_estimators():
    with pytest.raises(ValueError, match="do not match"):
        scores.crps_ensemble(np.zeros((5, 10)), np.zeros(4))
    with pytest.raises(ValueError, match="estimator"):
        scores.crps_ensemble(np.zeros((5, 10)), np.zeros(5), estimator="pwm")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="the fair CRPS needs at least 2"):
        scores.crps_ensemble(np.zeros((5, 1)), np.zeros(5))


def test_torch_crps_matches_numpy_and_gradients_check():
    rng = np.random.default_rng(3)
    mu, sd, y = rng.normal(size=64), rng.uniform(0.2, 2, 64), rng.normal(size=64)
    t = [torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (mu, sd, y)]
    np.testing.assert_allclose(kernels.crps_gaussian(*t).detach().numpy(), scores.crps_gaussian(mu, sd, y), rtol=1e-12)
    assert torch.autograd.gradcheck(kernels.crps_gaussian, tuple(t))
    # analytic gradients: dCRPS/dmu = -(2 Phi(z) - 1), dCRPS/dsigma = 2 phi(z) - 1/sqrt(pi)
    out = kernels.crps_gaussian(*t).sum()
    out.backward()
    z = (y - mu) / sd
    from scipy import stats

    np.testing.assert_allclose(t[0].grad.numpy(), -(2 * stats.norm.cdf(z) - 1), rtol=1e-10)
    np.testing.assert_allclose(t[1].grad.numpy(), 2 * stats.norm.pdf(z) - 1 / math.sqrt(math.pi), rtol=1e-10)


def test_gaussian_head_and_loss():
    m, s = torch.tensor([10.0, 20.0]), torch.tensor([2.0, 0.0])
    dist = losses.distribution_head([torch.zeros(2), torch.zeros(2)], m, s, "gaussian")
    assert isinstance(dist, distributions.Gaussian)
    assert torch.equal(dist.mu, m) and dist.sigma[0] == 2.0 and dist.sigma[1] == pytest.approx(1e-6)  # a=b=0: raw
    loss = losses.CRPSLoss()(distributions.Gaussian(m, torch.tensor([2.0, 1.0])), torch.tensor([11.0, float("nan")]))
    assert float(loss) == pytest.approx(float(scores.crps_gaussian(10.0, 2.0, 11.0)), rel=1e-6)
    with pytest.raises(ValueError, match="every target is NaN"):
        losses.CRPSLoss()(dist, torch.tensor([float("nan")] * 2))


# --- weighting, calibration, EFI/EECRPS, bootstrap ------------------------------------------------
def test_latitude_weights():
    lat = np.linspace(-90, 90, 361)
    for kind in ("area", "cos"):
        w = scores.latitude_weights(lat, kind)
        assert w.mean() == pytest.approx(1.0) and np.all(w >= 0)
        assert w[180] > w[90] > w[0]  # equator heaviest
    assert scores.latitude_weights(lat, "cos")[0] == pytest.approx(0.0, abs=1e-12)
    assert scores.latitude_weights(lat, "area")[0] > 0  # the 89.75-90 cap
    np.testing.assert_allclose(scores.latitude_weights(lat[::-1]), scores.latitude_weights(lat)[::-1])
    field = np.full((361, 720), 3.5)  # a constant field scores the constant
    w = scores.latitude_weights(lat)[:, None]
    assert float((field * w).mean()) == pytest.approx(3.5)


@pytest.mark.parametrize("step", [2.5, 10.0, 30.0])
def test_latitude_weights_equal_the_closed_form_band_areas(step):
    """Regular grid with pole rows: the area weight of row lat is the exact area of its band,
    2 cos(lat) sin(step/2) (= sin(lat + step/2) - sin(lat - step/2)), and 1 - cos(step/2) for each
    pole cap; a cell-centred grid (no pole rows) has area weights = cos weights."""
    lat = np.arange(-90.0, 90.0 + step / 2, step)
    h = np.deg2rad(step / 2)
    band = 2 * np.cos(np.deg2rad(lat)) * np.sin(h)
    band[[0, -1]] = 1 - np.cos(h)  # the caps 90 - step/2 .. 90
    assert band.sum() == pytest.approx(2.0)  # the whole sphere, per unit radius and 2 pi
    np.testing.assert_allclose(geo.latitude_weights(lat, "area"), band / band.mean(), rtol=1e-12)
    np.testing.assert_allclose(geo.latitude_weights(lat[::-1]), (band / band.mean())[::-1], rtol=1e-12)
    cos = np.cos(np.deg2rad(lat))
    np.testing.assert_allclose(geo.latitude_weights(lat, "cos"), cos / cos.mean(), rtol=1e-12, atol=1e-15)
    centres = lat[:-1] + step / 2
    np.testing.assert_allclose(geo.latitude_weights(centres, "area"), geo.latitude_weights(centres, "cos"), rtol=1e-12)
    with pytest.raises(ValueError, match="use 'area' or 'cos'"):
        geo.latitude_weights(lat, "gauss")  # type: ignore[arg-type]


def test_one_latitude_weight_implementation():
    """pipeline.verify.scores re-exports the data core's function; compression weights with its cos kind."""
    assert scores.latitude_weights is geo.latitude_weights
    rng = np.random.default_rng(5)
    lat = np.linspace(90.0, -90.0, 19)
    data = rng.normal(size=(2, 19, 36)).astype(np.float32)
    decoded = data + rng.normal(scale=0.1, size=data.shape).astype(np.float32)
    err = decoded.astype(np.float64) - data.astype(np.float64)
    w = np.cos(np.deg2rad(lat)) / np.cos(np.deg2rad(lat)).mean()
    assert field_errors(data, decoded, lat)["wrmse"] == pytest.approx(
        float((err**2 * w[:, None]).mean()) ** 0.5, rel=1e-12
    )


def test_metrics_import_without_torch():
    """numpy-only callers (evaluation on a machine without torch) do not pay for importing torch."""
    code = "import sys, postcast.pipeline.verify.scores; assert 'torch' not in sys.modules, 'torch was imported'"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_torch_engine_equals_numpy(ens):
    """engine="torch" (torch imported lazily, the kernel dispatch on CPU here) matches numpy."""
    x, y = ens
    for estimator in ("fair", "standard"):
        np.testing.assert_allclose(
            scores.crps_ensemble(x, y, estimator=estimator, engine="torch"),
            scores.crps_ensemble(x, y, estimator=estimator, engine="numpy"),
            rtol=1e-10,
        )


def test_calibration_diagnostics_detect_underdispersion():
    rng = np.random.default_rng(4)
    n, m = 20000, 10
    truth = rng.normal(size=n)
    good = rng.normal(size=(n, m))  # exchangeable with the truth
    narrow = 0.4 * rng.normal(size=(n, m))
    assert scores.spread_skill_ratio(good.std(1, ddof=1), good.mean(1), truth) == pytest.approx(1.0, abs=0.05)
    assert scores.spread_skill_ratio(narrow.std(1, ddof=1), narrow.mean(1), truth) < 0.5
    flat = scores.rank_histogram(good, truth)
    assert flat.sum() == n and flat.size == m + 1 and flat.max() / flat.min() < 1.3
    u = scores.rank_histogram(narrow, truth)
    assert u[0] + u[-1] > 0.5 * n  # U-shaped: the truth falls outside a too-narrow ensemble
    pit = GaussianForecast(np.zeros(n), np.ones(n)).cdf(truth)  # the Gaussian's PIT
    assert np.histogram(pit, bins=10, range=(0, 1))[0].min() > 0.08 * n


def test_efi_limits():
    rng = np.random.default_rng(5)
    clim_sample = rng.normal(size=(5000, 3))
    clim_q = np.quantile(clim_sample, scores.EFI_LEVELS, axis=0)  # (21, 3)
    same = rng.normal(size=(200, 3))
    assert np.all(np.abs(scores.efi(clim_q, same)) < 0.1)  # distributed like the climate
    above = scores.efi(clim_q, 10 + rng.random((10, 3)))
    # entirely above the climate maximum: (2/pi) sum sqrt(p / (1 - p)) dp over 19 levels (~0.79)
    p = scores.EFI_LEVELS[1:20]
    expected = 2 / np.pi * np.sum(np.sqrt(p / (1 - p))) * 0.05
    np.testing.assert_allclose(above, expected, rtol=1e-9)
    below = scores.efi(clim_q, -10 - rng.random((10, 3)))
    np.testing.assert_allclose(below, -expected, rtol=1e-9)
    shifted = scores.efi(clim_q, rng.normal(size=(10, 3)) + 1.0)
    assert np.all((shifted > 0.2) & (shifted <= 1))


def test_climate_window_and_eecrps():
    import pandas as pd

    from postcast.datasets import schema

    md = schema.ens10_month_days()
    times = schema.init_times(list(range(1998, 2018)), md).values
    mask = scores.climate_window(times, np.datetime64("2016-07-02"), month_days=md)
    picked = pd.DatetimeIndex(times[mask])
    assert mask.sum() == 19 * 9  # 19 years (1998..2016) x 9 month-days
    assert picked.year.min() == 1998 and picked.year.max() == 2016
    crps = np.array([[1.0, 2.0], [3.0, 4.0]])
    e = np.array([[0.0, 1.0], [-0.5, 0.0]])
    assert scores.eecrps(crps, e) == pytest.approx((2.0 + 1.5) / 4)


def test_paired_bootstrap():
    rng = np.random.default_rng(6)
    base = rng.gamma(2, 1, 300)
    better = base - 0.2 + 0.05 * rng.normal(size=300)
    mean, lo, hi = scores.paired_bootstrap(better, base, n=500)
    assert lo < mean < hi < 0 and mean == pytest.approx(-0.2, abs=0.02)
    mean, lo, hi = scores.paired_bootstrap(base, base + 0.01 * rng.normal(size=300), n=500)
    assert lo < 0 < hi


# --- the block kernels: sorting network, sorted pass, pairwise pass (issue 16, item 6) -----------
@pytest.mark.parametrize("m", [2, 3, 5, 8, 10, 11])
def test_sorting_network_sorts_every_zero_one_input(m):
    """The 0-1 principle: a comparator network sorting all 2^m binary inputs sorts every input."""
    lo, hi = scores.sorting_network(m)
    bits = ((np.arange(2**m)[:, None] >> np.arange(m)) & 1).astype(float)  # (2^m, m)
    for a, b in zip(lo, hi, strict=True):
        bits[:, a], bits[:, b] = np.minimum(bits[:, a], bits[:, b]), np.maximum(bits[:, a], bits[:, b])
    assert np.all(np.diff(bits, axis=1) >= 0)


@pytest.mark.parametrize(
    ("m", "kernel"), [(2, "unrolled"), (10, "unrolled"), (2, "block"), (7, "block"), (17, "block"), (50, "block")]
)
def test_block_kernels_match_scoringrules_and_properscoring(m, kernel):
    rng = np.random.default_rng(m)
    n = 3 * scores.BLOCK + 5  # full blocks and a ragged last block
    x, y = rng.gamma(2.0, 1.0, (n, m)), rng.normal(size=n) + 2
    fair, std = scores.crps_ensemble_pair(x, y, kernel=kernel)
    np.testing.assert_allclose(fair, scoringrules.crps_ensemble(y, x, estimator="fair"), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(std, properscoring.crps_ensemble(y, x), rtol=1e-12, atol=1e-13)
    pre_fair, pre_std = scores.crps_ensemble_pair(np.sort(x, axis=1), y, presorted=True, kernel=kernel)
    np.testing.assert_allclose(pre_fair, fair, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(pre_std, std, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("estimator,sr_estimator", [("fair", "fair"), ("standard", "nrg")])
def test_threshold_weighted_crps_matches_scoringrules(estimator, sr_estimator):
    """twCRPS with weight 1{z >= t} against scoringrules' twcrps_ensemble, including thresholds below,
    inside and above the ensemble and outcomes on either side."""
    rng = np.random.default_rng(7)
    x = rng.gamma(0.7, 4.0, size=(300, 10))  # (N, M) skewed like rain; M = 10: a compiled kernel
    y = rng.gamma(0.7, 4.0, size=300)
    for t in (0.0, 1.0, 10.0, 40.0):
        ours = scores.twcrps_ensemble(x, y, t, estimator=estimator)
        peer = np.asarray(scoringrules.twcrps_ensemble(y, x, a=t, estimator=sr_estimator))
        np.testing.assert_allclose(ours, peer, rtol=1e-10, atol=1e-12)
    assert np.all(scores.twcrps_ensemble(x, y, 1e9) == 0.0)  # nothing above the threshold: no weight


def test_brier_score_matches_scoringrules():
    rng = np.random.default_rng(8)
    x = rng.normal(5.0, 6.0, size=(400, 10))
    y = rng.normal(5.0, 6.0, size=400)
    for t in (1.0, 10.0):
        prob = scores.ensemble_exceedance(x, t)
        np.testing.assert_allclose(prob, (x > t).sum(-1) / 10)  # the member fraction, by counting
        ours = scores.brier_score(prob, y, t)
        peer = np.asarray(scoringrules.brier_score((y > t).astype(float), prob))
        np.testing.assert_allclose(ours, peer, rtol=0, atol=1e-15)
