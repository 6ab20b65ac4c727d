"""`postcast forecast` of a checkpoint of any predictive family (issue 31 item 6): the file names the family,
carries its parameters, its mean and std, and the quantiles and exceedance probabilities of that law, which
scipy.stats recomputes from the saved parameters; the service answers point queries on it."""

import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import web
import xarray as xr
from scipy import integrate, interpolate, optimize, stats

from postcast.datasets import laws
from postcast.models import distributions
from postcast.pipeline.products import archive, content

ROOT = Path(__file__).resolve().parents[1]
LEVELS = (0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95)


@pytest.fixture(scope="module", params=["truncnormal", "csg"])
def family_ckpt(request, store, tmp_path_factory):
    """A T2m local EMOS of the family, one epoch on the tiny store, trained in-process."""
    from postcast.pipeline import train

    root = tmp_path_factory.mktemp(f"fam_{request.param}")
    run = train.run(
        [
            "fit",
            "-c",
            str(ROOT / "configs/train/tiny_emos_t2m.yaml"),
            "--data.cfg.store",
            str(store),
            "--trainer.default_root_dir",
            str(root),
            "--trainer.max_epochs",
            "1",
            "--model.distribution",
            request.param,
        ]
    )
    return request.param, Path(run.trainer.checkpoint_callback.best_model_path)


