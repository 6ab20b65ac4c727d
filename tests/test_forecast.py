"""`postcast forecast`: calibrated CF outputs from raw forecasts, idempotent reruns, fallback, bad input."""

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import web
import xarray as xr

from postcast.pipeline.verify import forecasts

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def checkpoint(cli, store, tmp_path_factory):
    root = tmp_path_factory.mktemp("fc_runs")
    cli(
        "train",
        "fit",
        "-c",
        str(ROOT / "configs/train/mlp_t850.yaml"),
        "--data.cfg.store",
        str(store),
        "--trainer.default_root_dir",
        str(root),
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.max_epochs",
        "2",
        "--data.cfg.batch_size",
        "2",
        check=True,
    )
    return sorted(root.rglob("best*.ckpt"))[-1]


def test_forecast_range_is_cf_and_matches_the_evaluated_model(cli, checkpoint, synth_zarr, store, tmp_path):
    out = tmp_path / "fc"
    args = [
        "forecast",
        "--checkpoint",
        str(checkpoint),
        "--input",
        str(synth_zarr),
        "--init-time",
        "2016-01-01",
        "--end",
        "2017-12-31",
        "--thresholds",
        "270,280",
        "--format",
        "netcdf,zarr",
        "--out",
        str(out),
    ]
    proc = cli(*args, check=True)
    files = sorted((out / "postprocessed/mlp/t850").glob("*.nc"))
    assert len(files) == 6 and "written 12 (0 fallback)" in proc.stdout
    ds = xr.open_mfdataset(files)
    assert ds.sizes == {
        "forecast_reference_time": 6,
        "latitude": 19,
        "longitude": 36,
        "quantile": 7,
        "threshold": 2,
        "realization": 10,
    }
    assert ds.attrs["Conventions"] == "CF-1.8" and ds.attrs["product"] == "postprocessed"
    assert len(ds.attrs["checkpoint_sha256"]) == 64 and ds["t850_mean"].attrs["units"] == "K"
    assert ((ds["time"] - ds["forecast_reference_time"]).values == np.timedelta64(48, "h")).all()
    q = ds["t850_quantile"].values
    assert (np.diff(q, axis=0) > 0).all()  # quantiles increase with the level
    p = ds["t850_exceedance_probability"].values
    assert ((p >= 0) & (p <= 1)).all() and (p[1] <= p[0]).all()
    raw = xr.open_zarr(synth_zarr / "forecast.zarr", consolidated=False)["t"].sel(isobaricInhPa=850, step="48h")
    raw = raw.sel(time=ds["forecast_reference_time"].values, latitude=ds["latitude"], longitude=ds["longitude"])
    members = raw.transpose("number", "time", "latitude", "longitude").values  # read with xarray alone
    np.testing.assert_allclose(ds["t850_raw_member"].values, members, rtol=1e-6)  # the input's, beside the law
    # the same model through the evaluation path on the store gives the same mean and std
    _, times, mu, sigma = forecasts.predict_checkpoint(str(checkpoint), str(store), "test")
    np.testing.assert_allclose(ds["t850_mean"].sel(forecast_reference_time=times).values, mu, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(ds["t850_std"].sel(forecast_reference_time=times).values, sigma, rtol=1e-4, atol=1e-5)
    z = xr.open_zarr(out / "postprocessed/mlp/t850" / files[0].name.replace(".nc", ".zarr"), consolidated=False)
    np.testing.assert_array_equal(z["t850_mean"].values, xr.open_dataset(files[0])["t850_mean"].values)
    checker = shutil.which("compliance-checker", path=Path(sys.executable).parent)
    assert checker, "compliance-checker is not installed: run scripts/setup.sh"
    cf = subprocess.run(
        [checker, "--test", "cf:1.8", "--criteria", "normal", str(files[0])],
        capture_output=True,
        text=True,
        check=False,
    )
    assert cf.returncode == 0 and "All tests passed" in cf.stdout, cf.stdout[-2000:]
    again = cli(*args, check=True)  # idempotent: nothing rewritten
    assert "written 0 (0 fallback), kept 12 existing" in again.stdout


def test_a_model_reading_the_land_channel_forecasts_as_it_is_evaluated(cli, store, synth_zarr, tmp_path):
    """A checkpoint with the land channel (``sample.land_feature``) finds it in the raw input's SST, which its
    T850 inputs do not otherwise read: the forecast's law is the evaluation path's on the store."""
    root, out = tmp_path / "runs", tmp_path / "fc"
    train = ["train", "fit", "-c", str(ROOT / "configs/train/mlp_t850.yaml"), "--data.cfg.store", str(store)]
    train += ["--data.cfg.sample.land_feature", "true", "--trainer.default_root_dir", str(root)]
    cli(*train, "--trainer.enable_progress_bar", "false", "--trainer.max_epochs", "1", check=True)
    ckpt = sorted(root.rglob("best*.ckpt"))[-1]
    window = ["--init-time", "2016-01-01", "--end", "2017-12-31", "--out", str(out)]
    proc = cli("forecast", "--checkpoint", str(ckpt), "--input", str(synth_zarr), *window, check=True)
    assert "(0 fallback)" in proc.stdout
    ds = xr.open_mfdataset(sorted((out / "postprocessed/mlp/t850").glob("*.nc")))
    _, times, mu, sigma = forecasts.predict_checkpoint(str(ckpt), str(store), "test")
    np.testing.assert_allclose(ds["t850_mean"].sel(forecast_reference_time=times).values, mu, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(ds["t850_std"].sel(forecast_reference_time=times).values, sigma, rtol=1e-4, atol=1e-5)


def test_forecasts_carry_climatological_exceedance_thresholds_by_default(cli, checkpoint, synth_zarr, store, tmp_path):
    """Without --thresholds the files had an empty threshold dimension (the service answered
    "exceedance": {}); now they carry the 10/50/90 % quantiles of the training truth, recorded in the
    checkpoint at fit, and the service answers with them."""

    from postcast.serve.testing import running_server

    out = tmp_path / "fc"
    cli(
        "forecast",
        "--checkpoint",
        str(checkpoint),
        "--input",
        str(synth_zarr),
        "--init-time",
        "2017-01-01",
        "--end",
        "2017-12-31",
        "--out",
        str(out),
        check=True,
    )
    ds = xr.open_dataset(sorted((out / "postprocessed/mlp/t850").glob("*.nc"))[0])
    store_ds = xr.open_zarr(store, consolidated=False)
    train = store_ds["split"].values == 0  # the training rows (2012-2013): quantiles by hand, numpy alone
    y = store_ds["truth_t850"].sel(step=np.timedelta64(48, "h")).values[train]
    expected = np.quantile(y[np.isfinite(y[:, 0, 0])], [0.1, 0.5, 0.9])
    np.testing.assert_allclose(ds["threshold"].values, expected, rtol=1e-3)
    assert ds["t850_exceedance_probability"].shape[0] == 3
    with running_server(out) as url:
        body = web.get(f"{url}/forecast/point", params={"target": "t850", "lat": 45, "lon": 10}).json()
    assert len(body["exceedance"]) == 3 and all(0 <= p <= 1 for p in body["exceedance"].values())


def test_fallback_when_model_inputs_are_missing(cli, checkpoint, synth_zarr, tmp_path):
    raw = xr.open_zarr(synth_zarr / "forecast.zarr", consolidated=False)  # ENS-10/cfgrib names: time = init
    only_t = raw[["t"]].isel(time=[-2, -1])  # the target variable only: the model's other inputs are missing
    src = tmp_path / "raw_t_only.zarr"
    only_t.to_zarr(src, zarr_format=3, consolidated=False)
    out = tmp_path / "fc"
    proc = cli(
        "forecast",
        "--checkpoint",
        str(checkpoint),
        "--input",
        str(src),
        "--init-time",
        "2016-01-01",
        "--end",
        "2017-12-31",
        "--out",
        str(out),
        check=True,
    )
    files = sorted((out / "fallback_raw/mlp/t850").glob("*.nc"))
    assert len(files) == 2 and "(2 fallback)" in proc.stdout
    ds = xr.open_dataset(files[0])
    assert ds.attrs["postcast_fallback"] == 1 and "missing" in ds.attrs["comment"]
    raw_t = only_t["t"].isel(time=0).sel(step=np.timedelta64(48, "h"), isobaricInhPa=850)
    raw_mean = raw_t.mean("number").sortby("latitude")  # the store and outputs have ascending latitude
    np.testing.assert_allclose(ds["t850_mean"].values[0], raw_mean.values, rtol=1e-6)  # the raw ensemble mean


def test_bad_input_gives_clean_errors(cli, checkpoint, tmp_path):
    corrupt = tmp_path / "raw"
    corrupt.mkdir()
    (corrupt / "output.pl.20180102").write_bytes(b"GRIB" + b"\0" * 100)
    proc = cli(
        "forecast",
        "--checkpoint",
        str(checkpoint),
        "--input",
        str(corrupt),
        "--init-time",
        "2017-01-02",
        "--out",
        str(tmp_path / "o"),
    )
    assert proc.returncode in (65, 66) and "Traceback" not in proc.stderr
    proc = cli(
        "forecast",
        "--checkpoint",
        str(tmp_path / "nope.ckpt"),
        "--input",
        str(corrupt),
        "--init-time",
        "2017-01-02",
        "--out",
        str(tmp_path / "o"),
    )
    assert proc.returncode == 66 and "no such file" in proc.stderr
    proc = cli(
        "forecast",
        "--checkpoint",
        str(checkpoint),
        "--input",
        str(corrupt),
        "--init-time",
        "tomorrow-ish",
        "--out",
        str(tmp_path / "o"),
    )
    assert proc.returncode == 2


def test_two_models_never_share_a_product_path(cli, checkpoint, synth_zarr, tmp_path):
    """The products of two models (here: the same checkpoint under two names, and the default name)
    land in separate files; before, every model's file was <product>/<target>/<target>_<init>.nc."""
    from postcast.pipeline.forecast import ForecastConfig, forecast

    out = tmp_path / "fc"
    written = []
    for name in (None, "mlp_a", "mlp_b"):
        written += forecast(
            ForecastConfig(
                checkpoint=str(checkpoint),
                input=str(synth_zarr),
                out=str(out),
                init_time="2017-06-01",
                end="2017-12-31",
                name=name,
            )
        ).written
    files = sorted(str(f.relative_to(out)) for f in out.rglob("*.nc"))
    assert len(files) == len(written) == len(set(written)) == 3 * 2  # 2 dates per model, no file shared
    assert {Path(f).parts[1] for f in files} == {"mlp", "mlp_a", "mlp_b"}
    bad = cli(
        "forecast",
        "--checkpoint",
        str(checkpoint),
        "--input",
        str(synth_zarr),
        "--init-time",
        "2017-06-01",
        "--out",
        str(out),
        "--name",
        "../x",
    )
    assert bad.returncode == 2 and "name" in bad.stderr


@pytest.fixture(scope="module")
def t2m_checkpoint(store, tmp_path_factory):
    """A surface-target (T2m) checkpoint: local EMOS, 2 epochs, trained in-process on the tiny store."""
    from postcast.pipeline import train

    root = tmp_path_factory.mktemp("t2m_runs")
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
            "2",
        ]
    )
    return Path(run.trainer.checkpoint_callback.best_model_path)


