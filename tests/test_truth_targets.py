"""ERA5-like truth of the derived targets at ingest: ``truth_ws10`` from the truth's u10 and v10, ``truth_tp24``
from its precipitation (hourly, 6-hourly or daily amounts, in m or mm), written as real netCDF files next to a
small synthetic forecast and ingested by the real ``postcast ingest --truth``; the expected values are computed
here by hand from the arrays written."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import scoringrules as sr
import xarray as xr
from battery import assert_ok, in_process
from forecast_only import forecast_only

from postcast.datasets import contract, schema
from postcast.datasets.synth.synthetic import SynthConfig

RAW = SynthConfig(
    seed=5, resolution=10.0, years=(2016, 2017), dates_per_year=2, levels=(850,), targets=("t2m", "ws10", "tp24")
)
LAT = np.arange(90.0, -91.0, -10.0)  # ERA5 order: north -> south (19)
LON = np.arange(0.0, 360.0, 10.0)  # 36


@pytest.fixture(scope="module")
def forecasts(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """A forecast-only source (4 dates of 2016-2017, 10 deg) and its init times."""
    src, inits, _ = forecast_only(RAW, tmp_path_factory.mktemp("truth_targets"))
    return src, inits


def _valid_times(inits: pd.DatetimeIndex, every_h: int) -> pd.DatetimeIndex:
    """Valid times every ``every_h`` hours up to +48 h from 12 h before each init on (gaps between the dates)."""
    spans = [
        pd.date_range(end=t + pd.Timedelta(hours=48), periods=60 // every_h + 1, freq=f"{every_h}h") for t in inits
    ]
    return spans[0].append(spans[1:]).unique().sort_values()


def _era5(
    path,
    inits: pd.DatetimeIndex,
    *,
    every_h: int = 1,
    tp_units: str = "m",
    names: tuple[str, ...] = ("u10", "v10", "tp", "t2m"),
) -> xr.Dataset:
    """An ERA5-like netCDF file (dims valid_time, latitude, longitude) with the variables ``names``
    (u-like and v-like names get wind, tp precipitation amounts per interval, t2m temperature)."""
    rng = np.random.default_rng(every_h)
    times = _valid_times(inits, every_h)
    shape = (len(times), LAT.size, LON.size)
    tp = rng.exponential(0.4e-3 * every_h, shape)  # m per interval
    tp[:, 0, 0] = -1e-7  # packing noise: a cell whose 24 h sum is negative (clipped to 0)
    if tp_units == "mm":
        tp *= 1000.0
    fields = {
        "u": (rng.normal(0.0, 6.0, shape), "m s**-1"),
        "v": (rng.normal(0.0, 6.0, shape), "m s**-1"),
        "tp": (tp, tp_units),
        "t": (rng.normal(285.0, 5.0, shape), "K"),
    }
    data = {n: (("valid_time", "latitude", "longitude"), *fields[_kind(n)]) for n in names}
    ds = xr.Dataset(
        {n: (d, v.astype(np.float32), {"units": u}) for n, (d, v, u) in data.items()},
        coords={"valid_time": times, "latitude": LAT, "longitude": LON},
    )
    ds.to_netcdf(path, engine="netcdf4")
    return ds


def _kind(name: str) -> str:
    return {
        "u10": "u",
        "10u": "u",
        "eastward_wind": "u",
        "v10": "v",
        "10v": "v",
        "northward_wind": "v",
        "tp": "tp",
        "t2m": "t",
    }[name]


def _ingest(cli, src, truth, out):
    return cli(
        "ingest", str(src), "--truth", str(truth), "--out", str(out), "--threads", "--variables", "u10,v10,tp,t2m"
    )


def _truth_at(out, name: str, h: int) -> xr.DataArray:
    """The store's ``name`` at +h h, (init_time, latitude descending, longitude) like the ERA5 file."""
    ds = contract.open_store(out)
    step = contract.step_position(ds.get_index(schema.STEP), h)
    return ds[name].isel({schema.STEP: step}).sortby(schema.LAT, ascending=False).load()


def _tp24(era: xr.Dataset, valid: pd.DatetimeIndex, every_h: int, factor: float) -> np.ndarray:
    """By hand: the sum of the amounts at valid - 24 h + every_h ... valid, x factor, clipped at 0."""
    sums = [
        sum(
            era["tp"].sel(valid_time=v - pd.Timedelta(hours=k)).values.astype(np.float64) for k in range(0, 24, every_h)
        )
        for v in valid
    ]
    return np.maximum(np.stack(sums), 0.0) * factor


