"""Ingestion end to end through temporary zarr stores: values, sizes, chunks, statistics, resume."""

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr

import postcast.datasets.ingest.budget as ingest_budget
import postcast.datasets.ingest.layout as ingest_layout
import postcast.datasets.ingest.progress as ingest_progress
import postcast.datasets.ingest.tasks as ingest_tasks
from postcast.datasets import contract, integrity, io, schema, sources, statistics
from postcast.datasets.core import moments
from postcast.datasets.core.errors import ConfigError
from postcast.datasets.ingest import partials
from postcast.datasets.ingest import run as ingest
from postcast.datasets.ingest.run import IngestConfig
from postcast.datasets.sources import conventions
from postcast.datasets.synth import synthetic


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
    np.testing.assert_array_equal(
        ds["truth_t850"].sel(init_time=t0, step=pd.Timedelta(hours=48)).values, o["truth"].astype(np.float32)
    )
    np.testing.assert_array_equal(
        ds["oracle_std_t850"].sel(init_time=t0, step=pd.Timedelta(hours=48)).values, o["std"].astype(np.float32)
    )
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
    np.testing.assert_allclose(
        st["ens_std_t_point_std"].sel(level=850, step=pd.Timedelta(hours=48)).values, e.std(0), rtol=1e-5, atol=1e-7
    )
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
    ens = statistics.ensemble_statistics(fc)
    assert (ens["ens_std_t"].chunks is not None) == chunked
    ref = fc["t"].values.astype(np.float64)
    np.testing.assert_allclose(ens["ens_std_t"].values, ref.std(1), rtol=1e-4)
    raw = conventions.to_ens10(fc)
    back = conventions.normalise(raw, source="test")
    assert (back["t"].chunks is not None) == chunked
    xr.testing.assert_identical(back["t"].drop_attrs(), fc["t"].drop_attrs())
    st = statistics.compute_statistics(fc, schema.Splits(train=(2012, 2012), val=(2013, 2013), test=(2014, 2017)))
    np.testing.assert_allclose(
        st["t_mean"].values, ref[pd.DatetimeIndex(fc.init_time.values).year == 2012].mean((0, 1, 4, 5)), rtol=1e-9
    )


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


@pytest.mark.system  # minutes of CPU: a whole-process run or training (tests/tiers.py)
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


@pytest.mark.system  # minutes of CPU: a whole-process run or training (tests/tiers.py)
def test_netcdf_source(tmp_path, tiny_cfg):
    from postcast.datasets.synth import synthfiles

    cfg = synthetic.SynthConfig(
        **{**tiny_cfg.to_dict(), "format": "netcdf", "years": (2012, 2013), "levels": (850,), "dates_per_year": 1}
    )
    synthfiles.write_synthetic(cfg, tmp_path / "nc", progress=False)
    out = tmp_path / "nc.zarr"
    ingest.ingest(IngestConfig(source=str(tmp_path / "nc"), out=str(out), processes=False, progress=False))
    ds = contract.open_store(out)
    w = synthetic.world(cfg.seed, cfg.resolution)
    t0 = pd.Timestamp(ds.init_time.values[1])
    np.testing.assert_array_equal(
        ds["u10"].sel(init_time=t0, step=pd.Timedelta(0)).values, w.members_field("u10", 0, t0, 0).astype(np.float32)
    )


def test_forecast_only_input_works(tmp_path, synth_zarr):
    src = tmp_path / "fc_only"
    src.mkdir()
    (src / "forecast.zarr").symlink_to(synth_zarr / "forecast.zarr")
    out = tmp_path / "fc.zarr"
    ingest.ingest(
        IngestConfig(source=str(src), out=str(out), processes=False, progress=False, variables=("t", "z", "t2m"))
    )
    ds = contract.open_store(out)
    assert "truth_t850" not in ds and set(ds.data_vars) >= {"t", "z", "t2m", "ens_mean_t"}
    assert "q" not in ds


INGEST_TASKS = {
    "ingest_dates",
    "combine_fields",
    "checkpoint_partials",
    "write_statistics",
    "_checksum",
    "index_file",
    "stored_partials",
    "load_partials",
}


@pytest.mark.system
def test_distributed_two_worker_local_cluster(synth_grib, tmp_path):
    """The default path (a LocalCluster of 2 worker processes) and an external scheduler address. The
    cluster runs postcast's tasks only: a date task reads its forecast, truth and oracle itself (before,
    each `.load()` inside a task sent dozens of small dask tasks through the scheduler and waited on them)."""
    from dask.distributed import Client, LocalCluster, get_task_stream

    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
        Client(cluster) as client,
        get_task_stream(client) as stream,
    ):
        out = tmp_path / "dist.zarr"
        res = ingest.ingest(
            IngestConfig(
                source=str(synth_grib),
                out=str(out),
                scheduler=cluster.scheduler_address,
                progress=False,
                variables=("t", "t2m", "tp"),
            )
        )
        assert res.n_written == res.n_dates == 18
        assert len(client.scheduler_info()["workers"]) == 2
    names = {str(r["key"][0] if isinstance(r["key"], tuple) else r["key"]).split("-")[0] for r in stream.data}
    assert "ingest_dates" in names and names <= INGEST_TASKS, sorted(names - INGEST_TASKS)[:8]
    ds = contract.open_store(out)
    truth = ds["truth_t2m"].sel({schema.STEP: pd.Timedelta(hours=schema.TARGET_STEP_H)})  # ERA5 at 48 h
    assert np.isfinite(ds["t"].values).all() and np.isfinite(truth.values).all()


