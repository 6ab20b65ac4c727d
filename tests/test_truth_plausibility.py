"""The truth passes the plausibility checks a forecast's fields pass (datasets/plausibility.py): mislabelled
units, impossible values, running accumulations given as amounts, negative amounts and duplicate times are
refused at ingest in one line (exit 65), not stored; forecast accumulations that shrink with the step are
refused too (a 24 h amount from them would be dry everywhere). Real netCDF/zarr files, the real ingest."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from battery import assert_ok, in_process
from forecast_only import forecast_only

from postcast.datasets import contract, plausibility, schema
from postcast.datasets.synth.synthetic import SynthConfig

RAW = SynthConfig(seed=7, resolution=10.0, years=(2016, 2017), dates_per_year=2, levels=(850,), targets=("t2m", "tp24"))
LAT = np.arange(90.0, -91.0, -10.0)
LON = np.arange(0.0, 360.0, 10.0)


@pytest.fixture(scope="module")
def raw(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """A forecast-only source (4 dates, 10 deg), its init times and the synthetic forecast zarr."""
    return forecast_only(RAW, tmp_path_factory.mktemp("truth_plausibility"))


def _truth(path, inits, **fields: tuple[np.ndarray | float, str]) -> None:
    """An hourly ERA5-like file from 12 h before each init to +48 h: ``name=(values or a constant, units)``;
    the default: t2m of 285 K, u10 / v10 of 5 m/s and random hourly tp."""
    spans = [pd.date_range(end=t + pd.Timedelta(hours=48), periods=61, freq="1h") for t in inits]
    times = spans[0].append(spans[1:]).unique().sort_values()
    shape = (times.size, LAT.size, LON.size)
    rng = np.random.default_rng(0)
    base = {"t2m": (285.0, "K"), "u10": (5.0, "m s**-1"), "v10": (5.0, "m s**-1")}
    base["tp"] = (rng.exponential(0.3e-3, shape), "m")
    data = {}
    for name, (values, units) in {**base, **fields}.items():
        arr = np.broadcast_to(values(times.size) if callable(values) else values, shape).astype(np.float32)
        data[name] = (("valid_time", "latitude", "longitude"), arr, {"units": units})
    xr.Dataset(data, coords={"valid_time": times, "latitude": LAT, "longitude": LON}).to_netcdf(path)


def _ingest(src, truth, out, capsys):
    argv = ["ingest", str(src), "--truth", str(truth), "--out", str(out), "--threads", "--workers", "1"]
    return in_process([*argv, "--variables", "u10,v10,tp,t2m"], capsys)


def _running(n: int) -> np.ndarray:
    """ERA5's forecast-based tp: 0.1 mm per hour accumulated since the last 06/18 UTC restart, in m."""
    hours = np.arange(n)
    return ((hours % 12) + 1)[:, None, None] * 1e-4


def _one_infinite(sign: float):
    """285 K everywhere but at one point, ``sign`` * Inf at every time."""

    def values(n: int) -> np.ndarray:
        out = np.full((n, LAT.size, LON.size), 285.0)
        out[:, 3, 4] = sign * np.inf
        return out

    return values


CASES = {
    "t2m holding +Inf": ({"t2m": (_one_infinite(1.0), "K")}, "infinite values in 'truth_t2m'"),
    "t2m holding -Inf": ({"t2m": (_one_infinite(-1.0), "K")}, "infinite values in 'truth_t2m'"),
    "t2m in degC labelled K": ({"t2m": (12.0, "K")}, "labelled as K"),
    "t2m of 1e6 K": ({"t2m": (1e6, "K")}, "'t2m' has median 1e+06 K"),
    "u10 of 3e4 m/s": ({"u10": (3e4, "m s**-1")}, "ws10"),
    "hourly tp of 0.1 m": ({"tp": (0.1, "m")}, "tp24"),
    "running tp accumulations": ({"tp": (_running, "m")}, "running accumulation"),
    "negative tp": ({"tp": (-1e-3, "m")}, "negative"),
}