@pytest.fixture(scope="module")
def hourly(forecasts, cli, tmp_path_factory):
    """An hourly ERA5-like truth (u10, v10, tp in m, t2m) ingested, and the store's path."""
    src, inits = forecasts
    root = tmp_path_factory.mktemp("hourly")
    era = _era5(root / "era5_hourly.nc", inits)
    out = root / "store.zarr"
    proc = _ingest(cli, src, root / "era5_hourly.nc", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return era, out, proc.stderr


def test_ws10_truth_is_the_speed_of_the_truth_wind(forecasts, hourly):
    _, inits = forecasts
    era, out, _ = hourly
    valid = inits + pd.Timedelta(hours=48)
    want = np.hypot(era["u10"].sel(valid_time=valid).values, era["v10"].sel(valid_time=valid).values)
    got = _truth_at(out, "truth_ws10", 48)
    np.testing.assert_allclose(got.values, want, rtol=1e-6)
    assert set(contract.open_store(out).attrs["targets"]) == {"t2m", "ws10", "tp24"}


def test_tp24_truth_is_the_hand_sum_of_24_hourly_amounts(forecasts, hourly):
    """+48 h and +24 h: the 24 hourly amounts ending at the valid time, m -> mm, clipped at 0 (cell 0, 0);
    +0 h: the file starts 12 h before the init, the window is incomplete: NaN."""
    _, inits = forecasts
    era, out, log = hourly
    for h in (48, 24):
        want = _tp24(era, inits + pd.Timedelta(hours=h), 1, 1000.0)
        np.testing.assert_allclose(_truth_at(out, "truth_tp24", h).values, want, rtol=1e-5, atol=1e-6)
        assert (want[:, 0, 0] == 0).all()
    assert np.isnan(_truth_at(out, "truth_tp24", 0).values).all()
    assert not np.isnan(_truth_at(out, "truth_ws10", 0).values).any()
    assert "truth ws10 from u10, v10" in log and "truth tp24 from tp" in log


def test_tp24_in_mm_every_6_hours(forecasts, cli, tmp_path):
    """6-hourly amounts in mm (ERA5 in kg m**-2 alike): the four ending at the valid time, no x 1000; the
    wind under its GRIB short names 10u/10v."""
    src, inits = forecasts
    era = _era5(tmp_path / "era5_6h.nc", inits, every_h=6, tp_units="mm", names=("10u", "10v", "tp", "t2m"))
    proc = _ingest(cli, src, tmp_path / "era5_6h.nc", tmp_path / "s.zarr")
    assert proc.returncode == 0, proc.stderr[-3000:]
    want = _tp24(era, inits + pd.Timedelta(hours=48), 6, 1.0)
    np.testing.assert_allclose(_truth_at(tmp_path / "s.zarr", "truth_tp24", 48).values, want, rtol=1e-5, atol=1e-6)
    ws = np.hypot(
        era["10u"].sel(valid_time=inits + pd.Timedelta(hours=48)).values,
        era["10v"].sel(valid_time=inits + pd.Timedelta(hours=48)).values,
    )
    np.testing.assert_allclose(_truth_at(tmp_path / "s.zarr", "truth_ws10", 48).values, ws, rtol=1e-6)


def test_daily_amounts_are_the_24h_amounts(forecasts, cli, tmp_path):
    """A daily sum (24 h spacing) in m is taken as is, x 1000; CF names eastward_wind/northward_wind in km/h."""
    src, inits = forecasts
    era = _era5(tmp_path / "era5_daily.nc", inits, every_h=24, names=("eastward_wind", "northward_wind", "tp"))
    with xr.open_dataset(tmp_path / "era5_daily.nc") as ds:
        kmh = ds.load()
    for n in ("eastward_wind", "northward_wind"):
        kmh[n] = (kmh[n] * 3.6).assign_attrs(units="km h**-1")
    kmh.to_netcdf(tmp_path / "era5_daily_kmh.nc")
    proc = _ingest(cli, src, tmp_path / "era5_daily_kmh.nc", tmp_path / "s.zarr")
    assert proc.returncode == 0, proc.stderr[-3000:]
    valid = inits + pd.Timedelta(hours=48)
    want = np.maximum(era["tp"].sel(valid_time=valid).values, 0.0) * 1000.0
    np.testing.assert_allclose(_truth_at(tmp_path / "s.zarr", "truth_tp24", 48).values, want, rtol=1e-5, atol=1e-6)
    ws = np.hypot(era["eastward_wind"].sel(valid_time=valid).values, era["northward_wind"].sel(valid_time=valid).values)
    np.testing.assert_allclose(_truth_at(tmp_path / "s.zarr", "truth_ws10", 48).values, ws, rtol=1e-5)


def _irregular(path, inits):
    """An hourly file with one valid time moved by 30 min."""
    era = _era5(path.with_suffix(".hourly.nc"), inits)
    times = era.get_index("valid_time").to_numpy().copy()
    times[5] += np.timedelta64(30, "m")
    era.assign_coords(valid_time=times).to_netcdf(path)


@pytest.mark.battery
@pytest.mark.parametrize(
    ("case", "said"), [("5h", "valid times every 5 h;"), ("irregular", "valid times at irregular spacings (0.5 h, 1 h")]
)
def test_tp_at_a_spacing_that_does_not_divide_24h_is_refused_in_one_line(forecasts, capsys, tmp_path, case, said):
    src, inits = forecasts
    truth = tmp_path / f"era5_{case}.nc"
    _era5(truth, inits, every_h=5) if case == "5h" else _irregular(truth, inits)
    out = tmp_path / "s.zarr"
    res = in_process(
        ["ingest", str(src), "--truth", str(truth), "--out", str(out), "--threads", "--variables", "u10,v10,tp,t2m"],
        capsys,
    )
    assert_ok(f"ingest: truth tp at spacing {case}", res, safe=not contract.is_complete(out))
    assert res.code == 65
    assert f"{truth}: tp (precipitation) has {said}" in res.error_lines[0]
    assert "a regular spacing that divides 24 h" in res.error_lines[0]


@pytest.mark.battery
def test_truth_of_u10_alone_is_refused_naming_what_ws10_needs(forecasts, capsys, tmp_path):
    src, inits = forecasts
    _era5(tmp_path / "era5_u_only.nc", inits, names=("u10",))
    out = tmp_path / "s.zarr"
    res = in_process(
        [
            "ingest",
            str(src),
            "--truth",
            str(tmp_path / "era5_u_only.nc"),
            "--out",
            str(out),
            "--threads",
            "--variables",
            "u10,v10,tp,t2m",
        ],
        capsys,
    )
    assert_ok("ingest: truth with u10 alone", res, safe=not contract.is_complete(out))
    assert res.code == 66 and "ws10 is computed from u10 and v10" in res.error_lines[0]


def test_u10_without_v10_gives_no_ws10_truth(forecasts, cli, tmp_path):
    src, inits = forecasts
    _era5(tmp_path / "era5_u.nc", inits, names=("u10", "t2m"))
    proc = _ingest(cli, src, tmp_path / "era5_u.nc", tmp_path / "s.zarr")
    assert proc.returncode == 0, proc.stderr[-3000:]
    ds = contract.open_store(tmp_path / "s.zarr")
    assert ds.attrs["targets"] == ["t2m"] and "truth_ws10" not in ds.data_vars


def test_evaluate_scores_ws10_on_the_derived_truth(hourly, cli, tmp_path):
    """`postcast evaluate --targets ws10` on the store: the raw members' fair CRPS is that of hypot(u10, v10)
    members against the truth's hypot(u10, v10) (scoringrules)."""
    era, out, _ = hourly
    proc = cli(
        "evaluate",
        str(out),
        "--targets",
        "ws10",
        "--split",
        "test",
        "--bootstrap",
        "20",
        "--out",
        str(tmp_path / "eval"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((tmp_path / "eval" / "metrics.json").read_text())["targets"]["ws10"]
    ds = contract.open_store(out)
    step = contract.step_position(ds.get_index(schema.STEP), 48)
    at = {n: ds[n].isel({schema.STEP: step}).values.astype(np.float64) for n in ("u10", "v10", "truth_ws10")}
    x = np.hypot(at["u10"], at["v10"])  # (T, M, lat, lon)
    y = np.hypot(
        era["u10"].sel(valid_time=ds[schema.INIT_TIME].values + np.timedelta64(48, "h")).values,
        era["v10"].sel(valid_time=ds[schema.INIT_TIME].values + np.timedelta64(48, "h")).values,
    )
    np.testing.assert_allclose(at["truth_ws10"], y[:, ::-1], rtol=1e-6)  # the store is south -> north
    crps = sr.crps_ensemble(y[:, ::-1], x, m_axis=1, estimator="fair").mean()
    np.testing.assert_allclose(res["raw_ensemble"]["global"]["crps_fair"], crps, rtol=1e-6)


def test_tp24_truth_of_an_in_memory_dataset_in_microseconds(forecasts, tmp_path):
    """pandas 3 / xarray keep datetime64[us] for data built in memory: the spacing was read as nanoseconds
    (1 h as 3.6 ms), and every tp24 truth came out NaN without a word."""
    from postcast.datasets.sources import derived

    _, inits = forecasts
    ds = _era5(tmp_path / "era5.nc", inits)
    us = ds.assign_coords(valid_time=ds["valid_time"].values.astype("datetime64[us]"))
    assert us["valid_time"].dtype == np.dtype("datetime64[us]")
    got = derived.normalise_truth(us)["truth_tp24"].load()
    want = derived.normalise_truth(xr.open_dataset(tmp_path / "era5.nc"))["truth_tp24"].load()
    assert np.isfinite(got.values).any()
    np.testing.assert_allclose(got.values, want.values, rtol=1e-6)
