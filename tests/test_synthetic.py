"""Invariants of the synthetic ENS-10 generator: physics, error structure, oracle, determinism."""

import math

import dask.array as da
import numpy as np
import pandas as pd
import pytest
import xarray as xr
from scipy import stats

from postcast.datasets import contract, schema
from postcast.datasets.core import checksums
from postcast.datasets.synth import synthetic, synthfiles
from postcast.datasets.synth.synthetic import SynthConfig


def crps_gaussian(mu, sigma, y):
    """Closed-form CRPS of N(mu, sigma^2), float64 (docs/ens10.md, "Scores")."""
    z = (y - mu) / sigma
    return sigma * (z * (2 * stats.norm.cdf(z) - 1) + 2 * stats.norm.pdf(z) - 1 / math.sqrt(math.pi))


def crps_ensemble(x, y):
    """Standard (ecdf) ensemble CRPS over axis 0, O(M^2) float64 reference."""
    x = x.astype(np.float64)
    return np.abs(x - y).mean(0) - 0.5 * np.abs(x[:, None] - x[None]).mean((0, 1))


@pytest.fixture(scope="module")
def sample(tiny_cfg):
    """Forecasts and truth of the tiny config as numpy (the whole thing is ~30 MB)."""
    fc = synthetic.forecast_dataset(tiny_cfg).compute()
    truth = synthetic.truth_dataset(tiny_cfg).compute()
    return fc, truth


def test_lazy_full_resolution_dataset_is_never_materialised():
    cfg = SynthConfig(resolution=0.5, dates_per_year=105, levels=(850,))
    full = synthetic.forecast_dataset(SynthConfig(resolution=0.5, dates_per_year=105, levels=schema.LEVELS))
    assert full["t"].shape == (2100, 10, 3, 11, 361, 720)  # 288 GB as float32, never built
    assert full["t"].data.chunksize == (1, 10, 3, 11, 361, 720)  # one task per date and variable
    t = synthetic.forecast_dataset(cfg, variables=["t"])["t"]
    assert isinstance(t.data, da.Array)
    one = t.isel(init_time=7, step=2).values  # computes one block only
    assert one.shape == (10, 1, 361, 720) and np.isfinite(one).all()
    assert 240 < one.mean() < 300  # T850, K


def test_units_and_ranges(sample):
    fc, _ = sample
    for name, da_ in fc.data_vars.items():
        var = schema.VARIABLES[name]
        v = da_.values
        assert np.nanmin(v) >= var.valid_min and np.nanmax(v) <= var.valid_max, name
        assert da_.attrs["units"] == var.units
    z500 = fc["z"].sel(level=500).values / schema.GRAVITY
    assert z500.min() > 4600 and z500.max() < 6100  # geopotential height in m
    assert fc["tcc"].min() >= 0 and fc["tcc"].max() <= 1
    assert 230 < float(fc["t"].sel(level=850).mean()) < 290
    # latitude structure: tropics warmer than poles at 850 hPa
    t850 = fc["t"].sel(level=850).mean(["init_time", "member", "step", "longitude"])
    assert float(t850.sel(latitude=0)) > float(t850.sel(latitude=80)) + 15


def test_accumulations_and_sst(sample):
    fc, _ = sample
    tp, cp = fc["tp"].values, fc["cp"].values
    assert (tp >= 0).all() and (cp >= 0).all() and (cp <= tp + 1e-9).all()
    assert (tp[:, :, 0] == 0).all()  # accumulated since init: zero at step 0
    assert (tp[:, :, 2] >= tp[:, :, 1]).all() and (tp[:, :, 1] > 0).any()
    sst = fc["sst"].values
    land = np.isnan(sst)
    assert land.any() and not land.all()
    assert (land == land[:1, :1, :1]).all()  # static land/sea mask, same for all members and dates
    assert 0.1 < land.mean() < 0.6


