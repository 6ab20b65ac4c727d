"""Ingestion end to end through temporary zarr stores: values, sizes, chunks, statistics, resume."""

import json
import signal
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from postcast.datasets import conventions, ingest, io, schema, statistics, synthetic
from postcast.datasets import store as contract
from postcast.datasets.ingest import IngestConfig


def test_store_layout_and_values(store, tiny_cfg):
    ds = contract.open_store(store)
    n = len(tiny_cfg.init_times)
    assert dict(ds.sizes) == {"init_time": n, "member": 10, "step": 3, "level": 2, "latitude": 19, "longitude": 36}
    assert ds.attrs["postcast_complete"] and ds.attrs["postcast_store_version"] == contract.FORMAT_VERSION
    assert set(schema.VARIABLES) <= set(ds.data_vars)
    assert ds["latitude"].values[0] == -90  # canonical orientation after the ENS-10 north->south source
    # chunks: one init date per chunk, all members, whole grid
    assert ds["t"].encoding["chunks"] == (1, 10, 3, 2, 19, 36)
    assert ds["ens_mean_t2m"].encoding["chunks"] == (1, 3, 19, 36)
    # values equal the generator exactly (zarr path is lossless float32)
    w = synthetic.world(tiny_cfg.seed, tiny_cfg.resolution)
    t0 = pd.Timestamp(ds.init_time.values[4])
    want = w.members_field("t", 850, t0, 24).astype(np.float32)
    got = ds["t"].sel(init_time=t0, level=850, step=pd.Timedelta(hours=24)).values
    np.testing.assert_array_equal(got, want)
    x = ds["z"].sel(init_time=t0, level=500).values.astype(np.float64)
    np.testing.assert_allclose(ds["ens_mean_z"].sel(init_time=t0, level=500).values, x.mean(0), rtol=1e-6)
    np.testing.assert_allclose(ds["ens_std_z"].sel(init_time=t0, level=500).values, x.std(0), rtol=1e-4)
    o = w.oracle("t850", t0, 48)
    np.testing.assert_array_equal(ds["truth_t850"].sel(init_time=t0, step=pd.Timedelta(hours=48)).values,
                                  o["truth"].astype(np.float32))
    np.testing.assert_array_equal(ds["oracle_std_t850"].sel(init_time=t0, step=pd.Timedelta(hours=48)).values,
                                  o["std"].astype(np.float32))
    codes = ds["split"].values
    years = pd.DatetimeIndex(ds.init_time.values).year
    assert (codes[years <= 2013] == 0).all() and (codes[years >= 2016] == 2).all()
    assert ds.attrs["sources"] and all(v.startswith(("sha256:", "tree-sha256:")) for v in ds.attrs["sources"].values())
    assert ds.attrs["code_version"].startswith("0.")


def test_statistics_use_training_years_only(store):
    ds = contract.open_store(store)
    st = contract.open_statistics(store)
    train = ds.sel(init_time=ds.split == 0)
    x = train["t"].sel(level=850, step=pd.Timedelta(hours=48)).values.astype(np.float64)
    assert st["t_mean"].sel(level=850, step=pd.Timedelta(hours=48)).item() == pytest.approx(x.mean(), rel=1e-9)
    assert st["t_std"].sel(level=850, step=pd.Timedelta(hours=48)).item() == pytest.approx(x.std(), rel=1e-6)
    assert st["t_max"].sel(level=850, step=pd.Timedelta(hours=48)).item() == pytest.approx(x.max())
    e = train["ens_std_t"].sel(level=850, step=pd.Timedelta(hours=48)).values.astype(np.float64)
    pt = st["ens_std_t_point_mean"].sel(level=850, step=pd.Timedelta(hours=48)).values
    np.testing.assert_allclose(pt, e.mean(0), rtol=1e-6)
    np.testing.assert_allclose(st["ens_std_t_point_std"].sel(level=850, step=pd.Timedelta(hours=48)).values,
                               e.std(0), rtol=1e-5, atol=1e-7)
    xp = st["t_point_max"].sel(level=850, step=pd.Timedelta(hours=48)).values
    np.testing.assert_allclose(xp, x.max((0, 1)), rtol=1e-6)
    assert set(statistics.STAT_KINDS) == {"mean", "std", "min", "max"}
    allyears = ds["t"].sel(level=850, step=pd.Timedelta(hours=48)).values.astype(np.float64).mean()
    assert allyears != pytest.approx(x.mean(), rel=1e-9)  # the test years would change it
    assert st.attrs["statistics_end"] <= "2013-12-31"
    sst = st["ens_mean_sst_point_mean"].sel(step=pd.Timedelta(hours=0)).values
    assert np.isnan(sst).any() and np.isfinite(sst).any()  # land stays NaN, oceans have statistics
    assert np.isfinite(st["sst_mean"].values).all()
    assert "truth_z500_mean" in st and "ens_std_t2m_point_std" in st


