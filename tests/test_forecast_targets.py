"""`postcast forecast` and `postcast serve` for the derived targets ws10 and tp24 (issue 31 items 6 and 7):
the forecast reads the inputs a derived target is computed from (u10 and v10; tp at the lead and 24 h
before), writes the law of the checkpoint's family with the target's CF name, units and thresholds, falls
back to the Gaussian of the derived members when the model cannot run, and the service answers from the files.

The session's small synthetic world with the derived targets' truths (conftest ``derived_store``: 10 deg,
2010-2015), its store, and one-epoch local EMOS checkpoints of ws10 (truncated normal), tp24 (censored
shifted gamma) and tp24 (Gaussian), all made once for the module.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import web
import xarray as xr
from battery import assert_ok, in_process
from scipy import stats
from scipy.special import gammaincc

from postcast.datasets import schema
from postcast.serve.testing import running_server

ROOT = Path(__file__).resolve().parents[1]
CF = {
    "ws10": ("wind_speed", "m s**-1", [10.0, 20.0]),
    "tp24": ("lwe_thickness_of_precipitation_amount", "mm", [1.0, 10.0]),
}
GAUSSIAN_NAME = "emos_gaussian"  # the tp24 model predicting a Gaussian, beside the csg one ("emos")


@pytest.fixture(scope="module")
def world(derived_store, tmp_path_factory):
    """The raw synthetic files (``raw``: the forecast's input) and their store (``store.zarr``), linked
    into a folder of this module's own (the session's data is shared by every test: written nowhere)."""
    root = tmp_path_factory.mktemp("world")
    for name in ("raw", "store.zarr"):
        (root / name).symlink_to(derived_store.parent / name)
    return root


@pytest.fixture(scope="module")
def window(world):
    """--init-time/--end of the world's last two init dates."""
    times = xr.open_zarr(world / "store.zarr")[schema.INIT_TIME].values[-2:]
    first, last = (str(np.datetime_as_string(t, "h")) for t in times)
    return ("--init-time", first, "--end", last)


def _train(world: Path, target: str, *extra: str) -> Path:
    from postcast.pipeline import train

    run = train.run(
        [
            "fit",
            "-c",
            str(ROOT / f"configs/train/tiny_emos_{target}.yaml"),
            "--data.cfg.store",
            str(world / "store.zarr"),
            "--trainer.max_epochs",
            "1",
            "--trainer.default_root_dir",
            str(world / "runs" / f"{target}{''.join(extra)}"),
            "--trainer.enable_model_summary",
            "false",
            *extra,
        ]
    )
    return Path(run.trainer.checkpoint_callback.best_model_path)


@pytest.fixture(scope="module")
def ckpts(world):
    """ws10 (truncnormal), tp24 (csg) and tp24 as a Gaussian."""
    return {
        "ws10": _train(world, "ws10"),
        "tp24": _train(world, "tp24"),
        GAUSSIAN_NAME: _train(world, "tp24", "--model.distribution", "gaussian"),
    }


@pytest.fixture(scope="module")
def archive_root(cli, world, ckpts, window):
    """The three models' forecasts of the world's last two dates (default thresholds: the targets')."""
    out = world / "forecasts"
    for name, ckpt in ckpts.items():
        named = ["--name", GAUSSIAN_NAME] if name == GAUSSIAN_NAME else []
        cli(
            "forecast",
            "--checkpoint",
            str(ckpt),
            "--input",
            str(world / "raw"),
            *window,
            "--out",
            str(out),
            *named,
            check=True,
        )
    return out


def _one(root: Path, product: str, model: str, target: str) -> xr.Dataset:
    files = sorted((root / product / model / target).glob("*.nc"))
    assert len(files) == 2, files
    return xr.open_dataset(files[0]).isel(forecast_reference_time=0).load()


def _cf_check(path: Path) -> None:
    checker = shutil.which("compliance-checker", path=Path(sys.executable).parent)
    assert checker, "compliance-checker is not installed: run scripts/setup.sh"
    cf = subprocess.run(
        [checker, "--test", "cf:1.8", "--criteria", "normal", str(path)], capture_output=True, text=True, check=False
    )
    assert cf.returncode == 0 and "All tests passed" in cf.stdout, cf.stdout[-2000:]


def _check_metadata(ds: xr.Dataset, target: str, family: str) -> None:
    std_name, units, thresholds = CF[target]
    assert ds.attrs["predictive_distribution"] == family and ds.attrs["product"] == "postprocessed"
    for name in (f"{target}_mean", f"{target}_quantile"):
        assert ds[name].attrs["standard_name"] == std_name and ds[name].attrs["units"] == units
    assert ds[f"{target}_std"].attrs["units"] == units and ds["threshold"].attrs["units"] == units
    assert ds["threshold"].values.tolist() == thresholds  # the target's own, by default
    quant, exceed = ds[f"{target}_quantile"].values, ds[f"{target}_exceedance_probability"].values
    assert (quant >= 0).all() and (np.diff(quant, axis=0) >= 0).all()
    assert ((exceed >= 0) & (exceed <= 1)).all() and (exceed[1] <= exceed[0]).all()