@pytest.mark.battery
@pytest.mark.parametrize("case", list(CASES))
def test_implausible_truth_is_refused(raw, tmp_path, capsys, case):
    fields, said = CASES[case]
    src, inits, _ = raw
    _truth(tmp_path / "era5.nc", inits, **fields)
    out = tmp_path / "s.zarr"
    res = _ingest(src, tmp_path / "era5.nc", out, capsys)
    assert_ok(f"ingest --truth: {case}", res, not contract.is_complete(out))
    assert res.code == 65 and said in res.error_lines[0] and "era5.nc" in res.error_lines[0]


@pytest.mark.battery
def test_truth_with_a_duplicate_time_is_refused(raw, tmp_path, capsys):
    src, inits, _ = raw
    _truth(tmp_path / "one.nc", inits)
    with xr.open_dataset(tmp_path / "one.nc") as ds:
        twice = xr.concat([ds, ds.isel(valid_time=[3])], "valid_time").load()
    twice.to_netcdf(tmp_path / "era5.nc")
    out = tmp_path / "s.zarr"
    res = _ingest(src, tmp_path / "era5.nc", out, capsys)
    assert_ok("ingest --truth: a duplicate valid time", res, not contract.is_complete(out))
    assert res.code == 65 and "appears more than once" in res.error_lines[0]


def test_plausible_truth_is_stored(raw, tmp_path, capsys):
    """The checks pass sound truth (the default file): the store holds its t2m and the hand-summed tp24."""
    src, inits, _ = raw
    _truth(tmp_path / "era5.nc", inits)
    out = tmp_path / "s.zarr"
    assert _ingest(src, tmp_path / "era5.nc", out, capsys).code == 0
    with xr.open_dataset(tmp_path / "era5.nc") as era:
        ends = inits + pd.Timedelta(hours=48)
        want = np.stack(
            [era["tp"].sel(valid_time=slice(v - pd.Timedelta(hours=23), v)).sum("valid_time") for v in ends]
        )
    store = contract.open_store(out)
    got = store["truth_tp24"].isel(step=contract.step_position(store.get_index(schema.STEP), 48))
    np.testing.assert_allclose(got.sortby(schema.LAT, ascending=False).values, want * 1000.0, rtol=1e-4)


def test_value_range_of_derived_targets_follows_their_declaration():
    """ws10 up to the magnitude of two components at their limit (100 m/s each: 141.4 m/s); tp24 from its
    clip (0) to tp's largest amount (1 m) in mm."""
    assert plausibility.value_range(schema.target("ws10")) == pytest.approx((0.0, 100.0 * 2**0.5))
    assert plausibility.value_range(schema.target("tp24")) == (0.0, 1000.0)
    assert plausibility.value_range(schema.target("t2m")) == (180.0, 340.0)


@pytest.mark.battery
def test_forecast_accumulation_that_shrinks_with_the_step_is_refused(raw, tmp_path, capsys):
    """tp given as amounts per step (falling from one step to the next) was clipped at 0 into a dry tp24."""
    _, _, fc = raw
    ds = xr.open_zarr(fc, consolidated=False).load()
    ds["tp"] = ds["tp"].isel(step=slice(None, None, -1)).assign_coords(step=ds["step"])
    ds["tp"].attrs.update(units="m")
    src = tmp_path / "fc"
    src.mkdir()
    ds.to_zarr(src / "forecast.zarr", consolidated=False)
    out = tmp_path / "s.zarr"
    res = in_process(["ingest", str(src), "--out", str(out), "--threads", "--workers", "1"], capsys)
    assert_ok("ingest: forecast tp shrinking with the step", res, not contract.is_complete(out))
    assert res.code == 65 and "decreases from one step to the next" in res.error_lines[0]
