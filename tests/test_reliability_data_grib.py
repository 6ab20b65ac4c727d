"""Real GRIB forms (issue 56 items 12 and 13), written here with eccodes: a TIGGE-style GRIB2 control forecast
of several parameters whose precipitation is paramId 228228 in kg m**-2 (mm), not ECMWF's paramId 228 in m.
Each parameter's units come from its own message and are converted to the store's (one table,
datasets/sources/conventions.py); the stored values are checked against eccodes' own decode of the file."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import eccodes
import numpy as np
import pytest
from battery import in_process

from postcast.datasets import contract, schema

GRID = schema.Grid(5.0)  # 37 x 72, global
STEPS = (0, 24, 48)
TIGGE = {  # paramId -> (a typical value in the message's own units, its spread)
    167: (280.0, 5.0),  # 2t, K
    151: (101_300.0, 500.0),  # msl, Pa
    165: (0.0, 5.0),  # 10u, m s**-1
    166: (0.0, 5.0),  # 10v, m s**-1
    228228: (0.0, 8.0),  # tp, kg m**-2 (mm), accumulated from step 0
}


def _set_grid(h: int) -> None:
    for key, value in (
        ("Ni", GRID.n_lon),
        ("Nj", GRID.n_lat),
        ("latitudeOfFirstGridPointInDegrees", 90.0),
        ("latitudeOfLastGridPointInDegrees", -90.0),
        ("longitudeOfFirstGridPointInDegrees", 0.0),
        ("longitudeOfLastGridPointInDegrees", 360.0 - GRID.resolution),
        ("iDirectionIncrementInDegrees", GRID.resolution),
        ("jDirectionIncrementInDegrees", GRID.resolution),
        ("jScansPositively", 0),
    ):
        eccodes.codes_set(h, key, value)


def _fields(rng: np.random.Generator) -> Iterable[tuple[int, int, np.ndarray]]:
    """(paramId, step, values north to south): tp a running sum of non-negative amounts."""
    rain = np.zeros(GRID.n_lat * GRID.n_lon)
    for step in STEPS:
        for pid, (typical, spread) in TIGGE.items():
            if pid == 228228:
                rain = rain + (step > 0) * np.abs(rng.normal(typical, spread, rain.size))
                yield pid, step, rain
            else:
                yield pid, step, typical + rng.normal(0.0, spread, rain.size)


def write_tigge(path: Path) -> Path:
    """A GRIB2 control forecast (dataType cf, number 0) of 2t, msl, 10u, 10v and tp (228228, mm), 2024-01-15."""
    rng = np.random.default_rng(5)
    with open(path, "wb") as f:
        for pid, step, values in _fields(rng):
            h = eccodes.codes_grib_new_from_samples("GRIB2")
            try:
                _set_grid(h)
                for key, value in (
                    ("centre", "ecmf"),
                    ("productDefinitionTemplateNumber", 11 if pid == 228228 else 1),
                    ("paramId", pid),
                    ("dataDate", 20240115),
                    ("dataTime", 0),
                    ("typeOfEnsembleForecast", 1),
                    ("number", 0),
                    ("numberOfForecastsInEnsemble", 51),
                ):
                    eccodes.codes_set(h, key, value)
                if pid == 228228:
                    eccodes.codes_set(h, "stepType", "accum")
                    eccodes.codes_set(h, "startStep", 0)
                    eccodes.codes_set(h, "endStep", step)
                else:
                    eccodes.codes_set(h, "stepType", "instant")
                    eccodes.codes_set(h, "step", step)
                eccodes.codes_set_values(h, values)
                eccodes.codes_write(h, f)
            finally:
                eccodes.codes_release(h)
    return path


def decoded(path: Path, param_id: int) -> dict[int, tuple[str, np.ndarray]]:
    """eccodes' own decode of a parameter: step -> (its units key, values (lat ascending, lon))."""
    out = {}
    with open(path, "rb") as f:
        while (h := eccodes.codes_grib_new_from_file(f)) is not None:
            try:
                if eccodes.codes_get_long(h, "paramId") == param_id:
                    values = eccodes.codes_get_values(h).reshape(GRID.n_lat, GRID.n_lon)[::-1]
                    out[eccodes.codes_get_long(h, "endStep")] = (eccodes.codes_get_string(h, "units"), values)
            finally:
                eccodes.codes_release(h)
    return out