@pytest.mark.system
def test_kill_and_resume(synth_zarr, tmp_path, store, cli, monkeypatch):
    """Kill `postcast ingest` mid-run: OUT never looks complete; a rerun resumes, writes only the unfinished
    dates, reads back only the training dates finished after the last checkpoint of merged partials, and ends
    with the statistics of the store ingested in one go (issue 18)."""
    out = tmp_path / "killed.zarr"
    partial = tmp_path / "killed.zarr.partial"
    preset = tmp_path / "ingest.yaml"  # one date per task; per-date partials folded into merged.npz every 2 dates
    preset.write_text("kind: ingest\nworkers: 1\ndates_per_task: 1\ncheckpoint_dates: 2\n")
    cmd = [
        sys.executable,
        "-m",
        "postcast",
        "--no-progress",
        "ingest",
        "-c",
        str(preset),
        str(synth_zarr),
        "--out",
        str(out),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 600  # against a hang only
    while time.time() < deadline and proc.poll() is None:
        done = list((partial / "done").glob("[!.]*")) if (partial / "done").exists() else []
        if len(done) >= 2 and (partial / "stats" / "merged.npz").exists():  # kill after a checkpoint
            break
        time.sleep(0.002)
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
    covered = set(partials.partial_dates(partial / "stats" / "merged.npz"))
    done = {p.name for p in (partial / "done").glob("[!.]*")}
    assert covered and covered <= done
    times = pd.DatetimeIndex(contract.open_store(store).init_time.values)
    train = {f"{t:%Y%m%dT%H}" for t in times if schema.Splits().split_of(t.year) == "train"}
    after = sorted(times.get_loc(pd.Timestamp(f"{d[:8]} {d[9:]}:00")) for d in (done - covered) & train)
    reads = _spy_store_reads(monkeypatch)
    res = ingest.ingest(
        IngestConfig(
            source=str(synth_zarr),
            out=str(out),
            workers=1,
            processes=False,
            progress=False,
            dates_per_task=1,
            checkpoint_dates=2,
        )
    )
    assert res.n_written == 18 - n_done  # only the unfinished dates
    assert not partial.exists()
    read = _member_chunk_reads(reads, partial / "store.zarr")
    assert sorted({int(k.split("/")[2]) for k in read}) == after  # init-time chunk index of each read
    a, b = contract.open_store(out), contract.open_store(store)
    for v in ("t", "ens_std_t2m", "truth_z500", "oracle_mean_t2m"):
        np.testing.assert_array_equal(a[v].values, b[v].values)
    _assert_same_statistics(contract.open_statistics(out), contract.open_statistics(store))
    _assert_same_statistics(contract.open_statistics(out), statistics.compute_statistics(a, schema.Splits()))


def _spy_store_reads(monkeypatch) -> list[tuple[str, str]]:
    """Record (store root, key) of every zarr read through LocalStore in this process (a spy: the reads
    still happen). The zarrs Rust pipeline reads chunks without LocalStore.get, so zarr-python's own
    pipeline is pinned while the spy is on (the tests show that the spy sees reads, too)."""
    import zarr
    from zarr.storage import LocalStore

    monkeypatch.setitem(zarr.config.config["codec_pipeline"], "path", "zarr.core.codec_pipeline.BatchedCodecPipeline")
    reads: list[tuple[str, str]] = []
    real = LocalStore.get

    async def get(self, key, *args, **kwargs):
        reads.append((str(self.root), key))
        return await real(self, key, *args, **kwargs)

    monkeypatch.setattr(LocalStore, "get", get)
    return reads


def _member_chunk_reads(reads: list[tuple[str, str]], store) -> list[str]:
    """Chunk reads of the data arrays (not metadata, not coordinates) of the zarr store at ``store``."""
    coords = {"init_time", "member", "step", "level", "latitude", "longitude", "valid_time", "split"}
    return [
        key for root, key in reads if Path(root) == Path(store) and "/c/" in key and key.split("/")[0] not in coords
    ]


def _assert_same_statistics(got: xr.Dataset, want: xr.Dataset) -> None:
    """float64 per-variable statistics to float64 round-off, float32 per-point ones to a float32 ulp."""
    assert set(got.data_vars) == set(want.data_vars) and got.attrs == want.attrs
    for name in want.data_vars:
        g, w = got[name].values, want[name].values
        assert g.dtype == w.dtype, name
        if g.dtype == np.float64:
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=0, err_msg=name)
        else:
            scale = np.nanmax(np.abs(w)) if np.isfinite(w).any() else 0.0
            np.testing.assert_allclose(g, w, rtol=2.0**-23, atol=2.0**-23 * float(scale) * 1e-3, err_msg=name)


