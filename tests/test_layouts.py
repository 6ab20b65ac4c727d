"""Real ensembles in: ECMWF-style GRIB1/GRIB2 (control + perturbed, analyses), reduced Gaussian and
regional grids, and the cfgrib netCDF twin of a GRIB file, written with eccodes, read by ingest and forecast."""

from __future__ import annotations

import json
from pathlib import Path

import eccodes
import numpy as np
import pandas as pd
import pytest
import xarray as xr

from postcast.datasets import contract, plausibility, schema, sources
from postcast.datasets.core.errors import BadInputError, MissingInputError
from postcast.datasets.ingest.run import IngestConfig, ingest

ROOT = Path(__file__).resolve().parents[1]
INIT = pd.Timestamp("2017-07-03")
PACK = 16  # bits per value


def harmonic(lat, lon):
    la, lo = np.radians(lat), np.radians(lon)
    return np.sin(la) + np.cos(la) ** 2 * np.cos(2 * lo)


def field(var, lat, lon, member, step, level=500):
    """Plausible analytic fields: T2m / T in K, z in m2 s-2 (the standard atmosphere's at ``level``),
    varying by member and step."""
    z0 = plausibility.standard_geopotential(level)
    base = {"t2m": (280.0, 15.0), "t": (250.0, 20.0), "z": (z0, 1500.0)}[var]
    return base[0] + base[1] * harmonic(lat, lon) + 0.3 * member + 0.05 * step


def _grid_handle(edition, grid):
    """A GRIB handle on ``grid`` with placeholder values, and the per-point latitude/longitude."""
    if grid[0] == "O":
        n = grid[1]
        h = eccodes.codes_grib_new_from_samples(f"reduced_gg_pl_grib{edition}")
        pl = [20 + 4 * i for i in range(n)]
        eccodes.codes_set(h, "N", n)
        eccodes.codes_set(h, "Nj", 2 * n)
        eccodes.codes_set_long_array(h, "pl", pl + pl[::-1])
        eccodes.codes_set(h, "longitudeOfLastGridPointInDegrees", 360 - 360 / (20 + 4 * (n - 1)))
        eccodes.codes_set_values(h, np.zeros(2 * sum(pl)))
        return h, eccodes.codes_get_array(h, "latitudes"), eccodes.codes_get_array(h, "longitudes")
    _, res, (la0, la1, lo0, lo1) = grid
    h = eccodes.codes_grib_new_from_samples(f"regular_ll_pl_grib{edition}")
    ni, nj = round(((lo1 - lo0) % 360) / res) + 1, round((la0 - la1) / res) + 1
    for k, v in (
        ("Ni", ni),
        ("Nj", nj),
        ("latitudeOfFirstGridPointInDegrees", la0),
        ("latitudeOfLastGridPointInDegrees", la1),
        ("longitudeOfFirstGridPointInDegrees", lo0),
        ("longitudeOfLastGridPointInDegrees", lo1),
        ("iDirectionIncrementInDegrees", res),
        ("jDirectionIncrementInDegrees", res),
        ("jScansPositively", 0),
    ):
        eccodes.codes_set(h, k, v)
    lon, lat = np.meshgrid(lo0 + np.arange(ni) * res, np.linspace(la0, la1, nj))
    return h, lat.ravel(), lon.ravel()