def test_tigge_precipitation_in_kg_m2_is_stored_in_metres(tmp_path, capsys):
    """Was exit 65: "'tp' spans -8.9e-16..809.1 m, outside the plausible 0..1" (the GRIB units key unread)."""
    src = write_tigge(tmp_path / "tigge.grib2")
    out = tmp_path / "s.zarr"
    res = in_process(["ingest", str(src), "--out", str(out), "--threads", "--workers", "1"], capsys)
    assert res.code == 0, res.err
    ds = contract.open_store(out)
    assert ds["tp"].attrs["units"] == "m"
    for step, (units, mm) in decoded(src, 228228).items():
        assert units == "kg m**-2"
        stored = ds["tp"].sel(step=np.timedelta64(step, "h")).values[0, 0]  # (lat, lon), member 0
        np.testing.assert_allclose(stored, mm / 1000.0, rtol=1e-6, atol=1e-9)
    for step, (units, kelvin) in decoded(src, 167).items():
        assert units == "K"
        np.testing.assert_allclose(ds["t2m"].sel(step=np.timedelta64(step, "h")).values[0, 0], kelvin, rtol=1e-6)


# --- a regional 0.1 deg grid across the prime meridian, rows scanned alternately ---------------------------
NI = 291  # 350 E .. 19 E every 0.1 deg


def write_regional(path: Path, north: float, nj: int) -> Path:
    """A GRIB2 2t field (steps 0 and 3 h) on a 0.1 deg grid from 350 E to 19 E, rows from ``north``
    southwards, alternate rows scanned in opposite directions (no bitmap); its values vary along both axes."""
    lat = north - 0.1 * np.arange(nj)
    lon = 350.0 + 0.1 * np.arange(NI)
    with open(path, "wb") as f:
        for step in (0, 3):
            h = eccodes.codes_grib_new_from_samples("GRIB2")
            try:
                for key, value in (
                    ("Ni", NI),
                    ("Nj", nj),
                    ("latitudeOfFirstGridPointInDegrees", north),
                    ("latitudeOfLastGridPointInDegrees", float(lat[-1])),
                    ("longitudeOfFirstGridPointInDegrees", 350.0),
                    ("longitudeOfLastGridPointInDegrees", 19.0),
                    ("iDirectionIncrementInDegrees", 0.1),
                    ("jDirectionIncrementInDegrees", 0.1),
                    ("jScansPositively", 0),
                    ("alternativeRowScanning", 1),
                    ("paramId", 167),
                    ("stepType", "instant"),
                    ("step", step),
                    ("dataDate", 20240115),
                    ("dataTime", 0),
                ):
                    eccodes.codes_set(h, key, value)
                field = 280.0 + 8.0 * np.cos(np.radians(3 * lat))[:, None] * np.sin(np.radians(4 * lon))[None] + step
                eccodes.codes_set_values(h, field.ravel())
                eccodes.codes_write(h, f)
            finally:
                eccodes.codes_release(h)
    return path