def test_one_pass_statistics_equal_the_two_pass_ones_without_reading_the_store(synth_zarr, tmp_path, monkeypatch):
    """Issue 18 item 1: statistics accumulate in the tasks that write each date and are merged exactly;
    the statistics step reads no data chunk back. The figures equal a second pass over the finished store
    (`compute_statistics`) and a plain float64 numpy computation, SST's land NaNs included."""
    reads = _spy_store_reads(monkeypatch)
    out = tmp_path / "one.zarr"
    ingest.ingest(
        IngestConfig(source=str(synth_zarr), out=str(out), processes=False, progress=False, variables=("t", "sst"))
    )
    assert _member_chunk_reads(reads, contract.partial_path(out) / "store.zarr") == []
    ds, st = contract.open_store(out), contract.open_statistics(out)
    splits = schema.Splits()
    _assert_same_statistics(st, statistics.compute_statistics(ds, splits))
    assert _member_chunk_reads(reads, out)  # the spy sees the second pass's reads
    train = ds.isel(init_time=np.flatnonzero(splits.mask(ds.init_time.values, "train")))
    for name in ("t", "sst", "ens_std_sst", "truth_t2m"):
        x = train[name].values.astype(np.float64)
        axes = tuple(i for i, d in enumerate(train[name].dims) if d in ("init_time", "member", "latitude", "longitude"))
        np.testing.assert_allclose(st[f"{name}_mean"].values, np.nanmean(x, axis=axes), rtol=1e-12)
        np.testing.assert_allclose(st[f"{name}_std"].values, np.nanstd(x, axis=axes), rtol=1e-10)
        np.testing.assert_array_equal(st[f"{name}_max"].values, np.nanmax(x, axis=axes))
        paxes = tuple(i for i, d in enumerate(train[name].dims) if d in ("init_time", "member"))
        with np.errstate(invalid="ignore"), pytest.warns(RuntimeWarning) if "sst" in name else _no_warning():
            pmean = np.nanmean(x, axis=paxes)
        np.testing.assert_allclose(st[f"{name}_point_mean"].values, pmean.astype(np.float32), rtol=2.0**-23)
    assert np.isnan(st["sst_point_mean"].values).any()  # land never has SST


def test_auto_statistics_take_the_second_pass_when_a_dates_partials_would_not_fit(synth_zarr, tmp_path):
    """The full ENS-10 shape at 0.5 deg needs ~15 GB per worker for one-pass statistics (the accumulator of
    merged partials, twice while a merge makes the next one): over ``one_pass_max_gb`` (by default 60% of
    the smallest worker's memory limit) the statistics come from the bounded-memory reduction over the store
    instead, with the same figures. ``partial_bytes`` is checked against a real accumulator's bytes."""
    cfg = IngestConfig(
        source=str(synth_zarr), out=str(tmp_path / "x.zarr"), processes=False, progress=False, variables=("t", "sst")
    )
    found = sources.discover(cfg.source, truth=cfg.truth)
    plan = found.forecast.plan(cfg.expectation)
    days = [
        ingest_tasks.load_date(found.forecast, found.truth, found.oracle, plan, i, partials=True)[1] for i in (0, 1)
    ]
    acc = moments.combine_fields(*days)
    points = plan.grid.shape[0] * plan.grid.shape[1]
    real = sum(
        a.nbytes if any(a.strides) else a.itemsize  # a broadcast count is one number
        for p in acc.values()
        for a in p.values()
        if np.ndim(a) and a.size >= points
    )
    budget = ingest_budget
    assert 0.9 < real / budget.partial_bytes(plan) <= 1.15, (real, budget.partial_bytes(plan))  # + SST counts
    need = budget.one_pass_bytes(plan) / 1e9
    assert budget.one_pass(cfg, plan, worker_gb=2 * need) and not budget.one_pass(cfg, plan, worker_gb=need)
    assert not budget.one_pass(cfg, plan, worker_gb=None)  # no limit known: the bounded path
    tiny = dataclasses.replace(cfg, one_pass_max_gb=1e-9)
    assert not budget.one_pass(tiny, plan, worker_gb=1e3)
    full = dataclasses.replace(
        plan, grid=schema.Grid(0.5), levels=schema.LEVELS, variables=tuple(schema.VARIABLES), steps_h=schema.STEPS_H
    )
    assert 1e10 < budget.one_pass_bytes(full) < 2e10 and not budget.one_pass(cfg, full, worker_gb=16)
    assert budget.one_pass(cfg, full, worker_gb=32)  # a 32 GB worker takes the full shape in one pass
    out = []
    for mode, c in (("two", tiny), ("one", dataclasses.replace(cfg, statistics="one-pass"))):
        ingest.ingest(dataclasses.replace(c, out=str(tmp_path / f"{mode}.zarr")))
        out.append(contract.open_statistics(tmp_path / f"{mode}.zarr"))
    _assert_same_statistics(out[1], out[0])
    with pytest.raises(ConfigError, match="statistics='fast'"):
        IngestConfig(source="x", out="y", statistics="fast")


