"""Real GRIB forms (issue 56 items 12 and 13), written here with eccodes: a TIGGE-style GRIB2 control forecast
of several parameters whose precipitation is paramId 228228 in kg m**-2 (mm), not ECMWF's paramId 228 in m.
Each parameter's units come from its own message and are converted to the store's (one table,
datasets/sources/conventions.py); the stored values are checked against eccodes' own decode of the file."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import eccodes
import numpy as np
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