def test_ws10_forecast_is_its_truncated_normal_in_m_per_s(archive_root):
    """Before: an internal error (KeyError 'ws10': the archive looked its CF name up among the schema variables)."""
    ds = _one(archive_root, "postprocessed", "emos", "ws10")
    _check_metadata(ds, "ws10", "truncnormal")
    assert [ds[f"ws10_{p}"].attrs["units"] for p in ("mu", "sigma")] == ["m s**-1"] * 2
    mu, sigma = ds["ws10_mu"].values, ds["ws10_sigma"].values
    law = stats.truncnorm(-mu / sigma, np.inf, loc=mu, scale=sigma)
    np.testing.assert_allclose(
        ds["ws10_exceedance_probability"].values, law.sf(ds["threshold"].values[:, None, None]), rtol=0, atol=1e-6
    )
    np.testing.assert_allclose(ds["ws10_mean"].values, law.mean(), rtol=1e-5)
    _cf_check(sorted((archive_root / "postprocessed/emos/ws10").glob("*.nc"))[0])


def test_tp24_forecast_is_its_censored_shifted_gamma_in_mm(archive_root):
    """Before: +24 h was never read (tp24 is tp(+48) - tp(+24)), so the sample failed on the missing lead."""
    ds = _one(archive_root, "postprocessed", "emos", "tp24")
    _check_metadata(ds, "tp24", "csg")
    assert [ds[f"tp24_{p}"].attrs["units"] for p in ("shape", "scale", "shift")] == ["1", "mm", "mm"]
    k, theta, shift = ds["tp24_shape"].values, ds["tp24_scale"].values, ds["tp24_shift"].values
    wet = gammaincc(k, shift / theta)  # P(Y > 0) = P(X > shift)
    assert ((wet > 0) & (wet <= 1)).all()
    exceed = ds["tp24_exceedance_probability"].values
    assert (exceed[0] <= wet + 1e-6).all()
    np.testing.assert_allclose(exceed[0], gammaincc(k, (1.0 + shift) / theta), rtol=0, atol=1e-6)  # P(Y > 1 mm)
    i, j = np.unravel_index(np.argmax(exceed[0]), exceed[0].shape)  # the wettest point, by scipy.stats too
    assert exceed[0, i, j] == pytest.approx(stats.gamma.sf(1.0 + shift[i, j], k[i, j], scale=theta[i, j]), abs=1e-6)
    assert exceed[0, i, j] > 0.05  # a point where the check means something
    _cf_check(sorted((archive_root / "postprocessed/emos/tp24").glob("*.nc"))[0])


def _members(raw: xr.Dataset, target: str) -> np.ndarray:
    """The derived target's members (time, number, latitude, longitude) at +48 h, by hand from the ENS-10 file."""
    at = {h: raw.sel(step=np.timedelta64(h, "h")) for h in (24, 48)}
    if target == "ws10":
        return np.sqrt(at[48]["u10"].values.astype(np.float64) ** 2 + at[48]["v10"].values.astype(np.float64) ** 2)
    return np.maximum(at[48]["tp"].values.astype(np.float64) - at[24]["tp"].values, 0.0) * 1000.0