@pytest.mark.parametrize("chunked", [False, True], ids=["numpy", "dask"])
def test_pure_cores_on_numpy_and_dask(chunked, tiny_cfg):
    fc = synthetic.forecast_dataset(tiny_cfg, variables=["t", "sst"]).isel(init_time=slice(0, 4)).compute()
    fc = fc.chunk({"init_time": 1}) if chunked else fc
    ens = ingest.ensemble_statistics(fc)
    assert (ens["ens_std_t"].chunks is not None) == chunked
    ref = fc["t"].values.astype(np.float64)
    np.testing.assert_allclose(ens["ens_std_t"].values, ref.std(1), rtol=1e-4)
    raw = conventions.to_ens10(fc)
    back = conventions.normalise(raw, source="test")
    assert (back["t"].chunks is not None) == chunked
    xr.testing.assert_identical(back["t"].drop_attrs(), fc["t"].drop_attrs())
    st = statistics.compute_statistics(fc, schema.Splits(train=(2012, 2012), val=(2013, 2013), test=(2014, 2017)))
    np.testing.assert_allclose(st["t_mean"].values,
                               ref[pd.DatetimeIndex(fc.init_time.values).year == 2012].mean((0, 1, 4, 5)), rtol=1e-9)


def test_conventions_convert_units_and_names(tiny_cfg):
    fc = synthetic.forecast_dataset(tiny_cfg, variables=["t", "z", "msl", "tp", "tcc"]).isel(init_time=[0]).compute()
    raw = conventions.to_ens10(fc)
    raw["t"] = (raw["t"] - 273.15).assign_attrs(units="degC")
    raw["z"] = (raw["z"] / schema.GRAVITY).assign_attrs(units="gpm")
    raw["msl"] = (raw["msl"] / 100).assign_attrs(units="hPa")
    raw["tp"] = (raw["tp"] * 1000).assign_attrs(units="mm")
    raw["tcc"] = (raw["tcc"] * 100).assign_attrs(units="%")
    raw = raw.rename({"t": "T", "isobaricInhPa": "plev"}).assign_coords(plev=raw.isobaricInhPa.values * 100.0)
    raw["plev"].attrs["units"] = "Pa"
    back = conventions.normalise(raw, source="test")
    for v in ("t", "z", "msl", "tp", "tcc"):
        np.testing.assert_allclose(back[v].values, fc[v].values, rtol=1e-5, atol=1e-6)
        assert back[v].attrs["units"] == schema.VARIABLES[v].units
    assert list(back.level.values) == [500, 850]


def test_rerun_is_a_no_op(store, synth_zarr):
    before = (store / "zarr.json").stat().st_mtime_ns
    res = ingest.ingest(IngestConfig(source=str(synth_zarr), out=str(store), processes=False, progress=False))
    assert res.skipped and (store / "zarr.json").stat().st_mtime_ns == before


def test_grib_source_matches_zarr_source(synth_grib, store, tmp_path):
    """The GRIB path ends in the same store as the zarr path, within 16-bit packing error."""
    out = tmp_path / "g.zarr"
    ingest.ingest(IngestConfig(source=str(synth_grib), out=str(out), processes=False, progress=False))
    g, z = contract.open_store(out), contract.open_store(store)
    assert dict(g.sizes) == dict(z.sizes)
    for v in ("z", "t2m", "tp", "q"):
        a, b = g[v].values, z[v].values
        rng = np.nanmax(b) - np.nanmin(b)
        assert np.nanmax(np.abs(a - b)) <= rng / 2**15, v
    # ERA5 netCDF holds only the 48 h valid dates: steps 0/24 have no truth, 48 h equals the zarr truth
    t48 = pd.Timedelta(hours=48)
    np.testing.assert_allclose(g["truth_t2m"].sel(step=t48).values, z["truth_t2m"].sel(step=t48).values, rtol=1e-6)
    assert np.isnan(g["truth_t2m"].sel(step=pd.Timedelta(0)).values).all()
    assert all(len(v) == 0 for v in g.attrs["truth_missing_at_48h"].values())


def test_netcdf_source(tmp_path, tiny_cfg):
    from postcast.datasets import synthfiles

    cfg = synthetic.SynthConfig(**{**tiny_cfg.to_dict(), "format": "netcdf", "years": (2012, 2013),
                                   "levels": (850,), "dates_per_year": 1})
    synthfiles.write_synthetic(cfg, tmp_path / "nc", progress=False)
    out = tmp_path / "nc.zarr"
    ingest.ingest(IngestConfig(source=str(tmp_path / "nc"), out=str(out), processes=False, progress=False))
    ds = contract.open_store(out)
    w = synthetic.world(cfg.seed, cfg.resolution)
    t0 = pd.Timestamp(ds.init_time.values[1])
    np.testing.assert_array_equal(ds["u10"].sel(init_time=t0, step=pd.Timedelta(0)).values,
                                  w.members_field("u10", 0, t0, 0).astype(np.float32))