def write_ecmwf(
    path,
    *,
    edition=2,
    grid=("ll", 1.0, (90, -90, 0, 359)),
    members=tuple(range(51)),
    steps=range(0, 49, 6),
    variables=("t2m",),
    levels=(500, 850),
    data_type=None,
    dates=(INIT,),
):
    """An ECMWF-style ensemble file: control (number 0, dataType cf) + perturbed (pf) members, or
    analyses (an); GRIB1 or GRIB2; regular (any extent) or octahedral reduced Gaussian grid."""
    h0, lat, lon = _grid_handle(edition, grid)
    with open(path, "wb") as f:
        for date in dates:
            for var in variables:
                v = schema.VARIABLES[var]
                for lv in levels if v.level_type is schema.LevelType.PRESSURE else (None,):
                    for m in members:
                        for s in steps:
                            h = eccodes.codes_clone(h0)
                            dt = data_type or ("cf" if m == 0 else "pf")
                            eccodes.codes_set(h, "centre", "ecmf")
                            eccodes.codes_set(h, "setLocalDefinition", 1)
                            eccodes.codes_set(h, "localDefinitionNumber", 1)
                            if edition == 2 and dt != "an":
                                eccodes.codes_set(h, "productDefinitionTemplateNumber", 1)  # ensemble member
                            eccodes.codes_set(h, "marsType", dt)
                            if dt != "an" or len(members) > 1:  # ERA5 EDA: analyses numbered 0-9
                                eccodes.codes_set(h, "number", int(m))
                                eccodes.codes_set(h, "numberOfForecastsInEnsemble", 51)
                            if lv is None:
                                eccodes.codes_set(h, "typeOfLevel", "surface")
                            else:
                                eccodes.codes_set(h, "typeOfLevel", "isobaricInhPa")
                                eccodes.codes_set(h, "level", int(lv))
                            eccodes.codes_set(h, "paramId", v.param_id)
                            eccodes.codes_set(h, "dataDate", int(date.strftime("%Y%m%d")))
                            eccodes.codes_set(h, "dataTime", date.hour * 100)
                            eccodes.codes_set(h, "step", int(s))
                            eccodes.codes_set(h, "bitsPerValue", PACK)
                            values = field(var, lat, lon, m, s, lv or 500).astype(np.float64)
                            eccodes.codes_set_values(h, values)
                            eccodes.codes_write(h, f)
                            eccodes.codes_release(h)
    eccodes.codes_release(h0)
    return path