def decoded_points(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """eccodes' decode of the first message: its points' latitudes, longitudes (0..360) and values."""
    with open(path, "rb") as f:
        h = eccodes.codes_grib_new_from_file(f)
    try:
        assert eccodes.codes_get_long(h, "alternativeRowScanning") == 1
        lat, lon = eccodes.codes_get_array(h, "latitudes"), eccodes.codes_get_array(h, "longitudes")
        return lat, np.mod(lon, 360.0), eccodes.codes_get_values(h)
    finally:
        eccodes.codes_release(h)


def _stored_t2m(src: Path, out: Path, capsys) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    res = in_process(["ingest", str(src), "--out", str(out), "--threads", "--workers", "1"], capsys)
    assert res.code == 0, res.err
    ds = contract.open_store(out)
    field = ds["t2m"].sel(step=np.timedelta64(0, "h")).values[0, 0]  # (lat, lon)
    return ds["latitude"].values, np.mod(ds["longitude"].values, 360.0), field


def test_a_regional_grid_across_0_deg_with_alternate_rows_stores_eccodes_values(tmp_path, capsys):
    """Every stored point holds the value eccodes decodes there (no regridding: the grid is the file's)."""
    src = write_regional(tmp_path / "regional.grib2", north=45.0, nj=51)
    lat, lon, field = _stored_t2m(src, tmp_path / "s.zarr", capsys)
    assert field.shape == (51, NI) and not np.isnan(field).any()
    plat, plon, values = decoded_points(src)
    i = np.rint((plat - lat[0]) / 0.1).astype(int)
    j = np.rint(np.mod(plon - lon[0] + 1e-6, 360.0) / 0.1).astype(int)  # (a hair west of 350: column 0)
    assert np.abs(lat[i] - plat).max() < 1e-6
    assert np.abs(np.mod(lon[j] - plon + 180.0, 360.0) - 180.0).max() < 1e-6
    np.testing.assert_allclose(field[i, j], values, rtol=1e-6)


def test_a_regional_grid_across_0_deg_off_the_store_rows_is_regridded_without_a_nan(tmp_path, capsys):
    """Rows at 47.05 .. 30.05 N: the store's 0.1 deg rows lie between them (bilinear in latitude). The east
    column (379 E) was NaN: 0.1 deg steps summed from 350 E overshoot the source's last column by 6e-14."""
    src = write_regional(tmp_path / "offset.grib2", north=47.05, nj=171)
    lat, lon, field = _stored_t2m(src, tmp_path / "s.zarr", capsys)
    assert not np.isnan(field).any() and lon[[0, -1]] == pytest.approx([350.0, 19.0])
    plat, plon, values = decoded_points(src)
    rows = plat.reshape(171, NI)[::-1, 0]  # ascending
    grid = values.reshape(171, NI)[::-1]  # (rows ascending, columns from 350 E)
    assert np.abs(np.mod(plon.reshape(171, NI)[0] - lon + 180.0, 360.0) - 180.0).max() < 1e-6
    expected = np.stack([np.interp(lat, rows, grid[:, k]) for k in range(NI)], axis=1)  # numpy's linear rule
    np.testing.assert_allclose(field, expected, rtol=1e-6)


def test_a_file_holding_no_default_variable_names_what_it_holds_and_the_variables_to_give(tmp_path, capsys):
    """Net long-wave radiation only (str, paramId 177): a report of missing variables, not what to pass."""
    path = tmp_path / "str.grib2"
    with open(path, "wb") as f:
        for pid in (177, 175):  # str, strd
            h = eccodes.codes_grib_new_from_samples("GRIB2")
            try:
                _set_grid(h)
                for key, value in (("paramId", pid), ("stepType", "accum"), ("startStep", 0), ("endStep", 24)):
                    eccodes.codes_set(h, key, value)
                eccodes.codes_set_values(h, np.full(GRID.n_lat * GRID.n_lon, -3e6 if pid == 177 else 2e7))
                eccodes.codes_write(h, f)
            finally:
                eccodes.codes_release(h)
    argv = ["ingest", str(path), "--out", str(tmp_path / "s.zarr"), "--threads", "--workers", "1"]
    res = in_process(argv, capsys)
    assert res.code == 66, res.err
    (line,) = res.error_lines
    assert "str (paramId 177)" in line and "strd (paramId 175)" in line, line
    assert "--variables str,strd" in line, line
    proc = in_process(
        [
            "ingest",
            str(path),
            "--out",
            str(tmp_path / "s.zarr"),
            "--threads",
            "--workers",
            "1",
            "--variables",
            "str,strd",
        ],
        capsys,
    )
    assert proc.code == 0, proc.err