@pytest.mark.system  # minutes of CPU: a whole-process run or training (tests/tiers.py)
@pytest.mark.parametrize("form", ["netcdf", "grib"])
@pytest.mark.parametrize("target", ["t2m", "t850"])
def test_every_target_from_every_input_form(request, target, form, checkpoint, t2m_checkpoint, synth_zarr, tmp_path):
    """Issue 17 defect 2: a T2m forecast from zarr or netCDF input crashed with KeyError: 'level'. Each target
    (surface and pressure level) forecasts from GRIB, netCDF and zarr, and the products agree with the zarr
    input's (GRIB within its 16-bit packing)."""
    from postcast.pipeline.forecast import ForecastConfig, forecast

    ckpt = t2m_checkpoint if target == "t2m" else checkpoint
    source = request.getfixturevalue(f"synth_{form}")
    means = {}
    for name, src in (("zarr", synth_zarr), (form, source)):
        res = forecast(
            ForecastConfig(
                checkpoint=str(ckpt), input=str(src), out=str(tmp_path / name), init_time="2017-01-01", end="2017-12-31"
            )
        )
        assert len(res.written) == 3 and not res.fallback, res
        means[name] = np.stack([xr.open_dataset(f)[f"{target}_mean"].values for f in sorted(res.written)])
    assert np.isfinite(means["zarr"]).all()
    tol = 0.05 if form == "grib" else 1e-5  # 16-bit packing of a ~100 K range: ~2e-3 K per input field
    np.testing.assert_allclose(means[form], means["zarr"], atol=tol)