def test_resume_reads_back_training_dates_done_without_merged_partials(synth_zarr, tmp_path):
    """An interrupted ingest left dates marked done (old-style markers, "done", without chunk checksums) and
    no merged partials: the resume writes only the other dates, reads the done training dates back from the
    store for their partials, and the statistics stay exact; the chunk manifest still covers every chunk
    (the old markers' chunks are hashed at the end), so `inspect --verify` passes."""
    out = tmp_path / "old.zarr"
    cfg = IngestConfig(source=str(synth_zarr), out=str(out), processes=False, progress=False, variables=("t",))
    found = sources.discover(cfg.source, truth=cfg.truth)
    plan = found.forecast.plan(cfg.expectation)
    run = ingest.IngestRun(cfg, found, plan, client=None, one_pass=True)  # preparing needs no cluster
    ingest._prepare(run)
    store_dir, done_dir = run.store, run.done_dir
    years = pd.DatetimeIndex(plan.init_times).year
    old = [int(i) for i in np.flatnonzero(years == 2012)] + [int(i) for i in np.flatnonzero(years == 2016)]
    for i in old:  # the old task: data and a bare marker
        ingest_tasks.ingest_dates(found.forecast, found.truth, found.oracle, plan, [i], str(store_dir), str(done_dir))
        io.write_text(done_dir / ingest_tasks.marker_name(plan.init_times[i]), "done\n")
    res = ingest.ingest(cfg)
    assert res.n_written == 18 - len(old)
    ds = contract.open_store(out)
    _assert_same_statistics(contract.open_statistics(out), statistics.compute_statistics(ds, schema.Splits()))
    report = integrity.verify(out)
    assert report.ok and report.recorded and report.checked > 0, report.to_dict()


def test_partial_moments_merge_associatively_and_match_numpy(tmp_path):
    """Chan's merge on a tiny case with NaNs and a never-valid point: ((a+b)+c) = (a+(b+c)) = the whole
    block = numpy's float64 nanmean/nanstd/nanmin/nanmax; saved and loaded partials are bit-identical."""
    rng = np.random.default_rng(7)
    x = (rng.normal(size=(6, 4, 3, 2, 5, 7)) * 50 + 5e4).astype(np.float32)  # (init, member, step, level, lat, lon)
    x[:, :, :, :, 0, :2] = np.nan  # "land": never valid
    x[rng.random(x.shape) < 0.05] = np.nan  # and scattered gaps
    axes = statistics.field_axes(("init_time", "member", "step", "level", "latitude", "longitude"))
    a, b, c = (moments.partial(x[i:j], *axes) for i, j in ((0, 1), (1, 4), (4, 6)))
    left = moments.combine(moments.combine(a, b), c)
    right = moments.combine(a, moments.combine(b, c))
    whole = moments.partial(x, *axes)
    x64 = x.astype(np.float64)
    with np.errstate(invalid="ignore"), pytest.warns(RuntimeWarning):  # numpy warns about the land points
        want = {
            "mean": np.nanmean(x64, axis=(0, 1, 4, 5)),
            "pmean": np.nanmean(x64, axis=(0, 1)),
            "std": np.nanstd(x64, axis=(0, 1, 4, 5)),
            "pstd": np.nanstd(x64, axis=(0, 1)),
            "pmin": np.nanmin(x, axis=(0, 1)),
        }
    for got in (left, right, whole):
        np.testing.assert_array_equal(got["n"], np.isfinite(x).sum((0, 1, 4, 5)))
        np.testing.assert_allclose(got["mean"], want["mean"], rtol=1e-14)
        np.testing.assert_allclose(np.sqrt(got["m2"] / got["n"]), want["std"], rtol=1e-12)
        np.testing.assert_array_equal(got["max"], np.nanmax(x, axis=(0, 1, 4, 5)))
        ok = got["pn"] > 0
        assert not ok[..., 0, :2].any() and ok[..., 1:, :].all()
        np.testing.assert_allclose(got["pmean"][ok], want["pmean"][ok], rtol=1e-14)
        np.testing.assert_allclose(np.sqrt(got["pm2"][ok] / got["pn"][ok]), want["pstd"][ok], rtol=1e-12)
        np.testing.assert_array_equal(got["pmin"][ok], want["pmin"][ok])
    one_date = moments.partial(
        x[:1, 0], *statistics.field_axes(("init_time", "step", "level", "latitude", "longitude"))
    )  # an ensemble statistic
    partials.save_partials({"t": left, "ens_mean_t": one_date}, tmp_path / "p.npz", dates=["20120101T00"])
    back = partials.load_partials(tmp_path / "p.npz")
    for name, part in (("t", left), ("ens_mean_t", one_date)):
        for key, v in part.items():
            assert back[name][key].dtype == v.dtype, (name, key)
            np.testing.assert_array_equal(back[name][key], v, err_msg=f"{name}/{key}")
    assert partials.partial_dates(tmp_path / "p.npz") == ["20120101T00"]


