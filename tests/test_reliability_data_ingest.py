"""Ingest checks a source's coordinates as the service checks a forecast file's (issue 56 items 1 and 16):
a netCDF source whose latitudes or longitudes are not finite, not monotonic, repeated or out of range is
refused in one line naming the coordinate (exit 65), not blamed on the grid. Real netCDF files, the real
ingest, in process."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from battery import assert_ok, in_process

from postcast.datasets import contract

LAT = np.arange(90.0, -91.0, -10.0)  # 19 rows, north to south as cfgrib writes them
LON = np.arange(0.0, 360.0, 10.0)  # 36 columns


def write_source(path, lat=LAT, lon=LON, inits=("2017-01-02", "2017-01-09"), steps=(0, 24, 48)) -> None:
    """A cfgrib-like netCDF ensemble of t2m (2 members) on the given coordinates."""
    rng = np.random.default_rng(0)
    shape = (len(inits), 2, len(steps), len(lat), len(lon))
    t2m = 280.0 + rng.normal(0.0, 2.0, shape)
    xr.Dataset(
        {"t2m": (("time", "number", "step", "latitude", "longitude"), t2m.astype(np.float32), {"units": "K"})},
        coords={
            "time": pd.to_datetime(list(inits)),
            "number": [1, 2],
            "step": pd.to_timedelta(list(steps), unit="h"),
            "latitude": ("latitude", np.asarray(lat, np.float64)),
            "longitude": ("longitude", np.asarray(lon, np.float64)),
        },
    ).to_netcdf(path)


def ingest(src, out, capsys, *extra: str):
    return in_process(["ingest", str(src), "--out", str(out), "--threads", "--workers", "1", *extra], capsys)


def _changed(axis: np.ndarray, kind: str) -> np.ndarray:
    out = axis.copy()
    if kind == "nan":
        out[5] = np.nan
    elif kind == "not monotonic":
        out[[3, 4]] = out[[4, 3]]
    elif kind == "repeated":
        out[4] = out[3]
    else:  # out of range
        out[-1] = 9.96921e36  # netCDF's default fill value, unmasked
    return out


FAULTS = {"nan": "not finite", "not monotonic": "not monotonic", "repeated": "repeated", "out of range": "outside"}


@pytest.mark.battery
@pytest.mark.parametrize("axis", ["latitude", "longitude"])
@pytest.mark.parametrize("kind", list(FAULTS))
def test_a_source_with_bad_coordinates_is_refused_naming_them(tmp_path, capsys, axis, kind):
    """A NaN latitude was refused as "no 10 deg grid fits inside this source ... choose another --grid"."""
    src = tmp_path / "forecast.nc"
    if axis == "latitude":
        write_source(src, lat=_changed(LAT, kind))
    else:
        write_source(src, lon=_changed(LON, kind))
    out = tmp_path / "s.zarr"
    res = ingest(src, out, capsys)
    assert_ok(f"ingest: {axis} {kind}", res, not contract.is_complete(out))
    line = res.error_lines[0]
    assert res.code == 65 and f"{axis} {FAULTS[kind]}" in line and "forecast.nc" in line, res.err
    assert "--grid" not in line


def test_a_regional_source_across_the_date_line_is_not_a_coordinate_fault(tmp_path, capsys):
    """170..180, -170..-150 (eastward across the date line) is monotonic around the circle: ingested."""
    src = tmp_path / "pacific.nc"
    write_source(src, lat=np.arange(60.0, 19.0, -10.0), lon=np.array([170.0, 180.0, -170.0, -160.0, -150.0]))
    res = ingest(src, tmp_path / "s.zarr", capsys)
    assert res.code == 0, res.err
    ds = contract.open_store(tmp_path / "s.zarr")
    assert ds["longitude"].values.tolist() == [170.0, 180.0, 190.0, 200.0, 210.0]


def test_statistics_that_are_not_finite_are_valid_json_and_shown_as_a_dash():
    """inspect --json printed bare NaN and -Infinity for a store whose truth held Inf (issue 56 item 2)."""
    from postcast.datasets import inspection

    level = xr.DataArray([850], dims="level")
    stats = xr.Dataset(
        {
            "t2m_mean": ((), np.nan),
            "t2m_std": ((), np.inf),
            "t2m_min": ((), -np.inf),
            "t2m_max": ((), 300.0),
            "t_mean": (("level",), [250.0]),
            "t_std": (("level",), [5.0]),
            "t_min": (("level",), [200.0]),
            "t_max": (("level",), [np.nan]),
        },
        coords={"level": level},
    )
    table = inspection._stats_table(stats)
    text = json.dumps(table, allow_nan=False)  # raises on NaN or Infinity
    assert json.loads(text)["fields"] == {
        "t2m": {"mean": None, "std": None, "min": None, "max": 300.0},
        "t@850": {"mean": 250.0, "std": 5.0, "min": 200.0, "max": None},
    }


def test_a_nan_value_is_located_by_its_step_in_hours(tmp_path, capsys):
    """The step was printed as '172800000000000 nanoseconds' / '10800000000 microseconds' (issue 56 item 13)."""
    src = tmp_path / "forecast.nc"
    write_source(src)
    with xr.open_dataset(src) as ds:
        poked = ds.load()
    poked["t2m"][0, 1, 2, 4, 5] = np.nan  # first date, member 2, step 48 h
    poked.to_netcdf(tmp_path / "nan.nc")
    res = ingest(tmp_path / "nan.nc", tmp_path / "s.zarr", capsys)
    assert res.code == 65 and "1 NaN values in 't2m'" in res.error_lines[0], res.err
    assert "'step': '48 h'" in res.error_lines[0] and "second" not in res.error_lines[0], res.err


def test_a_source_of_step_0_only_says_the_store_has_no_48_h_lead(cli, tmp_path):
    """It was ingested without a word: the store's target lead is then 0 h, the analysis (issue 56 item 16)."""
    src = tmp_path / "analysis.nc"
    write_source(src, steps=(0,))
    proc = cli("ingest", str(src), "--out", str(tmp_path / "s.zarr"), "--threads", "--workers", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    warned = [ln for ln in proc.stderr.splitlines() if "WARNING" in ln and "no 48 h lead" in ln]
    assert len(warned) == 1 and "target lead is 0 h" in warned[0] and "step 48 h" in warned[0], proc.stderr


def test_a_source_with_the_48_h_lead_gets_no_such_warning(cli, tmp_path):
    src = tmp_path / "forecast.nc"
    write_source(src)
    proc = cli("ingest", str(src), "--out", str(tmp_path / "s.zarr"), "--threads", "--workers", "1")
    assert proc.returncode == 0 and "no 48 h lead" not in proc.stderr, proc.stderr[-3000:]