def _scipy_law(family: str, ds: xr.Dataset) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(quantiles (Q, lat, lon), exceedance (T, lat, lon), mean and std at the first point) of the file's law
    from its saved parameters, by scipy alone (csg's moments by integrating its survival function)."""
    q = ds["quantile"].values[:, None, None]
    t = ds["threshold"].values[:, None, None]
    if family == "truncnormal":
        mu, sigma = ds["t2m_mu"].values, ds["t2m_sigma"].values
        law = stats.truncnorm(-mu / sigma, np.inf, loc=mu, scale=sigma)
        return law.ppf(q), np.where(t < 0, 1.0, law.sf(t)), law.mean()[0, 0], law.std()[0, 0]
    k, theta, shift = ds["t2m_shape"].values, ds["t2m_scale"].values, ds["t2m_shift"].values
    x = stats.gamma(k, scale=theta)  # Y = max(0, X - shift)
    x0 = stats.gamma(k[0, 0], scale=theta[0, 0])
    mean = integrate.quad(lambda y: x0.sf(y + shift[0, 0]), 0, np.inf, epsabs=1e-12, limit=200)[0]
    second = integrate.quad(lambda y: 2 * y * x0.sf(y + shift[0, 0]), 0, np.inf, epsabs=1e-12, limit=200)[0]
    return (
        np.maximum(x.ppf(q) - shift, 0.0),
        np.where(t < 0, 1.0, x.sf(np.maximum(t, 0) + shift)),
        mean,
        np.sqrt(second - mean * mean),
    )


def test_a_non_gaussian_checkpoint_forecasts_its_own_law(cli, family_ckpt, synth_zarr, tmp_path):
    """Before, `forecast` refused any checkpoint but a Gaussian one (exit 65, 'reads Gaussian models only')."""
    family, ckpt = family_ckpt
    out = tmp_path / "fc"
    extra = ["--thresholds=-1,0,280,285"] if family == "csg" else []  # truncnormal: the checkpoint's
    proc = cli(
        "forecast",
        "--checkpoint",
        str(ckpt),
        "--input",
        str(synth_zarr),
        "--init-time",
        "2017-01-01",
        "--end",
        "2017-12-31",
        "--out",
        str(out),
        *extra,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    files = sorted((out / "postprocessed/emos/t2m").glob("*.nc"))
    assert len(files) == 3
    ds = xr.open_dataset(files[0]).isel(forecast_reference_time=0)
    names = {"truncnormal": ("mu", "sigma"), "csg": ("shape", "scale", "shift")}[family]
    assert ds.attrs["predictive_distribution"] == family
    assert ds.attrs["predictive_parameters"] == " ".join(f"{p}: t2m_{p}" for p in names)
    assert [ds[f"t2m_{p}"].attrs["units"] for p in names] == (
        ["K", "K"] if family == "truncnormal" else ["1", "K", "K"]
    )
    checker = shutil.which("compliance-checker", path=Path(sys.executable).parent)
    assert checker, "compliance-checker is not installed: run scripts/setup.sh"
    cf = subprocess.run(
        [checker, "--test", "cf:1.8", "--criteria", "normal", str(files[0])],
        capture_output=True,
        text=True,
        check=False,
    )
    assert cf.returncode == 0 and "All tests passed" in cf.stdout, cf.stdout[-2000:]
    thresholds = ds["threshold"].values
    assert len(thresholds) == (4 if family == "csg" else 3)  # default: the checkpoint's 10/50/90 % of the truth
    quant, exceed = ds["t2m_quantile"].values, ds["t2m_exceedance_probability"].values
    assert (np.diff(quant, axis=0) >= 0).all() and ((exceed >= 0) & (exceed <= 1)).all()
    if family == "csg":
        assert (quant >= 0).all()
        assert (exceed[0] == 1).all() and (exceed[1] <= 1).all()  # P(Y > -1) = 1: P(Y < 0) = 0
    want_q, want_p, want_mean, want_std = _scipy_law(family, ds)
    np.testing.assert_allclose(quant, want_q, rtol=0, atol=1e-3)  # float32 of ~280 K: 3e-5 K
    np.testing.assert_allclose(exceed, want_p, rtol=0, atol=1e-6)
    assert ds["t2m_mean"].values[0, 0] == pytest.approx(want_mean, abs=1e-3)
    assert ds["t2m_std"].values[0, 0] == pytest.approx(want_std, rel=1e-4)


def test_the_service_answers_a_point_query_on_any_family(cli, family_ckpt, synth_zarr, tmp_path):
    """A real server on loopback answers the file's quantiles and exceedance; the threshold of a query is
    answered with the family's P(Y > t) (it was the Gaussian of the mean and std)."""

    from postcast.serve.testing import running_server

    family, ckpt = family_ckpt
    out = tmp_path / "fc"
    cli(
        "forecast",
        "--checkpoint",
        str(ckpt),
        "--input",
        str(synth_zarr),
        "--init-time",
        "2017-10-01",
        "--end",
        "2017-12-31",
        "--out",
        str(out),
        "--thresholds",
        "279",
        check=True,
    )
    found, skipped = archive.scan(out)
    field = archive.read_field(found[0])
    assert not skipped and field.family == family and set(field.params) == set(laws.get(family).names)
    ds = xr.open_dataset(found[0].path).isel(forecast_reference_time=0).sel(latitude=40, longitude=10)
    point = {"target": "t2m", "lat": 40, "lon": 10}
    median = round(float(ds["t2m_quantile"].sel(quantile=0.5)), 2)  # where a skewed law differs most from a normal
    with running_server(out) as url:
        body = web.get(f"{url}/forecast/point", params=point).json()
        asked = web.get(f"{url}/forecast/point", params={**point, "threshold": median}).json()
    np.testing.assert_allclose(list(body["quantiles"].values()), ds["t2m_quantile"].values, rtol=1e-6)
    assert body["exceedance"] == {"279": pytest.approx(float(ds["t2m_exceedance_probability"][0]), abs=1e-7)}
    assert body["mean"] == pytest.approx(float(ds["t2m_mean"])) and body["std"] == pytest.approx(float(ds["t2m_std"]))
    p = {k: float(ds[f"t2m_{k}"]) for k in laws.get(family).names}
    want = (
        stats.truncnorm.sf(median, -p["mu"] / p["sigma"], np.inf, loc=p["mu"], scale=p["sigma"])
        if family == "truncnormal"
        else stats.gamma.sf(median + p["shift"], p["shape"], scale=p["scale"])
    )
    assert asked["exceedance"][f"{median:g}"] == pytest.approx(want, abs=1e-9)


# --- every family, without training -------------------------------------------------------------
CASES = {  # parameters (lat = 1, lon = 3): a law far from 0, one near it, one mostly below it
    "gaussian": {"mu": [2.0, 0.3, -1.0], "sigma": [1.0, 0.5, 2.0]},
    "truncnormal": {"mu": [5.0, 0.3, -3.0], "sigma": [1.0, 0.5, 1.0]},
    "clogistic": {"loc": [5.0, 0.3, -2.0], "scale": [1.0, 0.5, 1.0]},
    "csg": {"shape": [4.0, 0.7, 2.0], "scale": [1.0, 2.0, 0.5], "shift": [0.5, 0.1, 3.0]},
    "bernstein": {"coef": np.cumsum(np.abs(np.random.default_rng(0).normal(size=(13, 3))), axis=0) - 2.0},
}


def _params(family: str) -> dict[str, np.ndarray]:
    return {k: np.asarray(v, dtype=np.float64).reshape(*np.shape(v)[:-1], 1, 3) for k, v in CASES[family].items()}


def _scipy_sf(family: str, p: dict[str, np.ndarray], t: float, i: int) -> float:
    """P(Y > t) at point i by scipy (Bernstein: the root of its Bernstein-basis polynomial, BPoly)."""
    v = {k: a[..., 0, i] for k, a in p.items()}
    if family == "gaussian":
        return float(stats.norm.sf(t, v["mu"], v["sigma"]))
    if t < 0 and family != "bernstein":
        return 1.0
    if family == "truncnormal":
        return float(stats.truncnorm.sf(t, -v["mu"] / v["sigma"], np.inf, loc=v["mu"], scale=v["sigma"]))
    if family == "clogistic":
        return float(stats.logistic.sf(t, v["loc"], v["scale"]))
    if family == "csg":
        return float(stats.gamma.sf(t + v["shift"], v["shape"], scale=v["scale"]))
    q = interpolate.BPoly(v["coef"][:, None], [0.0, 1.0])
    if t <= q(0.0) or t >= q(1.0):
        return float(t < q(0.0))
    return 1.0 - optimize.brentq(lambda tau: q(tau) - t, 0.0, 1.0, xtol=1e-14)


def _scipy_moments(family: str, p: dict[str, np.ndarray], i: int) -> tuple[float, float]:
    """Mean and std by integrating the survival function of y (and of -y below 0) with quad."""
    lo = -np.inf if family in ("gaussian", "bernstein") else 0.0
    sf = lambda y: _scipy_sf(family, p, y, i)  # noqa: E731
    m1 = integrate.quad(sf, 0, np.inf)[0] - (integrate.quad(lambda y: 1 - sf(y), lo, 0)[0] if lo < 0 else 0)
    m2 = integrate.quad(lambda y: 2 * y * sf(y), 0, np.inf)[0] + (
        integrate.quad(lambda y: -2 * y * (1 - sf(y)), lo, 0)[0] if lo < 0 else 0
    )
    return m1, float(np.sqrt(m2 - m1 * m1))


@pytest.mark.parametrize("family", distributions.names())
def test_every_family_has_its_file_form_checked_against_scipy(family):
    """Each family of models/distributions.py has its parameters described for the file (datasets/laws.py,
    the dataclass's fields) and closed-form moments (the law's) that integration reproduces; its quantiles
    and exceedance (the law's, as the forecast writes them) match scipy's law."""
    assert list(laws.get(family).names) == [f.name for f in dataclasses.fields(distributions.get(family))]
    p = _params(family)
    mean, std = laws.get(family).moments(p)
    for i in range(3):
        m, s = _scipy_moments(family, p, i)
        assert mean[0, i] == pytest.approx(m, rel=1e-6, abs=1e-8) and std[0, i] == pytest.approx(s, rel=1e-6)
    thresholds = (-0.5, 0.0, 0.7, 4.0)
    got = content.Law.of(family, p, LEVELS, thresholds)
    for i in range(3):
        want = [_scipy_sf(family, p, t, i) for t in thresholds]
        np.testing.assert_allclose(got.exceedance[:, 0, i], want, atol=1e-9)
        levels = np.array(LEVELS)
        # a quantile is where the scipy survival function crosses 1 - tau (at a point mass: 0 with F(0) >= tau)
        sf_at_q = np.array([_scipy_sf(family, p, float(x), i) for x in got.quantiles[:, 0, i]])
        at_mass = got.quantiles[:, 0, i] == 0.0
        np.testing.assert_allclose(sf_at_q[~at_mass], 1.0 - levels[~at_mass], atol=1e-8)
        assert (sf_at_q[at_mass] <= 1.0 - levels[at_mass] + 1e-12).all()


@pytest.mark.parametrize("family", distributions.names())
def test_every_family_round_trips_through_the_archive(family, tmp_path):
    """A file of each family (netCDF and zarr; Bernstein's coefficients on their own dimension) is read back
    by the service's reader with its family and parameters, and the reader's P(Y > t) for a query's threshold
    equals the file's exceedance at the thresholds it carries; a family this postcast does not know is an
    unreadable product, not a Gaussian."""
    import pandas as pd

    from postcast.datasets import schema

    p = _params(family)
    mean, std = laws.get(family).moments(p)
    thresholds = (-0.5, 0.0, 0.7, 4.0)
    ds = content.products(
        mean,
        std,
        target=schema.target("t2m"),
        init=pd.Timestamp("2017-01-02"),
        step_h=48,
        lat=np.array([10.0]),
        lon=np.array([0.0, 5.0, 10.0]),
        quantiles=LEVELS,
        thresholds=thresholds,
        attrs={"product": archive.POSTPROCESSED},
        law=None if family == "gaussian" else content.Law.of(family, p, LEVELS, thresholds),
    )
    for ext in ("nc", "zarr"):
        path = archive.product_path(tmp_path, archive.POSTPROCESSED, "m", "t2m", pd.Timestamp("2017-01-02"), ext)
        archive.write_product(ds, path)
        field = archive.read_field(archive.parse(tmp_path, path))
        assert field.family == family and {k: v.shape for k, v in field.params.items()} == {
            k: v.shape for k, v in p.items()
        }
        got = [[archive.exceedance_at(field, 0, j, t) for j in range(3)] for t in thresholds]
        np.testing.assert_allclose(got, field.exceedance[:, 0], atol=1e-7)  # the file's are float32
    ds.attrs["predictive_distribution"] = "weibull"
    archive.write_product(ds, path)
    with pytest.raises(archive.UnreadableProduct, match="predictive family 'weibull'"):
        archive.read_field(archive.parse(tmp_path, path))


def test_on_input_grid_regrids_the_parameters(family_ckpt, tmp_path):
    """--on-input-grid with a 5 deg input and a 10 deg checkpoint: the family's parameters are regridded to
    the input's grid and the law evaluated there (scipy.stats reproduces it from the saved parameters)."""
    from postcast.datasets.synth import synthfiles
    from postcast.datasets.synth.synthetic import SynthConfig
    from postcast.pipeline.forecast import ForecastConfig, forecast

    family, ckpt = family_ckpt
    src = tmp_path / "fine"
    synthfiles.write_synthetic(
        SynthConfig(seed=3, resolution=5.0, years=(2017, 2017), dates_per_year=1, levels=(500, 850)),
        src,
        progress=False,
    )
    res = forecast(
        ForecastConfig(
            checkpoint=str(ckpt),
            input=str(src),
            out=str(tmp_path / "o"),
            init_time="2017-01-01",
            end="2017-12-31",
            on_input_grid=True,
        )
    )
    ds = xr.open_dataset(res.written[0]).isel(forecast_reference_time=0)
    assert ds.attrs["output_grid"] == "input" and ds.attrs["predictive_distribution"] == family
    assert ds.sizes["latitude"] == 37 and ds.sizes["longitude"] == 72
    want_q, want_p, _, _ = _scipy_law(family, ds)
    np.testing.assert_allclose(ds["t2m_quantile"].values, want_q, rtol=0, atol=1e-3)
    np.testing.assert_allclose(ds["t2m_exceedance_probability"].values, want_p, rtol=0, atol=1e-6)