def _no_warning():
    import contextlib

    return contextlib.nullcontext()


def test_interrupted_ingest_with_other_settings_needs_restart(synth_zarr, tmp_path):
    out = tmp_path / "x.zarr"
    partial = tmp_path / "x.zarr.partial"
    partial.mkdir()
    io.write_json(partial / "plan.json", {"config": "something else"})
    (partial / "store.zarr").mkdir()
    with pytest.raises(Exception, match="--restart"):
        ingest.ingest(IngestConfig(source=str(synth_zarr), out=str(out), processes=False, progress=False))
    res = ingest.ingest(
        IngestConfig(
            source=str(synth_zarr), out=str(out), processes=False, progress=False, restart=True, variables=("t",)
        )
    )
    assert res.n_written == 18 and not partial.exists()


# another value for every IngestConfig option: a new option fails the test below until it gets one here
OTHER_VALUES = {
    "source": "elsewhere",
    "out": "other.zarr",
    "truth": "era5.zarr",
    "variables": ("t",),
    "levels": (500,),
    "members": 4,
    "steps": (0, 24),
    "grid": 2.0,
    "regrid_method": "nearest",
    "splits": schema.Splits(train=(2000, 2013)),
    "scheduler": "tcp://127.0.0.1:8786",
    "workers": 3,
    "processes": False,
    "dates_per_task": 2,
    "checkpoint_dates": 4,
    "statistics": "two-pass",
    "one_pass_max_gb": 8.0,
    "overwrite": True,
    "restart": True,
    "progress": False,
}


def test_the_resume_fingerprint_covers_every_option_not_marked_execution_only():
    """A resume continues an interrupted ingest only with the same fingerprint, so it must cover every option
    that changes the store's content and none of those that change how (or where) it is computed. The
    fingerprint comes from the declared fields: an option marked ``execution`` in its field's metadata
    (workers, progress, scheduler, ...) keeps it, any other option (variables, levels, grid, ...) changes it."""
    base = IngestConfig(source="src", out="store.zarr")
    names = {f.name for f in dataclasses.fields(IngestConfig)}
    assert set(OTHER_VALUES) == names, f"give OTHER_VALUES a value for {sorted(names - set(OTHER_VALUES))}"
    execution = {f.name for f in dataclasses.fields(IngestConfig) if f.metadata.get("execution")}
    assert {"workers", "progress", "scheduler", "out"} <= execution
    assert not {"source", "variables", "levels", "grid", "splits"} & execution
    for name, value in OTHER_VALUES.items():
        other = dataclasses.replace(base, **{name: value})
        same = other.fingerprint() == base.fingerprint()
        assert same == (name in execution), f"{name}={value!r}: fingerprint {'kept' if same else 'changed'}"


def test_inspect_cli(store, cli):
    proc = cli("inspect", str(store), check=True)
    assert "complete   yes" in proc.stdout and "truth_t850" in proc.stdout and "statistics (train" in proc.stdout
    info = json.loads(cli("inspect", str(store), "--json", check=True).stdout)
    assert info["splits"] == {"train": 6, "val": 6, "test": 6, "none": 0}
    assert info["dims"]["member"] == 10 and info["levels_hPa"] == [500, 850]
    assert info["statistics"]["fields"]["t@850"]["min"] < info["statistics"]["fields"]["t@850"]["max"]


@pytest.mark.system  # minutes of CPU: a whole-process run or training (tests/tiers.py)
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


def test_progress_line_counts_dates_rate_and_eta():
    """Issue 18 item 5: the numbers of a progress line, on a clock the test moves (6 of 10 dates, 4 of them
    in this run in 2 s at 5 MB each: 10 MB/s; 4 dates left at 0.5 s each: 2 s)."""
    now = [100.0]
    meter = ingest_progress.Progress(10, 2, 5_000_000, every_s=10.0, every_dates=3, clock=lambda: now[0])
    assert meter.line() == "ingest: 2/10 dates (20%), 0.0 MB/s, ETA ?"
    now[0] = 102.0
    meter.update(4)
    assert meter.rate() == pytest.approx(4 * 5.0 / 2.0)
    assert meter.eta() == pytest.approx(4 * 2.0 / 4)
    assert meter.line() == "ingest: 6/10 dates (60%), 10.0 MB/s, ETA 0:00:02"