def test_t2m_forecast_from_zarr_input(t2m_checkpoint, synth_zarr, tmp_path):
    """Issue 17 defect 2, zarr form: `postcast forecast` of a T2m checkpoint on the synth directory."""
    from postcast.cli import main

    rc = main(
        [
            "--no-progress",
            "forecast",
            "--checkpoint",
            str(t2m_checkpoint),
            "--input",
            str(synth_zarr),
            "--init-time",
            "2016-01-01",
            "--end",
            "2017-12-31",
            "--out",
            str(tmp_path / "o"),
        ]
    )
    assert rc == 0
    files = sorted((tmp_path / "o/postprocessed/emos/t2m").glob("*.nc"))
    assert len(files) == 6 and np.isfinite(xr.open_dataset(files[0])["t2m_mean"].values).all()


def test_a_bug_inside_forecast_is_an_internal_error_with_a_log(
    cli, checkpoint, synth_zarr, tmp_path, monkeypatch, internal_error
):
    planted_bug, assert_internal_error = internal_error
    monkeypatch.setattr("postcast.pipeline.forecast.products", planted_bug)
    proc = cli(
        "forecast",
        "--checkpoint",
        str(checkpoint),
        "--input",
        str(synth_zarr),
        "--init-time",
        "2017-01-01",
        "--end",
        "2017-12-31",
        "--out",
        str(tmp_path / "fc"),
    )
    assert_internal_error(proc)
    assert not list((tmp_path / "fc").rglob("*.nc"))