def test_forecast_only_input_works(tmp_path, synth_zarr):
    src = tmp_path / "fc_only"
    src.mkdir()
    (src / "forecast.zarr").symlink_to(synth_zarr / "forecast.zarr")
    out = tmp_path / "fc.zarr"
    ingest.ingest(IngestConfig(source=str(src), out=str(out), processes=False, progress=False,
                               variables=("t", "z", "t2m")))
    ds = contract.open_store(out)
    assert "truth_t850" not in ds and set(ds.data_vars) >= {"t", "z", "t2m", "ens_mean_t"}
    assert "q" not in ds


def test_distributed_two_worker_local_cluster(synth_zarr, tmp_path):
    """The default path (a LocalCluster of 2 worker processes) and an external scheduler address."""
    from dask.distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        out = tmp_path / "dist.zarr"
        res = ingest.ingest(IngestConfig(source=str(synth_zarr), out=str(out), scheduler=cluster.scheduler_address,
                                         progress=False, variables=("t", "t2m", "tp")))
        assert res.n_written == res.n_dates == 18
        assert len(client.scheduler_info()["workers"]) == 2
    ds = contract.open_store(out)
    assert np.isfinite(ds["t"].values).all() and np.isfinite(ds["truth_t2m"].values).all()


def test_kill_and_resume(synth_zarr, tmp_path, store, cli):
    """Kill `postcast ingest` mid-run: OUT never looks complete; a rerun resumes and finishes."""
    out = tmp_path / "killed.zarr"
    partial = tmp_path / "killed.zarr.partial"
    cmd = [sys.executable, "-m", "postcast", "--no-progress", "ingest", str(synth_zarr), "--out", str(out),
           "--workers", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        done = list((partial / "done").glob("[!.]*")) if (partial / "done").exists() else []
        if len(done) >= 2:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "ingest finished before it could be killed"
    import os

    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    n_done = len(list((partial / "done").glob("[!.]*")))  # not a marker's temp file the kill left behind
    assert 0 < n_done < 18 and not out.exists()
    shown = cli("inspect", str(out))
    assert shown.returncode == 66 and "INCOMPLETE" in shown.stdout
    with pytest.raises(Exception, match=r"incomplete|not a postcast store"):
        contract.open_store(out)
    proc = cli("ingest", str(synth_zarr), "--out", str(out), "--workers", "1", check=True)
    written = int(proc.stdout.split(":")[1].split()[0])
    assert written == 18 - n_done  # only the unfinished dates
    assert not partial.exists()
    a, b = contract.open_store(out), contract.open_store(store)
    for v in ("t", "ens_std_t2m", "truth_z500", "oracle_mean_t2m"):
        np.testing.assert_array_equal(a[v].values, b[v].values)


def test_interrupted_ingest_with_other_settings_needs_restart(synth_zarr, tmp_path):
    out = tmp_path / "x.zarr"
    partial = tmp_path / "x.zarr.partial"
    partial.mkdir()
    io.write_json(partial / "plan.json", {"config": "something else"})
    (partial / "store.zarr").mkdir()
    with pytest.raises(Exception, match="--restart"):
        ingest.ingest(IngestConfig(source=str(synth_zarr), out=str(out), processes=False, progress=False))
    res = ingest.ingest(IngestConfig(source=str(synth_zarr), out=str(out), processes=False, progress=False,
                                     restart=True, variables=("t",)))
    assert res.n_written == 18 and not partial.exists()


def test_inspect_cli(store, cli):
    proc = cli("inspect", str(store), check=True)
    assert "complete   yes" in proc.stdout and "truth_t850" in proc.stdout and "statistics (train" in proc.stdout
    info = json.loads(cli("inspect", str(store), "--json", check=True).stdout)
    assert info["splits"] == {"train": 6, "val": 6, "test": 6, "none": 0}
    assert info["dims"]["member"] == 10 and info["levels_hPa"] == [500, 850]
    assert info["statistics"]["fields"]["t@850"]["min"] < info["statistics"]["fields"]["t@850"]["max"]


def test_own_netcdf_form_with_many_dates_equals_the_zarr_store(synth_netcdf, store, tmp_path):
    """Issue 15: `postcast synth --format netcdf` writes one file pair per month-day holding every year;
    ingest refused it ("monotonic global indexes along dimension time") as soon as there was more than one
    calendar day. The store from the netCDF form equals the one from the zarr form."""
    out = tmp_path / "nc.zarr"
    ingest.ingest(IngestConfig(source=str(synth_netcdf), out=str(out), processes=False, progress=False))
    n, z = contract.open_store(out), contract.open_store(store)
    assert dict(n.sizes) == dict(z.sizes) and n.sizes["init_time"] == 18
    for v in ("z", "t", "t2m", "tp", "sst", "ens_std_t"):
        np.testing.assert_array_equal(n[v].values, z[v].values, err_msg=v)
    t48 = pd.Timedelta(hours=48)
    np.testing.assert_allclose(n["truth_t850"].sel(step=t48).values, z["truth_t850"].sel(step=t48).values, rtol=1e-6)