def test_progress_is_logged_during_an_ingest(synth_zarr, tmp_path, caplog):
    """A small ingest logs dates done / total, MB/s of decoded member data and an ETA as dates finish."""
    import logging
    import re

    caplog.set_level(logging.INFO, logger="postcast.datasets.ingest.progress")
    out = tmp_path / "p.zarr"
    res = ingest.ingest(
        IngestConfig(
            source=str(synth_zarr), out=str(out), processes=False, progress=False, variables=("t",), dates_per_task=3
        )
    )
    pattern = re.compile(r"ingest: (\d+)/18 dates \((\d+)%\), (\d+\.\d) MB/s, ETA (\d+:\d\d:\d\d|\?)")
    lines = [m for r in caplog.records if (m := pattern.fullmatch(r.getMessage()))]
    done = [int(m[1]) for m in lines]
    assert done == [3, 6, 9, 12, 15, 18]  # a tenth of the run is below one task: every task is logged
    assert all(int(m[2]) == round(100 * int(m[1]) / 18) for m in lines)
    assert lines[-1][4] == "0:00:00"
    assert res.bytes_read == 18 * 4 * 19 * 36 * 10 * 3 * 2  # t: 10 members, 3 steps, 2 levels, 10 deg grid


def test_fused_ensemble_moments_match_numpy_and_the_forecast_path(synth_zarr):
    """Issue 18: the task computes ensemble mean/std and the training partials in one sweep per slice
    (`moments.ensemble_moments`). Its mean/std are the bits numpy's float64 mean/std(ddof=0) give and
    the bits `ensemble_statistics` (the forecast path) gives; its partials equal the general kernel's
    (`dataset_partials`) to float64 round-off, SST's land NaNs included."""
    src = sources.discover(str(synth_zarr)).forecast
    plan = src.plan(IngestConfig(source=str(synth_zarr), out="unused", variables=("t", "sst")).expectation)
    day = src.load(plan.init_times[0], plan)
    ref = statistics.ensemble_statistics(day)
    for name in ("t", "sst"):
        x = day[name].values
        mean, std, part = moments.ensemble_moments(x)
        x64 = x.astype(np.float64)
        np.testing.assert_array_equal(mean, np.mean(x, axis=1, dtype=np.float64).astype(np.float32))
        np.testing.assert_array_equal(std, np.std(x, axis=1, dtype=np.float64).astype(np.float32))
        np.testing.assert_array_equal(mean, ref[f"ens_mean_{name}"].values)
        np.testing.assert_array_equal(std, ref[f"ens_std_{name}"].values)
        want = statistics.dataset_partials(day[[name]])[name]
        assert part is not None and set(part) == set(want)
        scale = float(np.nanmax(np.abs(x64)))
        for key in want:
            got, exp = np.asarray(part[key]), np.asarray(want[key])
            if key.endswith("n"):  # counts: exact
                np.testing.assert_array_equal(got.astype(np.int64), exp.astype(np.int64), err_msg=key)
            else:  # m2 of a slice is ~1e8 x a value: an absolute float64 round-off floor
                np.testing.assert_allclose(got, exp, rtol=1e-12, atol=1e-9 * scale, err_msg=key)
        for stat, values in (("ens_mean", mean), ("ens_std", std)):
            got = moments.value_partial(values)
            exp = statistics.dataset_partials(
                xr.Dataset({"f": (("init_time", *ref[f"{stat}_{name}"].dims[1:]), values)})
            )["f"]
            for key in exp:
                np.testing.assert_allclose(
                    np.asarray(got[key], dtype=np.float64),
                    np.asarray(exp[key], dtype=np.float64),
                    rtol=1e-12,
                    atol=0,
                    err_msg=f"{stat}_{name} {key}",
                )
    assert np.isnan(day["sst"].values).any()  # the NaN branch ran


def test_chunk_checksums_made_by_the_date_tasks_equal_hashing_the_finished_store(synth_zarr, tmp_path):
    """Issue 18: the date tasks hash their chunk files right after writing them (in the page cache, in
    parallel) instead of the client hashing the whole store at the end; the manifest equals the one a plain
    pass over the finished store writes, entry for entry."""
    out = tmp_path / "h.zarr"
    ingest.ingest(
        IngestConfig(source=str(synth_zarr), out=str(out), processes=False, progress=False, variables=("t", "sst"))
    )
    made = json.loads((out / integrity.MANIFEST).read_text())
    integrity.record(out)  # every chunk hashed here, none taken from the tasks
    again = json.loads((out / integrity.MANIFEST).read_text())
    assert made == again and len(made["chunks"]) > 100
    keys = list(made["chunks"])
    assert any(k.startswith("t/c/") for k in keys) and any(k.startswith("statistics/") for k in keys)