def inspected(store, capsys):
    """`postcast inspect STORE --json` in-process: exit 0 (complete) and its summary."""
    import json

    from postcast.cli import main

    capsys.readouterr()
    assert main(["inspect", str(store), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def packing_error(var):
    lo, hi = {"t2m": (265, 295.2 + 3 * 15), "t": (230, 290), "z": (53000, 57000)}[var]
    return (hi - lo) / 2**PACK * 2 + 1e-3


@pytest.fixture(scope="module")
def t2m_checkpoint(store, tmp_path_factory):
    """A T2m local EMOS on the tiny 10 deg store, reading only the T2m ensemble mean/std."""
    from postcast.pipeline import train

    root = tmp_path_factory.mktemp("layout_runs")
    run = train.run(
        [
            "fit",
            "-c",
            str(ROOT / "configs/train/tiny_emos_t2m.yaml"),
            "--data.cfg.store",
            str(store),
            "--data.cfg.sample.variables",
            "[t2m]",
            "--trainer.default_root_dir",
            str(root),
            "--trainer.max_epochs",
            "2",
        ]
    )
    return Path(run.trainer.checkpoint_callback.best_model_path)


@pytest.mark.system  # minutes of CPU: a whole-process run or training (tests/tiers.py)
def test_grib2_control_plus_50_members_ingests_on_its_own_grid(tmp_path, capsys):
    """51 members (0 = control, cf; 1..50 pf), steps every 6 h, GRIB2 at 5 deg: the store holds exactly
    what the source has, equal to the written values within packing error."""
    src = write_ecmwf(tmp_path / "ens.grib2", grid=("ll", 5.0, (90, -90, 0, 355)), variables=("t2m", "t"))
    out = tmp_path / "s.zarr"
    ingest(IngestConfig(source=str(src), out=str(out), processes=False, progress=False))
    ds = contract.open_store(out)
    assert ds.sizes["member"] == 51 and ds["member"].values.tolist() == list(range(51))
    assert ds["step"].values.astype("timedelta64[h]").astype(int).tolist() == list(range(0, 49, 6))
    assert ds["level"].values.tolist() == [500, 850] and ds.attrs["regrid_method"] == "none"
    g = schema.Grid(5.0)
    lon, lat = np.meshgrid(g.longitudes(), g.latitudes())
    got = ds["t2m"].sel(member=7, step=pd.Timedelta(hours=18)).values[0]
    np.testing.assert_allclose(got, field("t2m", lat, lon, 7, 18), atol=packing_error("t2m"))
    np.testing.assert_allclose(
        ds["t"].sel(member=0, level=850).values[0, 0], field("t", lat, lon, 0, 0), atol=packing_error("t")
    )
    assert "51" in json.dumps(inspected(out, capsys))


def test_grib1_and_grib2_of_the_same_fields_give_the_same_store(tmp_path):
    stores = []
    for ed in (1, 2):
        src = write_ecmwf(
            tmp_path / f"e{ed}.grib",
            edition=ed,
            grid=("ll", 10.0, (90, -90, 0, 350)),
            members=range(4),
            steps=(0, 24),
            variables=("z",),
            levels=(500,),
        )
        out = tmp_path / f"s{ed}.zarr"
        ingest(IngestConfig(source=str(src), out=str(out), processes=False, progress=False))
        stores.append(contract.open_store(out))
    np.testing.assert_array_equal(stores[0]["z"].values, stores[1]["z"].values)
    assert stores[0]["member"].values.tolist() == [0, 1, 2, 3]


def test_analysis_only_members_from_0_and_the_error_in_the_users_terms(tmp_path, capsys):
    """ERA5-EDA-like: 10 analyses numbered 0-9 (dataType an), step 0 only, 4 analysis times."""
    dates = [INIT + pd.Timedelta(hours=6 * i) for i in range(4)]
    src = write_ecmwf(
        tmp_path / "eda.grib",
        edition=1,
        grid=("ll", 10.0, (90, -90, 0, 350)),
        members=tuple(range(10)),
        steps=(0,),
        variables=("z", "t"),
        levels=(500, 850),
        data_type="an",
        dates=dates,
    )
    found = sources.discover(src)
    plan = found.forecast.plan(sources.Expectation())
    assert plan.members == tuple(range(10)) and plan.steps_h == (0,) and len(plan.init_times) == 4
    with pytest.raises(
        MissingInputError,
        match=r"members 0-9 found \(0 is the control\), 1-10 expected: pass "
        r"--members 0:9 or --members all",
    ):
        found.forecast.plan(sources.Expectation(members="1:10"))
    with pytest.raises(MissingInputError, match=r"step 24 h \(the source has 0 h: pass --steps 0 or omit it\)"):
        found.forecast.plan(sources.Expectation(steps_h=(0, 24, 48)))
    out = tmp_path / "eda.zarr"
    ingest(
        IngestConfig(
            source=str(src), out=str(out), processes=False, progress=False, variables=("z", "t"), levels=(500, 850)
        )
    )
    assert contract.open_store(out).sizes["init_time"] == 4
    assert inspected(out, capsys)["complete"]


def test_octahedral_grid_is_regridded_and_recorded(tmp_path, capsys):
    """An O16 reduced Gaussian GRIB2 (the shape of today's ECMWF ensemble) ingested onto 10 deg with
    bilinear regridding: within the regridding error of the analytic field (+ packing)."""
    src = write_ecmwf(tmp_path / "o16.grib2", grid=("O", 16), members=range(3), steps=(0, 24))
    out = tmp_path / "o.zarr"
    ingest(IngestConfig(source=str(src), out=str(out), processes=False, progress=False, grid=10.0))
    ds = contract.open_store(out)
    assert ds.attrs["source_grid"].startswith("reduced_gg O16") and ds.attrs["regrid_method"] == "bilinear"
    g = schema.Grid(10.0)
    lon, lat = np.meshgrid(g.longitudes(), g.latitudes())
    err = np.abs(ds["t2m"].sel(member=2, step=pd.Timedelta(0)).values[0] - field("t2m", lat, lon, 2, 0))
    assert err.max() < 15.0 * 0.02 + packing_error("t2m"), err.max()  # O16 ~ 5.6 deg rows: 2 % of the amplitude
    assert inspected(out, capsys)["complete"]


def test_store_from_grib_equals_its_cfgrib_netcdf_twin(tmp_path, capsys):
    """cfgrib opens the GRIB2 file; xarray writes it as netCDF (number, time, step, isobaricInhPa, descending
    latitude, valid_time): the store from the netCDF twin equals the one from the GRIB file."""
    src = write_ecmwf(
        tmp_path / "ens.grib2",
        grid=("ll", 10.0, (90, -90, 0, 350)),
        members=range(5),
        steps=(0, 24),
        variables=("t",),
        levels=(500, 850),
    )
    twin = tmp_path / "ens.nc"
    parts = [
        xr.open_dataset(src, engine="cfgrib", backend_kwargs={"indexpath": "", "filter_by_keys": {"dataType": d}})
        for d in ("cf", "pf")
    ]  # cfgrib needs one dataType per dataset: the control (scalar number) apart
    xr.concat([parts[0].expand_dims("number"), parts[1]], dim="number").to_netcdf(twin)
    stores = []
    for p in (src, twin):
        out = tmp_path / f"{p.suffix[1:]}.zarr"
        ingest(IngestConfig(source=str(p), out=str(out), processes=False, progress=False))
        stores.append(contract.open_store(out))
    np.testing.assert_array_equal(stores[0]["t"].values, stores[1]["t"].values)
    assert stores[0]["member"].values.tolist() == stores[1]["member"].values.tolist() == list(range(5))
    assert inspected(tmp_path / "nc.zarr", capsys)["complete"]
    assert inspected(tmp_path / "grib2.zarr", capsys)["complete"]


@pytest.mark.parametrize("grid", [("ll", 1.0, (90, -90, 0, 359)), ("O", 16)], ids=["grib2_1deg_51", "octahedral"])
def test_checkpoint_forecasts_from_another_ensemble_and_grid(t2m_checkpoint, grid, tmp_path):
    """A checkpoint trained on the 10 deg tiny store forecasts from a 51-member GRIB2 input on a 1 deg
    grid and from an O16 input: regridded to the checkpoint's grid; the files carry grid and method."""
    from postcast.pipeline.forecast import ForecastConfig, forecast

    src = write_ecmwf(
        tmp_path / "in.grib2",
        grid=grid,
        members=range(51) if grid[0] == "ll" else range(5),
        steps=range(0, 49, 6) if grid[0] == "ll" else (48,),
    )
    res = forecast(
        ForecastConfig(
            checkpoint=str(t2m_checkpoint), input=str(src), out=str(tmp_path / "o"), init_time=str(INIT.date())
        )
    )
    assert len(res.written) == 1 and not res.fallback, res
    ds = xr.open_dataset(res.written[0])
    assert ds.sizes["latitude"] == 19 and ds.sizes["longitude"] == 36 and ds.attrs["product"] == "postprocessed"
    assert ds.attrs["regrid_method"] == "bilinear" and ds.attrs["n_members"] == (51 if grid[0] == "ll" else 5)
    assert ds.attrs["source_grid"].startswith("regular_ll 1 deg" if grid[0] == "ll" else "reduced_gg O16")
    assert np.isfinite(ds["t2m_mean"].values).all() and (ds["t2m_std"].values > 0).all()


@pytest.mark.parametrize(
    ("var", "scale", "units", "needle"),
    [
        ("z", 1 / 9.80665, "m**2 s**-2", "geopotential height"),  # metres labelled as geopotential: 9.8x too small
        ("t", 1.0, "degC", "K"),  # kelvin labelled degC: converted to ~520 K
        ("t2m", -273.15, "K", "degC"),  # Celsius labelled K (a shift, given as scale -273.15 here)
    ],
)
def test_plausibility_catches_mislabelled_units(tmp_path, var, scale, units, needle):
    """Issue 15: geopotential height in metres labelled m2 s-2 was ingested silently, 9.8x too small, in a
    store marked complete. Each variable's typical magnitude (per level) catches it, whatever the attribute."""
    g = schema.Grid(10.0)
    lon, lat = np.meshgrid(g.longitudes(), g.latitudes())
    level = 500 if var == "z" else 850
    values = field(var, lat, lon, 0, 0)
    values = values + scale if scale == -273.15 else values * scale
    pl = schema.VARIABLES[var].level_type is schema.LevelType.PRESSURE
    dims = (
        ("time", "number", "isobaricInhPa", "latitude", "longitude")
        if pl
        else ("time", "number", "latitude", "longitude")
    )
    data = values[None, None, None] if pl else values[None, None]
    coords = {
        "time": [INIT],
        "number": [0],
        "latitude": g.latitudes(),
        "longitude": g.longitudes(),
        "step": np.timedelta64(0, "h"),
    } | ({"isobaricInhPa": [level]} if pl else {})
    path = tmp_path / "bad.nc"
    xr.Dataset({var: (dims, data, {"units": units})}, coords=coords).to_netcdf(path)
    from postcast.cli import main

    out = tmp_path / "bad.zarr"
    rc = main(["--no-progress", "ingest", str(path), "--out", str(out), "--threads"])
    assert rc == 65 and not out.exists()
    with pytest.raises(Exception, match=needle):
        ingest(IngestConfig(source=str(path), out=str(out), processes=False, progress=False))


def test_a_missing_member_is_reported_as_such_not_as_nans(tmp_path):
    """Two netCDF files of one date each; the second lacks member 2: said so, not 'NaN values'."""
    g = schema.Grid(10.0)
    lon, lat = np.meshgrid(g.longitudes(), g.latitudes())
    for i, members in enumerate(([0, 1, 2], [0, 1])):
        t = INIT + pd.Timedelta(days=i)
        data = np.stack([field("t2m", lat, lon, m, 0) for m in members])[None]
        xr.Dataset(
            {"t2m": (("time", "number", "latitude", "longitude"), data, {"units": "K"})},
            coords={
                "time": [t],
                "number": members,
                "latitude": g.latitudes(),
                "longitude": g.longitudes(),
                "step": np.timedelta64(0, "h"),
            },
        ).to_netcdf(tmp_path / f"output.sfc.{i}.nc")
    with pytest.raises(MissingInputError, match=r"2017-07-04: member 2 of 't2m' missing on this date"):
        ingest(IngestConfig(source=str(tmp_path), out=str(tmp_path / "s.zarr"), processes=False, progress=False))


def test_forecast_written_back_on_the_input_grid(t2m_checkpoint, tmp_path):
    """--on-input-grid: computed on the checkpoint's 10 deg grid, written on the 5 deg input grid."""
    from postcast.pipeline.forecast import ForecastConfig, forecast

    src = write_ecmwf(tmp_path / "in.grib2", grid=("ll", 5.0, (90, -90, 0, 355)), members=tuple(range(5)), steps=(48,))
    kw = {"checkpoint": str(t2m_checkpoint), "input": str(src), "init_time": str(INIT.date())}
    on_ckpt = xr.open_dataset(forecast(ForecastConfig(out=str(tmp_path / "a"), **kw)).written[0])
    back = xr.open_dataset(forecast(ForecastConfig(out=str(tmp_path / "b"), on_input_grid=True, **kw)).written[0])
    assert back.sizes["latitude"] == 37 and back.sizes["longitude"] == 72 and back.attrs["output_grid"] == "input"
    # the checkpoint's grid points are input grid points: there the values are the same
    np.testing.assert_allclose(back["t2m_mean"].values[0, ::2, ::2], on_ckpt["t2m_mean"].values[0], rtol=1e-6)


def test_a_file_on_another_grid_is_reported_as_such(tmp_path):
    """Two netCDF files, the second on a 5 deg grid: named as a different grid, not as NaN values."""
    for i, res in enumerate((10.0, 5.0)):
        g = schema.Grid(res)
        lon, lat = np.meshgrid(g.longitudes(), g.latitudes())
        xr.Dataset(
            {
                "t2m": (
                    ("time", "number", "latitude", "longitude"),
                    field("t2m", lat, lon, 0, 0)[None, None],
                    {"units": "K"},
                )
            },
            coords={
                "time": [INIT + pd.Timedelta(days=i)],
                "number": [0],
                "latitude": g.latitudes(),
                "longitude": g.longitudes(),
                "step": np.timedelta64(0, "h"),
            },
        ).to_netcdf(tmp_path / f"output.sfc.{i}.nc")
    with pytest.raises(
        BadInputError,
        match=r"output.sfc.1.nc is on regular_ll 5 deg .*output.sfc.0.nc on regular_ll "
        r"10 deg",
    ):
        ingest(IngestConfig(source=str(tmp_path), out=str(tmp_path / "s.zarr"), processes=False, progress=False))


# --- regional grids ------------------------------------------------------------------------------
EUROPE = ("ll", 1.0, (70, 30, -20, 40))  # north, south, west, east as GRIB writes them: -180..180 longitudes
DATELINE = ("ll", 1.0, (60, 20, 160, 200))  # across the date line (0..360 longitudes past 180)


@pytest.mark.parametrize(
    ("grid", "res", "area"),
    [
        (EUROPE, None, (30.0, 70.0, 340.0, 400.0)),
        (EUROPE, 2.0, (30.0, 70.0, 340.0, 400.0)),
        (DATELINE, 1.5, (21.0, 60.0, 160.5, 199.5)),
    ],
    ids=["europe_own_grid", "europe_2deg", "dateline_1.5deg"],
)
def test_a_regional_grid_is_stored_on_its_own_area(tmp_path, capsys, grid, res, area):
    """Issue 15: a regional GRIB2 was regridded to a global grid and refused as '939885 NaN values' named
    '.'. It is stored on its own area (at its own resolution, or the asked one inside the area), equal
    to the analytic field within packing (own grid) or bilinear interpolation error (1.5 deg)."""
    src = write_ecmwf(tmp_path / "reg.grib2", grid=grid, members=range(3), steps=(0, 24))
    out = tmp_path / "reg.zarr"
    ingest(IngestConfig(source=str(src), out=str(out), processes=False, progress=False, grid=res))
    ds = contract.open_store(out)
    g = schema.Grid(res or 1.0, area)
    assert ds.sizes["latitude"] == g.n_lat and ds.sizes["longitude"] == g.n_lon
    np.testing.assert_allclose(ds["longitude"].values, g.longitudes())
    lon, lat = np.meshgrid(g.longitudes(), g.latitudes())
    err = np.abs(ds["t2m"].sel(member=2, step=pd.Timedelta(hours=24)).values[0] - field("t2m", lat, lon, 2, 24))
    # bilinear on a 1 deg source: |f''| h^2 / 8 with f = 15 K x (a degree-2 harmonic): < 0.01 K
    assert err.max() < packing_error("t2m") + (0.01 if res == 1.5 else 0.0), err.max()
    assert ds.attrs["regrid_method"] == ("none" if res is None else "bilinear")
    info = inspected(out, capsys)
    assert info["complete"] and f"lat {area[0]:g}..{area[1]:g} lon {area[2]:g}..{area[3]:g}" in info["grid"]


def _truth_nc(path, dates, res=2.5):
    """ERA5-like T2m analyses on a global grid, indexed by valid time (time), descending latitude."""
    g = schema.Grid(res)
    lon, lat = np.meshgrid(g.longitudes(), g.latitudes()[::-1])
    data = np.stack([field("t2m", lat, lon, 0, 48) for _ in dates])
    xr.Dataset(
        {"t2m": (("time", "latitude", "longitude"), data, {"units": "K"})},
        coords={"time": list(dates), "latitude": g.latitudes()[::-1], "longitude": g.longitudes()},
    ).to_netcdf(path)
    return path


@pytest.fixture(scope="module")
def regional(tmp_path_factory):
    """A regional (Europe, 2 deg) T2m store with truth regridded from a global 2.5 deg ERA5-like file,
    dates in the training, validation and test years, and a local EMOS trained on it."""
    from postcast.pipeline import train

    root = tmp_path_factory.mktemp("regional")
    dates = [pd.Timestamp(d) for d in ("2010-01-01", "2010-01-02", "2010-01-03", "2014-01-01", "2016-01-01")]
    src = write_ecmwf(root / "eu.grib2", grid=EUROPE, members=range(5), steps=(0, 24, 48), dates=dates)
    truth = _truth_nc(root / "era5.nc", [d + pd.Timedelta(hours=48) for d in dates])
    store = root / "eu.zarr"
    ingest(IngestConfig(source=str(src), out=str(store), truth=str(truth), processes=False, progress=False, grid=2.0))
    run = train.run(
        [
            "fit",
            "-c",
            str(ROOT / "configs/train/tiny_emos_t2m.yaml"),
            "--data.cfg.store",
            str(store),
            "--data.cfg.sample.variables",
            "[t2m]",
            "--trainer.default_root_dir",
            str(root / "runs"),
            "--trainer.max_epochs",
            "2",
        ]
    )
    return {"src": src, "store": store, "ckpt": Path(run.trainer.checkpoint_callback.best_model_path)}


def test_truth_on_another_grid_is_regridded_to_the_store(regional):
    """The truth (global 2.5 deg, north to south) is regridded to the regional 2 deg store: equal to the
    analytic field within bilinear error (2.5 deg: |f''| h^2 / 8 ~ 0.03 K)."""
    ds = contract.open_store(regional["store"])
    g = schema.Grid(2.0, (30.0, 70.0, 340.0, 400.0))
    lon, lat = np.meshgrid(g.longitudes(), g.latitudes())
    got = ds[contract.truth_name("t2m")].sel(step=pd.Timedelta(hours=48)).values  # (init_time, lat, lon)
    assert np.isfinite(got).all()
    assert np.abs(got - field("t2m", lat, lon, 0, 48)).max() < 0.05


def test_a_regional_checkpoint_forecasts_on_its_area(regional, tmp_path):
    """The checkpoint records its area; a forecast from a global 1 deg input is cut to that area."""
    from postcast.models.module import load_checkpoint
    from postcast.pipeline.forecast import ForecastConfig, forecast

    assert tuple(load_checkpoint(str(regional["ckpt"]))[0].hparams["grid_area"]) == (30.0, 70.0, 340.0, 400.0)
    src = write_ecmwf(tmp_path / "glob.grib2", grid=("ll", 1.0, (90, -90, 0, 359)), members=range(7), steps=(48,))
    res = forecast(
        ForecastConfig(
            checkpoint=str(regional["ckpt"]), input=str(src), out=str(tmp_path / "o"), init_time=str(INIT.date())
        )
    )
    ds = xr.open_dataset(res.written[0])
    assert not res.fallback and ds.sizes["latitude"] == 21 and ds.sizes["longitude"] == 31
    np.testing.assert_allclose(ds["longitude"].values, 340.0 + 2.0 * np.arange(31))
    assert np.isfinite(ds["t2m_mean"].values).all() and ds.attrs["n_members"] == 7


def test_a_global_checkpoint_names_what_a_regional_input_lacks(t2m_checkpoint, tmp_path, capsys):
    """A checkpoint of the global 10 deg grid and a European input: one line naming the input file, the
    area it covers and the grid the model reads (was: '.: ... NaN values')."""
    from postcast.cli import main

    src = write_ecmwf(tmp_path / "europe.grib2", grid=EUROPE, members=range(3), steps=(48,))
    rc = main(
        [
            "--no-progress",
            "forecast",
            "--checkpoint",
            str(t2m_checkpoint),
            "--input",
            str(src),
            "--out",
            str(tmp_path / "o"),
            "--init-time",
            str(INIT.date()),
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 65 and len(err) == 1, err
    assert "europe.grib2" in err[0] and "covers lat 30..70" in err[0] and "global" in err[0], err[0]


def _cfgrib_twin(tmp_path, src):
    """The netCDF that cfgrib + xarray make of an ECMWF ensemble GRIB file (number, time, step,
    isobaricInhPa, descending latitude, valid_time); cfgrib reads one dataType at a time."""
    twin = tmp_path / "twin.nc"
    parts = [
        xr.open_dataset(src, engine="cfgrib", backend_kwargs={"indexpath": "", "filter_by_keys": {"dataType": d}})
        for d in ("cf", "pf")
    ]
    xr.concat([parts[0].expand_dims("number"), parts[1]], dim="number").to_netcdf(twin)
    return twin


def test_compress_reads_the_cfgrib_netcdf_layout(tmp_path, capsys):
    """Issue 15: `postcast compress` on the cfgrib netCDF said t 'has no pressure levels' (it read the file
    raw: isobaricInhPa, number, time). It reads it through the conventions every other verb uses, and
    the artefact's decoded field is the member's T850 within the fit's measured error."""
    from postcast.cli import main
    from postcast.compression.artefact import Artefact

    src = write_ecmwf(
        tmp_path / "ens.grib2",
        grid=("ll", 10.0, (90, -90, 0, 350)),
        members=range(3),
        steps=(0, 24),
        variables=("t",),
        levels=(500, 850),
    )
    twin = _cfgrib_twin(tmp_path, src)
    out = tmp_path / "t850.pcnf"
    rc = main(
        [
            "--no-progress",
            "compress",
            str(twin),
            "--var",
            "t",
            "--level",
            "850",
            "--step-hours",
            "24",
            "--member",
            "1",
            "--out",
            str(out),
            "--steps",
            "30",
            "--width",
            "16",
            "--depth",
            "1",
        ]
    )
    assert rc == 0, capsys.readouterr().err
    art = Artefact.load(out)
    assert art.header["selection"]["levels"] == [850]
    decoded = art.decode()["t"].values[0]  # (lat, lon), latitude ascending
    g = schema.Grid(10.0)
    lon, lat = np.meshgrid(g.longitudes(), g.latitudes())
    err = np.abs(decoded - field("t", lat, lon, 1, 24, 850))
    assert err.max() <= art.header["errors"]["var0"]["max_abs"] + packing_error("t"), err.max()
