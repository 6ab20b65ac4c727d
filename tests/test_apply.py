"""``apply_model``: a checkpoint applied to an xarray ensemble in memory gives the law ``postcast forecast``
writes for the same checkpoint and init time (its files are the reference: another path from raw files to the
law), the Gaussian's quantiles and exceedance probabilities are scipy's, and bad inputs are refused by name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from scipy import stats

from postcast.datasets import contract
from postcast.datasets.core.errors import ConfigError, MissingInputError
from postcast.models.module import PostProcessor, load_checkpoint
from postcast.pipeline.apply import apply_model
from postcast.pipeline.forecast import ForecastConfig, forecast

ROOT = Path(__file__).resolve().parents[1]
INIT = "2016-07-02"  # a test date of the session store
THRESHOLDS = (0.0, 275.0, 285.0)  # K: one below the support of a censored law, two inside


@pytest.fixture(scope="module")
def csg_ckpt(store, tmp_path_factory) -> Path:
    """A T2m local EMOS of the censored shifted gamma (a law with a point mass), one epoch on the store."""
    from postcast.pipeline import train

    root = tmp_path_factory.mktemp("apply_csg")
    args = ["fit", "-c", str(ROOT / "configs/train/tiny_emos_t2m.yaml"), "--data.cfg.store", str(store)]
    args += ["--trainer.default_root_dir", str(root), "--trainer.max_epochs", "1", "--model.distribution", "csg"]
    run = train.run(args)
    return Path(run.trainer.checkpoint_callback.best_model_path)


def _date(store: Path, init: str) -> xr.Dataset:
    ds = contract.open_store(store)
    return ds.sel(init_time=[np.datetime64(init)])


@pytest.mark.parametrize("which", ["gaussian", "csg"])
def test_the_applied_law_is_the_forecast_files(which, t2m_ckpt, csg_ckpt, store, synth_zarr, tmp_path):
    ckpt = t2m_ckpt if which == "gaussian" else csg_ckpt
    model, _ = load_checkpoint(str(ckpt))
    got = apply_model(model, _date(store, INIT), thresholds=THRESHOLDS)
    cfg = ForecastConfig(str(ckpt), str(synth_zarr), str(tmp_path / "fc"), INIT, thresholds=THRESHOLDS, workers=0)
    (path,) = forecast(cfg).written
    with xr.open_dataset(path) as ref:
        assert got.attrs["predictive_distribution"] == ref.attrs["predictive_distribution"] == which
        names = ["t2m_mean", "t2m_std", "t2m_quantile", "t2m_exceedance_probability"]
        names += [] if which == "gaussian" else ["t2m_shape", "t2m_scale", "t2m_shift"]
        for name in names:  # the files store float32 (parameters float64)
            np.testing.assert_allclose(got[name].values, ref[name].values, rtol=2e-5, atol=1e-6, err_msg=name)
        np.testing.assert_array_equal(got["quantile"].values, ref["quantile"].values)


def test_the_gaussian_answers_are_scipys(t2m_ckpt, store):
    model, _ = load_checkpoint(str(t2m_ckpt))
    got = apply_model(model, _date(store, INIT), quantiles=(0.1, 0.9), thresholds=(280.0,))
    mu, sigma = got["t2m_mu"].values, got["t2m_sigma"].values  # (1, H, W)
    np.testing.assert_allclose(got["t2m_mean"].values, mu)
    q = stats.norm.ppf(np.array([0.1, 0.9])[:, None, None, None], mu, sigma)
    np.testing.assert_allclose(got["t2m_quantile"].values, q, rtol=1e-12)
    np.testing.assert_allclose(got["t2m_exceedance_probability"].values[0], stats.norm.sf(280.0, mu, sigma), atol=1e-12)


def test_member_fields_alone_give_the_same_law(t2m_ckpt, store):
    """The ensemble statistics a store carries are computed from the members when they are missing."""
    model, _ = load_checkpoint(str(t2m_ckpt))
    day = _date(store, INIT)
    members = day[[n for n in day.data_vars if "member" in day[n].dims]]
    assert not any(str(n).startswith("ens_") for n in members.data_vars)
    xr.testing.assert_allclose(apply_model(model, members), apply_model(model, day), rtol=1e-6)


def test_a_vector_parameter_keeps_its_axis_over_dates(store):
    """Bernstein's coefficients (K, T, H, W): two dates at once are each date alone (an untrained model)."""
    ds = contract.open_store(store)
    grid = (ds.sizes["latitude"], ds.sizes["longitude"])
    model = PostProcessor("emos", sample={"target": "t2m"}, grid=grid, distribution="bernstein")
    two = apply_model(model.eval(), ds.isel(init_time=[0, 5]), thresholds=(280.0,))
    assert two["t2m_coef"].dims == ("coefficient", "init_time", "latitude", "longitude")
    for k, row in enumerate((0, 5)):
        one = apply_model(model, ds.isel(init_time=[row]), thresholds=(280.0,))
        xr.testing.assert_allclose(two.isel(init_time=[k]), one)


def test_bad_inputs_are_refused_by_name(t2m_ckpt, store):
    model, _ = load_checkpoint(str(t2m_ckpt))
    day = _date(store, INIT)
    with pytest.raises(ConfigError, match=r"grid is 10 x 36 points, the model's 19 x 36: regrid"):
        apply_model(model, day.isel(latitude=slice(0, 10)))
    with pytest.raises(ConfigError, match=r"quantiles \[1.5\]"):
        apply_model(model, day, quantiles=(0.5, 1.5))
    with pytest.raises(MissingInputError, match="no init time"):
        apply_model(model, day.isel(init_time=[]))