def test_workers_reuse_freed_memory_instead_of_faulting_it_in_again():
    """dask starts workers with MALLOC_TRIM_THRESHOLD_=65536, under which every few-MB temporary of a
    slice is a fresh mapping the kernel faults in again (a third of an ingest's CPU time went to the
    kernel). After ``keep_freed_memory`` (what each ingest task calls first) the same temporaries reuse
    the heap: page faults counted by the kernel, not timed."""
    code = (
        "import resource, numpy as np\n"
        "from postcast.datasets.core import cluster\n"
        "def faults():\n"
        "    n = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
        "    for _ in range(50):\n"
        "        a = np.ones((361, 720)); del a\n"  # a 0.5 deg float64 slice (2 MB), freed
        "    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - n\n"
        "before = faults()\n"
        "tuned = cluster.keep_freed_memory()\n"
        "faults()\n"  # the heap grows once
        "print(before, tuned, faults())\n"
    )
    env = {**os.environ, "MALLOC_TRIM_THRESHOLD_": "65536"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    before, tuned, after = out.stdout.split()
    assert tuned == "True"
    assert int(before) >= 50, before  # at least one fault per temporary under dask's setting
    assert int(after) < 10, (before, after)


def test_a_freed_field_partial_goes_back_to_the_kernel():
    """A field's partials outlive the date task that made them (at 0.5 deg one array of a field's three steps is
    6 MB). From the heap (blocks up to 32 MB came from it) they pinned the memory the task's temporaries freed
    around them, and the worker's resident memory depended on its history: at 64 dates its peak was 0.74 GB
    in most runs, 0.80 in 2 of 10 and up to 1.07 GB on a busy machine, against 0.71 at 16 dates. Blocks above
    4 MB are now mapped: such an array, freed under a live allocation made after it, leaves resident memory at
    once (before: it stayed, 0 MB went back)."""
    code = (
        "import os, numpy as np\n"
        "from postcast.datasets.core import cluster\n"
        "def rss():\n"
        "    return int(open('/proc/self/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE')\n"
        "tuned = cluster.keep_freed_memory()\n"
        "part = np.ones((3, 361, 720))\n"  # a field's partial mean (float64), 6 MB
        "later = [bytearray(4096) for _ in range(64)]\n"  # live blocks made after it
        "before = rss()\n"
        "del part\n"
        "print(tuned, before - rss())\n"
    )
    env = {**os.environ, "MALLOC_TRIM_THRESHOLD_": "65536"}  # as dask starts its workers
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    tuned, returned = out.stdout.split()
    assert tuned == "True"
    assert int(returned) >= 5 * 2**20, f"{int(returned) / 2**20:.1f} MB went back to the kernel"


def test_store_template_metadata_equals_xarrays_own_write(synth_zarr, tmp_path):
    """The store's template (63 arrays with their own CF attributes, a few layouts) created through
    ``io.write_template`` has every zarr.json xarray's compute=False write gives it."""
    cfg = IngestConfig(source=str(synth_zarr), out=str(tmp_path / "x.zarr"))
    found = sources.discover(cfg.source, truth=cfg.truth)
    plan = found.forecast.plan(cfg.expectation)
    tmpl = ingest_layout.template(plan, truth=found.truth.variables(), oracle=[], splits=cfg.splits)
    io.write_zarr(tmpl, tmp_path / "a.zarr", chunks=ingest_layout.chunk_shapes(plan), compute=False)
    io.write_template(tmpl, tmp_path / "b.zarr", chunks=ingest_layout.chunk_shapes(plan))

    def metadata(root: Path) -> dict[str, dict]:
        return {p.parent.relative_to(root).as_posix(): json.loads(p.read_text()) for p in root.rglob("zarr.json")}

    want, got = metadata(tmp_path / "a.zarr"), metadata(tmp_path / "b.zarr")
    assert len(got) > 40 and got == want
    back = io.open_zarr(tmp_path / "b.zarr")
    assert {n: tmpl[n].attrs for n in tmpl.data_vars} == {n: v.attrs for n, v in back.data_vars.items()}


def test_a_date_from_a_zarr_source_is_read_without_a_second_copy(synth_zarr):
    """A date read from a float32 zarr source holds its values once: the cast to float32 no longer copies
    them (it cost ~1 s per 0.5 deg date and twice the memory). Peak memory traced while reading one date,
    against the bytes of what was read."""
    import tracemalloc

    found = sources.discover(str(synth_zarr))
    plan = found.forecast.plan(IngestConfig(source=str(synth_zarr), out="unused").expectation)
    found.forecast.load(plan.init_times[0], plan)  # opens the source (cached), outside the trace
    tracemalloc.start()
    try:
        day = found.forecast.load(plan.init_times[1], plan)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    held = sum(v.nbytes for v in day.data_vars.values())
    assert all(v.dtype == np.float32 for v in day.data_vars.values())
    assert peak < 1.5 * held, (peak, held)


@pytest.mark.parametrize("source", ["synth_zarr", "synth_grib"])
def test_a_date_task_holds_one_group_of_variables_at_a_time_and_writes_the_same_chunks(source, request, tmp_path):
    """A date task held every variable of its dates at once (with their ensemble statistics): 0.8 GB of fresh
    memory for a 0.5 deg date, whose first touch cost more than decoding it. It now loads, writes and frees one
    group of about ``budget.TASK_BYTES`` of member data at a time. With the budget at one variable, the memory
    traced while a date is ingested is at least half the date's member bytes below what it is with the date in
    one group (the task as it was, above the date's member bytes), and the chunk files (their checksums in the
    date's done-marker) are the same."""
    import gc
    import tracemalloc

    src = request.getfixturevalue(source)
    found = sources.discover(str(src))
    fc = found.forecast
    plan = fc.plan(IngestConfig(source=str(src), out="unused").expectation)
    fc.load(plan.init_times[0], plan)  # opens the source (and indexes GRIB files), outside the trace
    per_field = 4 * plan.grid.shape[0] * plan.grid.shape[1] * len(plan.members) * len(plan.steps_h)
    largest = per_field * max(len(plan.levels) if plan.variable(v).on_levels else 1 for v in plan.variables)

    def ingest_one_date(budget: int, name: str) -> tuple[int, dict]:
        store, done = tmp_path / f"{name}.zarr", tmp_path / f"{name}_done"
        done.mkdir()
        tmpl = ingest_layout.template(plan, truth=found.truth.variables(), oracle=[], splits=schema.Splits())
        io.write_template(tmpl, store, chunks=ingest_layout.chunk_shapes(plan))
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(ingest_budget, "TASK_BYTES", budget)
            groups = ingest_budget.variable_groups(plan, 1)
            gc.collect()
            tracemalloc.start()
            try:
                ingest_tasks.ingest_dates(fc, found.truth, None, plan, [1], str(store), str(done))
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
        assert (len(groups) == 1) == (budget > ingest_budget.date_bytes(plan)) and len(groups) != 2, groups
        (marker,) = done.iterdir()
        return peak, json.loads(marker.read_text())["chunks"]

    whole_peak, whole = ingest_one_date(10 * ingest_budget.date_bytes(plan), "whole")
    grouped_peak, grouped = ingest_one_date(largest, "grouped")
    assert len(plan.variables) > 4 and len(grouped) > 50 and grouped == whole
    date = ingest_budget.date_bytes(plan)
    assert whole_peak > date and whole_peak - grouped_peak > date / 2, (grouped_peak, whole_peak, date)


def test_a_date_from_grib_comes_out_in_the_stores_layout_each_message_where_it_belongs(synth_grib):
    """A GRIB date's fields are decoded straight into the store's layout (member, step, level): the pressure-level
    fields came out as strided views of a (level, member, step) array, and every write copied them into a
    contiguous buffer first (406 MB of fresh memory for a 0.5 deg date). Each field of the date equals the
    message the index names for it, decoded on its own."""
    from postcast.datasets.sources import messages

    found = sources.discover(str(synth_grib))
    fc = found.forecast
    plan = fc.plan(IngestConfig(source=str(synth_grib), out="unused").expectation)
    t = plan.init_times[1]
    day = fc.load(t, plan)
    assert {n for n, v in day.data_vars.items() if not v.values.flags.c_contiguous} == set()
    rows = fc.index[fc.index.init_time == t]
    for name, da in day.data_vars.items():
        on_levels = schema.LEVEL in da.dims
        for level in plan.levels if on_levels else (0,):
            for member in (plan.members[0], plan.members[-1]):
                for step in plan.steps_h:
                    r = rows[(rows["var"] == name) & (rows.level == level) & (rows.member == member)]
                    r = r[r.step_h == step].iloc[0]
                    want = messages.decode(r.file, [(r.offset, r.length)], plan.grid.shape)[0]
                    at = {schema.MEMBER: member, schema.STEP: pd.Timedelta(hours=step)}
                    got = da.sel(at | ({schema.LEVEL: level} if on_levels else {})).values[0]
                    np.testing.assert_array_equal(got, want, err_msg=f"{name} {level} {member} {step}")


def test_a_complete_store_is_kept_only_for_the_same_inputs(cli, synth_zarr, tmp_path):
    """`ingest` of another source or other variables into a complete store said "already complete",
    exit 0. The same ingest again is still nothing to do; another one names what differs, exit 2."""
    out = tmp_path / "s.zarr"
    cli("ingest", str(synth_zarr), "--out", str(out), "--threads", "--variables", "t,z,t2m", check=True)
    again = cli("ingest", str(synth_zarr), "--out", str(out), "--threads", "--variables", "t,z,t2m", "--workers", "1")
    assert again.returncode == 0 and "already complete" in again.stdout  # execution options do not matter
    other = cli("ingest", str(synth_zarr), "--out", str(out), "--threads", "--variables", "t,z")
    lines = [ln for ln in other.stderr.splitlines() if ln.startswith("postcast: error:")]
    assert other.returncode == 2 and len(lines) == 1 and "(variables differ)" in lines[0] and "--overwrite" in lines[0]
    elsewhere = tmp_path / "copy"
    shutil.copytree(synth_zarr, elsewhere)
    moved = cli("ingest", str(elsewhere), "--out", str(out), "--threads", "--variables", "t,z,t2m")
    assert moved.returncode == 2 and "(source differ)" in moved.stderr