def test_seasonal_cycle(sample):
    fc, _ = sample
    nh = fc["t"].sel(level=850, latitude=slice(40, 60)).mean(["member", "step", "latitude", "longitude"])
    months = pd.DatetimeIndex(nh.init_time.values).month
    assert float(nh[months == 7].mean()) > float(nh[months == 3].mean()) + 5  # July warmer than March


def test_error_structure_and_oracle(sample):
    fc, truth = sample
    for target, tg in ((t, schema.target(t)) for t in schema.ENS10_TARGETS):
        x = fc[tg.variable].sel(level=tg.level) if tg.level else fc[tg.variable]
        y = truth[contract.truth_name(target)]
        rmse, spread = [], []
        for step in range(3):
            xs, ys = x.isel(step=step).values, y.isel(step=step).values
            err = xs.mean(1) - ys
            rmse.append(np.sqrt((err**2).mean()))
            spread.append(xs.std(1).mean())
        assert rmse[0] < rmse[1] < rmse[2], target  # errors grow with lead time
        assert spread[2] / rmse[2] < 0.8, target  # under-dispersive at 48 h
        xs, ys = x.isel(step=2).values, y.isel(step=2).values
        raw = crps_ensemble(np.moveaxis(xs, 1, 0), ys).mean()
        mu = truth[f"oracle_mean_{target}"].isel(step=2).values
        sd = truth[f"oracle_std_{target}"].isel(step=2).values
        oracle = crps_gaussian(mu, sd, ys).mean()
        assert oracle < 0.85 * raw, (target, oracle, raw)
        # a bias the post-processor can learn: the oracle mean differs from the ensemble mean
        bias = mu - xs.mean(1)
        assert np.sqrt((bias**2).mean()) > 0.2 * tg.error_scale


def test_truth_is_a_draw_from_the_oracle(sample):
    """PIT of the truth under the oracle Gaussian is uniform: the oracle is the true law."""
    _, truth = sample
    for target in schema.ENS10_TARGETS:
        y = truth[contract.truth_name(target)].values.ravel()
        mu = truth[f"oracle_mean_{target}"].values.ravel()
        sd = truth[f"oracle_std_{target}"].values.ravel()
        z = (y - mu) / sd
        # spatially correlated draws: test on a thinned sample of points
        assert abs(z.mean()) < 0.1 and abs(z.std() - 1) < 0.1, target
        assert stats.kstest(stats.norm.cdf(z[::37]), "uniform").pvalue > 1e-3, target


def test_bias_depends_non_linearly_on_other_variables(sample):
    """The oracle bias is explained better by 850 hPa wind speed and cloud cover than by the target's
    own ensemble mean alone, so multi-variable models can beat a single-variable EMOS."""
    fc, truth = sample
    ens = fc.isel(step=2).mean("member")
    m = ens["t"].sel(level=850).values.ravel()
    bias = truth["oracle_mean_t850"].isel(step=2).values.ravel() - m
    ws = np.hypot(ens["u"].sel(level=850), ens["v"].sel(level=850)).values.ravel()
    tcc = ens["tcc"].values.ravel()

    def r2(*cols):
        a = np.column_stack([np.ones_like(m), *cols])
        res = bias - a @ np.linalg.lstsq(a, bias, rcond=None)[0]
        return 1 - res.var() / bias.var()

    assert r2(np.tanh((ws - 10) / 5), np.sin(3 * (2 * tcc - 1)), m) > r2(m) + 0.1


def test_extremes_occur():
    w = synthetic.world(0, 5.0)
    peaks = [np.abs(w.latent(pd.Timestamp(2005, 1, 1) + pd.Timedelta(days=d))["psi"]).max() for d in range(0, 365, 3)]
    assert max(peaks) > 4.0  # rare blobs well beyond the N(0, 1) background