def test_each_forecast_input_is_checked_once(cli, checkpoint, synth_zarr, tmp_path, monkeypatch):
    """The source checked the values it loaded and the forecast checked them again."""
    from postcast.datasets.sources import base

    calls = []
    check = base.check_values
    monkeypatch.setattr(base, "check_values", lambda ds, where: calls.append(where) or check(ds, where))
    cli(
        "forecast",
        "--checkpoint",
        str(checkpoint),
        "--input",
        str(synth_zarr),
        "--init-time",
        "2017-01-01",
        "--end",
        "2017-12-31",
        "--out",
        str(tmp_path / "fc"),
        check=True,
    )
    written = list((tmp_path / "fc").rglob("*.nc"))
    assert written and len(calls) == len(written), calls


def test_a_rerun_keeps_a_product_only_when_its_inputs_match(cli, checkpoint, synth_zarr, store, tmp_path, caplog):
    """`forecast` with another checkpoint of the same family said "kept 1 existing" although the file
    belonged to the other checkpoint. Existing products are kept only when made by the same checkpoint
    (by content), input, quantiles and thresholds; otherwise the rerun says so and rebuilds them."""
    import logging

    import xarray as xr

    from postcast.datasets.core import checksums

    out = tmp_path / "fc"
    args = [
        "forecast",
        "--input",
        str(synth_zarr),
        "--init-time",
        "2017-06-01",
        "--end",
        "2017-12-31",
        "--out",
        str(out),
    ]
    first = cli(*args, "--checkpoint", str(checkpoint), check=True)
    assert "written 2 (0 fallback), kept 0" in first.stdout
    assert "written 0 (0 fallback), kept 2" in cli(*args, "--checkpoint", str(checkpoint), check=True).stdout
    other = tmp_path / "other.ckpt"  # the same family, other weights: a second fit of one more epoch
    cli(
        "train",
        "fit",
        "-c",
        str(ROOT / "configs/train/mlp_t850.yaml"),
        "--data.cfg.store",
        str(store),
        "--trainer.default_root_dir",
        str(tmp_path / "runs"),
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.max_epochs",
        "1",
        "--data.cfg.batch_size",
        "2",
        check=True,
    )
    other.write_bytes(sorted((tmp_path / "runs").rglob("best*.ckpt"))[-1].read_bytes())
    with caplog.at_level(logging.WARNING):
        again = cli(*args, "--checkpoint", str(other), check=True)
    assert "written 2 (0 fallback), kept 0" in again.stdout
    assert "made with another checkpoint_sha256; rebuilding it" in caplog.text
    for f in sorted((out / "postprocessed/mlp/t850").glob("*.nc")):
        assert xr.open_dataset(f).attrs["checkpoint_sha256"] == checksums.sha256_file(other)
    changed = cli(*args, "--checkpoint", str(other), "--thresholds", "280", check=True)
    assert "written 2 (0 fallback), kept 0" in changed.stdout


def test_fallback_reason_names_forecast_options(cli, checkpoint, synth_zarr, tmp_path, caplog):
    """The fallback's reason (logged, and the product's comment) names what forecast can change (--input,
    --checkpoint): it said 'pass --variables t', an option of ingest."""
    raw = xr.open_zarr(synth_zarr / "forecast.zarr", consolidated=False)
    src = tmp_path / "raw_t_only.zarr"
    raw[["t"]].isel(time=[-1]).to_zarr(src, zarr_format=3, consolidated=False)
    with caplog.at_level("WARNING", "postcast.pipeline.forecast"):
        cli(
            "forecast",
            "--checkpoint",
            str(checkpoint),
            "--input",
            str(src),
            "--init-time",
            "2016-01-01",
            "--end",
            "2017-12-31",
            "--out",
            str(tmp_path / "fc"),
            check=True,
        )
    comment = xr.open_dataset(next((tmp_path / "fc").rglob("*.nc"))).attrs["comment"]
    said = [r.getMessage() for r in caplog.records if "fallback" in r.getMessage()]
    assert len(said) == 1 and comment in said[0], said
    assert "--variables" not in comment and "--input" in comment and "--checkpoint" in comment, comment
    assert "missing the variables" in comment and "(it has t)" in comment, comment