@pytest.mark.parametrize("target", ["ws10", "tp24"])
def test_fallback_is_the_raw_law_of_the_derived_members(cli, world, ckpts, window, target, tmp_path):
    """An input with only the target's own inputs (the checkpoint reads every surface variable): the raw
    fallback, the target's family at the head's zero outputs from the members' mean m and std s (ws10: a normal
    truncated at 0 with mu = m, sigma = s; tp24: a censored shifted gamma with shift = s log 2, X of mean
    max(m, 0) + shift and std s), with the target's CF metadata, never a negative quantile. Before: the
    fallback asked the input for a variable named like the target (exit 66); then it was N(m, s^2), whose
    rain quantiles went below 0."""
    raw = xr.open_zarr(world / "raw" / "forecast.zarr", consolidated=False)  # ENS-10 names: time = init
    only = raw[list(schema.target(target).input_variables)].isel(time=[-2, -1]).load()
    src = tmp_path / "only.zarr"
    only.to_zarr(src, zarr_format=3, consolidated=False)
    out = tmp_path / "fc"
    proc = cli("forecast", "--checkpoint", str(ckpts[target]), "--input", str(src), *window, "--out", str(out))
    assert proc.returncode == 0 and "(2 fallback)" in proc.stdout, proc.stderr[-2000:]
    ds = _one(out, "fallback_raw", "emos", target)
    assert ds.attrs["postcast_fallback"] == 1 and ds.attrs["predictive_distribution"] == schema.target(target).family
    assert "missing" in ds.attrs["comment"]
    x = _members(only.isel(time=[0]).sortby("latitude"), target)[0]  # (number, lat, lon) ascending latitude
    m, s = x.mean(axis=0), np.maximum(x.std(axis=0), 1e-6)
    if target == "ws10":
        np.testing.assert_allclose(ds["ws10_mu"].values, m, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(ds["ws10_sigma"].values, s, rtol=1e-4, atol=1e-5)
        want = stats.truncnorm(-m / s, np.inf, loc=m, scale=s).mean()
    else:
        shift = s * np.log(2.0)
        mean_x = np.maximum(m, 0.0) + shift  # X's mean; its std is s
        np.testing.assert_allclose(ds["tp24_shift"].values, shift, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(ds["tp24_shape"].values, (mean_x / s) ** 2, rtol=1e-3)
        np.testing.assert_allclose(ds["tp24_scale"].values, s * s / mean_x, rtol=1e-3, atol=1e-6)
        k, theta = (mean_x / s) ** 2, s * s / mean_x
        want = theta * (k * gammaincc(k + 1, shift / theta) - shift / theta * gammaincc(k, shift / theta))
    np.testing.assert_allclose(ds[f"{target}_mean"].values, want, rtol=2e-3, atol=1e-4)
    assert (ds[f"{target}_quantile"].values >= 0).all()
    std_name, units, thresholds = CF[target]
    assert ds[f"{target}_mean"].attrs["standard_name"] == std_name and ds[f"{target}_mean"].attrs["units"] == units
    assert ds["threshold"].values.tolist() == thresholds


def test_the_service_answers_ws10_and_both_tp24_models(archive_root):
    """/forecasts lists ws10 and tp24 with its two models; /forecast/point answers each from its file."""
    with running_server(archive_root) as url:
        listing = web.get(f"{url}/forecasts").json()
        models = {t["target"]: sorted(m["model"] for m in t["models"]) for t in listing["targets"]}
        assert models == {"ws10": ["emos"], "tp24": ["emos", GAUSSIAN_NAME]}
        assert len(listing["forecasts"]) == 6
        for target, model in (("ws10", "emos"), ("tp24", "emos"), ("tp24", GAUSSIAN_NAME)):
            point = {"target": target, "lat": 50.0, "lon": 10.0, "model": model, "threshold": 5.0}
            body = web.get(f"{url}/forecast/point", params=point).json()
            files = sorted((archive_root / "postprocessed" / model / target).glob("*.nc"))
            ds = xr.open_dataset(files[-1]).isel(forecast_reference_time=0).sel(latitude=50.0, longitude=10.0)
            assert body["model"] == model and body["units"] == CF[target][1], body
            assert body["mean"] == pytest.approx(float(ds[f"{target}_mean"]))
            want = {
                f"{t:g}": float(p)
                for t, p in zip(ds["threshold"].values, ds[f"{target}_exceedance_probability"].values, strict=True)
            }
            assert {k: v for k, v in body["exceedance"].items() if k != "5"} == pytest.approx(want, abs=1e-7)
            if model == "emos" and target == "tp24":  # the query's own threshold by the file's law
                k, theta, shift = (float(ds[f"tp24_{p}"]) for p in ("shape", "scale", "shift"))
                assert body["exceedance"]["5"] == pytest.approx(gammaincc(k, (5.0 + shift) / theta), abs=1e-9)
            if model == GAUSSIAN_NAME:
                mu, sd = float(ds["tp24_mean"]), float(ds["tp24_std"])
                assert body["exceedance"]["5"] == pytest.approx(stats.norm.sf(5.0, mu, sd), abs=1e-6)


# --- bad input (the shared battery) ---------------------------------------------------------------
@pytest.mark.battery
def test_tp24_on_an_input_without_the_earlier_lead(world, ckpts, window, tmp_path, capsys):
    """tp24 at +48 h is tp(+48) - tp(+24): an input with +0 and +48 h only has no tp24 to forecast. One line
    naming the +24 h it lacks and --input, exit 66, nothing written. Before: a ConfigError (exit 2) from the
    sampler telling the user to train at another lead."""
    raw = xr.open_zarr(world / "raw" / "forecast.zarr", consolidated=False)
    src = tmp_path / "no24.zarr"
    raw.isel(time=[-1], step=[0, 2]).to_zarr(src, zarr_format=3, consolidated=False)
    out = tmp_path / "fc"
    res = in_process(
        ["forecast", "--checkpoint", str(ckpts["tp24"]), "--input", str(src), *window, "--out", str(out)], capsys
    )
    assert_ok("forecast: tp24 without the lead 24 h before", res, not out.exists() or not any(out.rglob("*.nc")))
    assert res.code == 66 and "+24" in res.error_lines[0] and "--input" in res.error_lines[0], res.error_lines