def test_gaussian_waves_are_unit_normal_pointwise():
    rng = np.random.default_rng(0)
    grid = schema.Grid(10.0)
    f = synthetic.static_fields(rng, grid, 4000)
    at = f[:, 12, 7]
    assert abs(at.mean()) < 0.06 and abs(at.std() - 1) < 0.05
    assert stats.kstest(at, "norm").pvalue > 1e-3
    w = synthetic.GaussianWaves(np.random.default_rng(1))
    vals = np.array(
        [
            synthetic.GaussianWaves(np.random.default_rng(k))(grid.latitudes(), grid.longitudes(), 3.0)[5, 5]
            for k in range(1500)
        ]
    )
    assert abs(vals.std() - 1) < 0.06
    a, b = w(grid.latitudes(), grid.longitudes(), 10.0), w(grid.latitudes(), grid.longitudes(), 10.5)
    assert np.corrcoef(a.ravel(), b.ravel())[0, 1] > 0.9  # evolves smoothly in time


def test_same_seed_same_bytes_other_seed_differs(tmp_path, tiny_cfg):
    cfg = SynthConfig(**{**tiny_cfg.to_dict(), "years": (2016, 2017), "levels": (500,), "dates_per_year": 1})
    a, b = tmp_path / "a", tmp_path / "b"
    synthfiles.write_synthetic(cfg, a, progress=False)
    synthfiles.write_synthetic(cfg, b, progress=False)
    for name in ("forecast.zarr", "era5.zarr", "oracle.zarr"):
        assert checksums.sha256_tree(a / name) == checksums.sha256_tree(b / name), name
    other = SynthConfig(**{**cfg.to_dict(), "seed": cfg.seed + 1, "years": cfg.years, "levels": cfg.levels})
    synthfiles.write_synthetic(other, tmp_path / "c", progress=False)
    assert checksums.sha256_tree(a / "forecast.zarr") != checksums.sha256_tree(tmp_path / "c" / "forecast.zarr")


def test_config_validation():
    with pytest.raises(ValueError, match="not ENS-10 levels"):
        SynthConfig(levels=(123,))
    with pytest.raises(ValueError, match="format"):
        SynthConfig(format="csv")
    with pytest.raises(ValueError, match="does not divide"):
        SynthConfig(resolution=7.0)


def test_every_schema_variable_has_one_registered_generator():
    """Generators were found by getattr(f"_f_{name}"): a new variable failed deep inside with an
    AttributeError. They are now a registry checked against the schema, with the fix in the error."""
    from postcast.datasets import schema
    from postcast.datasets.synth import synthetic

    assert set(synthetic.GENERATORS) == set(schema.VARIABLES)
    w = synthetic.world(0, 30.0)
    with pytest.raises(KeyError, match=r"no synthetic generator for variable 'nope': add a World method decorated"):
        w.members_field("nope", 0, pd.Timestamp("2017-01-02"), 48)


@pytest.mark.parametrize("fmt", ["zarr", "netcdf"])
def test_synth_writes_only_the_variables_asked_for(tmp_path, fmt):
    """The scale benchmark writes T at 850 hPa only at 0.5 deg: all 18 variables would be 18 times the disk
    and time. The file of a level type without variables (here the surface file) is not written."""
    from postcast.datasets.synth import lazy

    cfg = SynthConfig(
        resolution=30.0, years=(2017, 2017), dates_per_year=1, levels=(850,), variables=("t",), format=fmt
    )
    manifest = synthfiles.write_synthetic(cfg, tmp_path, progress=False)
    forecasts = [f for f in manifest["files"] if not f.startswith(("era5", "oracle"))]
    assert len(forecasts) == 1, forecasts
    path = tmp_path / forecasts[0]
    with xr.open_zarr(path) if fmt == "zarr" else xr.open_dataset(path) as ds:
        assert len(ds.data_vars) == 1 and ds[next(iter(ds.data_vars))].attrs["units"] == "K", ds
    # the same values as the all-variable world's T
    every = lazy.forecast_dataset(SynthConfig(**{**cfg.to_dict(), "variables": (), "years": (2017, 2017)}))
    assert list(lazy.forecast_dataset(cfg).data_vars) == ["t"]
    np.testing.assert_array_equal(lazy.forecast_dataset(cfg)["t"].values, every["t"].values)
    with pytest.raises(ValueError, match=r"variables \['T850'\]: choose from"):
        SynthConfig(variables=("T850",))