@pytest.fixture(scope="module")
def regional_ckpt(tmp_path_factory):
    """A local EMOS trained on a regional (Europe, 2 deg) T2m store, as in tests/test_layouts.py."""
    from test_layouts import EUROPE, _truth_nc, write_ecmwf

    from postcast.datasets.ingest.run import IngestConfig, ingest
    from postcast.pipeline import train

    root = tmp_path_factory.mktemp("regional_fc")
    dates = [pd.Timestamp(d) for d in ("2010-01-01", "2010-01-02", "2014-01-01", "2016-01-01")]
    src = write_ecmwf(root / "eu.grib2", grid=EUROPE, members=range(5), steps=(0, 24, 48), dates=dates)
    truth = _truth_nc(root / "era5.nc", [d + pd.Timedelta(hours=48) for d in dates])
    ingest(
        IngestConfig(
            source=str(src), out=str(root / "eu.zarr"), truth=str(truth), processes=False, progress=False, grid=2.0
        )
    )
    run = train.run(
        [
            "fit",
            "-c",
            str(ROOT / "configs/train/tiny_emos_t2m.yaml"),
            "--data.cfg.store",
            str(root / "eu.zarr"),
            "--data.cfg.sample.variables",
            "[t2m]",
            "--trainer.default_root_dir",
            str(root / "runs"),
            "--trainer.max_epochs",
            "1",
        ]
    )
    return Path(run.trainer.checkpoint_callback.best_model_path)


def test_on_input_grid_with_a_regional_checkpoint_is_cut_to_its_area(regional_ckpt, tmp_path):
    """A regional checkpoint, a global 1 deg input, --on-input-grid: the product is the input's 1 deg
    grid over the checkpoint's area (30..70 N, 340..400 E: 41 x 61), finite everywhere, and the service's
    reader takes it (it was the whole globe, 95% NaN, refused by the reader)."""
    from test_layouts import INIT, write_ecmwf

    from postcast.pipeline.forecast import ForecastConfig, forecast
    from postcast.pipeline.products import archive

    src = write_ecmwf(tmp_path / "glob.grib2", grid=("ll", 1.0, (90, -90, 0, 359)), members=range(5), steps=(48,))
    res = forecast(
        ForecastConfig(
            checkpoint=str(regional_ckpt),
            input=str(src),
            out=str(tmp_path / "o"),
            init_time=str(INIT.date()),
            on_input_grid=True,
        )
    )
    ds = xr.open_dataset(res.written[0])
    assert ds.sizes["latitude"] == 41 and ds.sizes["longitude"] == 61 and ds.attrs["output_grid"] == "input"
    np.testing.assert_allclose(ds["longitude"].values, 340.0 + np.arange(61))
    np.testing.assert_allclose(ds["latitude"].values, 30.0 + np.arange(41))
    assert np.isfinite(ds["t2m_mean"].values).all() and np.isfinite(ds["t2m_std"].values).all()
    found, skipped = archive.scan(tmp_path / "o")
    assert not skipped and len(found) == 1
    archive.read_field(found[0])  # the service's reader: raises UnreadableProduct on NaN


def test_thresholds_given_to_forecast_are_served_as_given(cli, checkpoint, synth_zarr, tmp_path):
    """Issue 40 item 3: the service guessed where a file's thresholds came from; three values given to
    `forecast --thresholds` for T850 (no thresholds of its own) were called the training climate's 10/50/90 %
    quantiles. The file now records it (attribute threshold_source) and the answer says it."""
    from fastapi.testclient import TestClient

    from postcast.serve.app import create_app

    runs = {"given": ["--thresholds", "270,275,280"], "training_climate": []}
    for source, extra in runs.items():
        out = tmp_path / source
        cli("forecast", "--checkpoint", str(checkpoint), "--input", str(synth_zarr), "--init-time", "2017-01-01",
            "--end", "2017-12-31", "--out", str(out), *extra, check=True)  # fmt: skip
        product = next((out / "postprocessed/mlp/t850").glob("*.nc"))
        assert xr.open_dataset(product).attrs["threshold_source"] == source
        with TestClient(create_app(out, watch_s=None)) as client:
            law = client.get("/forecast/point", params={"target": "t850", "lat": 45, "lon": 10}).json()["law"]
        assert law["thresholds"]["source"] == source, law
