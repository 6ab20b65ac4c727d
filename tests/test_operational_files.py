"""Operational GRIB files of the forms real users have (issue 30), written here with eccodes: a GRIB2 control
forecast of 25 surface parameters, a control + 50-member GRIB1 file at +78 h, a GRIB1 seasonal ensemble of
monthly means whose starts have different steps, accumulated precipitation across steps. Each goes through
``postcast inspect FILE``, ``postcast ingest`` and ``postcast inspect STORE`` (or a clean refusal)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import eccodes
import numpy as np
import pandas as pd
import pytest
import xarray as xr

from postcast.datasets import contract, schema, sources
from postcast.datasets.core.errors import ConfigError
from postcast.datasets.sources import messages as grib

GRID = schema.Grid(5.0)  # 37 x 72, global: small files, a regular grid the store keeps as is
# 25 surface parameters of an ECMWF control forecast (paramId); tp and cp are accumulations since step 0,
# mx2t6 / mn2t6 / 10fg a maximum / minimum over the 6 h before the step
SURFACE_25 = (
    167,
    168,
    165,
    166,
    151,
    134,
    164,
    136,
    137,
    235,
    34,
    31,
    141,
    59,
    186,
    187,
    188,
    228246,
    228247,
    228,
    143,
    121,
    122,
    49,
    3020,
)
TYPICAL = {
    167: 280.0,
    168: 275.0,
    151: 101_300.0,
    134: 98_000.0,
    235: 282.0,
    34: 290.0,
    3020: 20_000.0,
    136: 25.0,
    137: 24.0,
    59: 100.0,
}  # a plausible level (canonical units); 0 for the others


def _values(pid: int, rng: np.random.Generator, scale: float = 1.0) -> np.ndarray:
    """A plausible field, north -> south as GRIB scans it (n_lat * n_lon values)."""
    base = TYPICAL.get(pid, 0.0)
    noise = rng.normal(0.0, 3.0 if base > 100 else 0.01, GRID.shape)
    if pid in (164, 186, 187, 188, 31):  # fractions
        return np.clip(0.5 + noise, 0.0, 1.0).ravel()
    if pid in (228, 143):  # accumulations from the forecast's start: one pattern growing with the step
        return (np.abs(np.random.default_rng(pid).normal(0.0, 0.01, GRID.shape)) * scale).ravel()
    if pid == 141:  # a depth: non-negative
        return (np.abs(noise) * scale).ravel()
    return (base + noise * (100 if pid in (151, 134) else 1)).ravel()


def _grid_keys(h: int) -> None:
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


def _write(path: Path, messages: Iterable[dict[str, object]], sample: str) -> Path:
    """One message per dict of eccodes keys (set in order; ``values`` last), written with eccodes."""
    with open(path, "wb") as f:
        for keys in messages:
            h = eccodes.codes_grib_new_from_samples(sample)
            try:
                _grid_keys(h)
                values = keys.pop("values")
                for key, value in keys.items():
                    eccodes.codes_set(h, key, value)
                eccodes.codes_set_values(h, np.asarray(values, dtype=np.float64))
                eccodes.codes_write(h, f)
            finally:
                eccodes.codes_release(h)
    return path


GRIB2_ECMWF = {"centre": "ecmf", "setLocalDefinition": 1, "localDefinitionNumber": 1}  # dataType (marsType) cf/pf


def _window(pid: int) -> int | None:
    """Hours of a maximum / minimum parameter's window (None: instantaneous or accumulated since 0)."""
    return 6 if pid in (121, 122, 49) else None


def write_control_25(path: Path, steps: tuple[int, ...] = (0, 6, 12)) -> Path:
    """A GRIB2 control forecast (dataType cf, number 0) of 25 surface parameters, 2024-01-15 00 UTC."""
    rng = np.random.default_rng(1)

    def messages() -> Iterable[dict[str, object]]:
        for step in steps:
            for pid in SURFACE_25:
                if _window(pid) and step == 0:
                    continue  # a 6 h maximum starts at step 6
                keys: dict[str, object] = {
                    **GRIB2_ECMWF,
                    "marsType": "cf",
                    "productDefinitionTemplateNumber": 1,
                    "paramId": pid,
                    "dataDate": 20240115,
                    "dataTime": 0,
                    "typeOfEnsembleForecast": 1,
                    "number": 0,
                    "numberOfForecastsInEnsemble": 51,
                }
                window = _window(pid)
                if window or pid in (228, 143):
                    keys |= {"startStep": step - window if window else 0, "endStep": step}
                else:
                    keys |= {"step": step}
                yield keys | {"values": _values(pid, rng, scale=step / 6)}

    return _write(path, messages(), "GRIB2")


def write_lead_78(path: Path, dates: tuple[int, ...] = (20120301, 20120302)) -> Path:
    """A GRIB1 control (number 0, cf) + 50 perturbed members (pf) of 2t and msl at step 78 h."""
    rng = np.random.default_rng(2)

    def messages() -> Iterable[dict[str, object]]:
        for date in dates:
            for number in range(51):
                for pid in (167, 151):
                    yield {
                        "centre": "ecmf",
                        "setLocalDefinition": 1,
                        "localDefinitionNumber": 1,
                        "marsType": "cf" if number == 0 else "pf",
                        "numberOfForecastsInEnsemble": 51,
                        "paramId": pid,
                        "dataDate": date,
                        "dataTime": 0,
                        "number": number,
                        "step": 78,
                        "bitsPerValue": 16,
                        "values": _values(pid, rng),
                    }

    return _write(path, messages(), "regular_ll_sfc_grib1")


SEASONAL_STARTS = {
    20170101: ((0, 744), (744, 1416)),
    20170201: ((0, 672), (672, 1416)),
    20170301: ((0, 744), (744, 1464)),
}  # (startStep, endStep) h: calendar months from each start


def write_seasonal_means(path: Path, members: int = 28) -> Path:
    """A GRIB1 seasonal ensemble of monthly means of 2t (stepType avg: timeRangeIndicator 3), each start with
    its own steps (the month lengths)."""
    rng = np.random.default_rng(3)

    def messages() -> Iterable[dict[str, object]]:
        for date, windows in SEASONAL_STARTS.items():
            for number in range(members):
                for start, end in windows:
                    yield {
                        "centre": "ecmf",
                        "setLocalDefinition": 1,
                        "localDefinitionNumber": 1,
                        "marsType": "fcmean",
                        "numberOfForecastsInEnsemble": members,
                        "paramId": 167,
                        "dataDate": date,
                        "dataTime": 0,
                        "number": number,
                        "stepType": "avg",
                        "startStep": start,
                        "endStep": end,
                        "values": _values(167, rng),
                    }

    return _write(path, messages(), "regular_ll_sfc_grib1")


def write_tp_accumulated(path: Path, steps: tuple[int, ...] = (0, 6, 12, 18, 24), window: int | None = None) -> Path:
    """A GRIB2 ensemble (members 1..4) of tp accumulated from step 0 (``window``: over the last N hours) and
    2t, 2012-03-01 00 UTC. Returns the path; the tp values grow with the step."""
    rng = np.random.default_rng(4)

    def messages() -> Iterable[dict[str, object]]:
        total = {m: np.zeros(GRID.shape[0] * GRID.shape[1]) for m in range(1, 5)}
        for step in steps:
            for number in range(1, 5):
                base = {
                    **GRIB2_ECMWF,
                    "marsType": "pf",
                    "productDefinitionTemplateNumber": 1,
                    "dataDate": 20120301,
                    "dataTime": 0,
                    "typeOfEnsembleForecast": 3,
                    "number": number,
                    "numberOfForecastsInEnsemble": 51,
                }
                yield base | {"paramId": 167, "step": step, "values": _values(167, rng)}
                rain = _values(228, rng) * (step > 0)
                total[number] = total[number] + rain
                start = 0 if window is None else max(step - window, 0)
                yield base | {
                    "paramId": 228,
                    "startStep": start,
                    "endStep": step,
                    "values": total[number] if window is None else rain,
                }

    return _write(path, messages(), "GRIB2")


# --- helpers -------------------------------------------------------------------------------------
def _ingest(cli, src: Path, out: Path, *extra: str):
    return cli("--log-level", "INFO", "ingest", str(src), "--out", str(out), "--threads", *extra)


def _error(proc) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("postcast: error:")]
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


def _stored(out: Path) -> list[str]:
    ds = contract.open_store(out)
    return sorted(str(v) for v in ds.data_vars if str(v) in ds.attrs["plan"]["variables"])


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("operational")
    return {
        "control25": write_control_25(d / "control25.grib2"),
        "lead78": write_lead_78(d / "ens78.grib"),
        "seasonal": write_seasonal_means(d / "seasonal_means.grib"),
        "tp": write_tp_accumulated(d / "tp.grib2"),
    }


# --- 1, 2: a file with more parameters than the schema; names as users type them ---------------------------
def test_extra_parameters_are_skipped_with_one_info_line(cli, files, tmp_path):
    """The 25-parameter control forecast was refused whole: "message 2 holds '2d' (paramId 168), not an ENS-10
    variable" (exit 65). Now the schema's parameters are taken, the others named in one INFO line."""
    out = tmp_path / "s.zarr"
    proc = _ingest(cli, files["control25"], out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _stored(out) == sorted(["t2m", "u10", "v10", "msl", "tcc", "tcw", "tcwv", "skt", "sst", "tp", "cp"])
    skipped = [ln for ln in proc.stderr.splitlines() if "not taken" in ln]
    assert len(skipped) == 1 and "2d (paramId 168" in skipped[0] and "mx2t6" in skipped[0], proc.stderr[-3000:]


@pytest.mark.parametrize("names", ["2t,10u", "t2m,u10", "167,165", "2 metre temperature,10 metre U wind component"])
def test_variables_by_grib_name_param_id_or_postcast_name(cli, files, tmp_path, names):
    """`--variables 2t` was "unknown" and `--variables t2m` gave the whole-file refusal: any name of a
    parameter takes exactly it."""
    out = tmp_path / "s.zarr"
    proc = _ingest(cli, files["control25"], out, "--variables", names)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _stored(out) == ["t2m", "u10"]


def test_parameter_beyond_the_schema_on_request(cli, files, tmp_path):
    """2d and mx2t6 are ingested as generic variables, labelled from their GRIB keys; plausibility checks are
    skipped and the log says so. mx2t6 (a 6 h maximum) carries its cell method and window."""
    out = tmp_path / "s.zarr"
    proc = _ingest(cli, files["control25"], out, "--variables", "2d,mx2t6,2t", "--steps", "6,12")
    assert proc.returncode == 0, proc.stderr[-3000:]
    ds = contract.open_store(out)
    assert _stored(out) == ["d2m", "mx2t6", "t2m"]
    assert ds["d2m"].attrs["GRIB_paramId"] == 168 and ds["d2m"].attrs["units"] == "K"
    assert ds["mx2t6"].attrs["cell_methods"] == "time: maximum"
    assert ds["mx2t6"].attrs["time_window"] == "the 6 h before the step"
    assert "not checked for plausibility" in proc.stderr
    src = grib.index_file(files["control25"])
    row = src[(src.short_name == "2d") & (src.step_h == 12)].iloc[0]
    want = grib.decode(files["control25"], [(row.offset, row.length)], GRID.shape)[0]  # latitude ascending
    np.testing.assert_array_equal(ds["d2m"].sel(step=pd.Timedelta(hours=12)).values[0, 0], want)


def test_a_parameter_without_step_0_is_missing_with_the_steps_to_pass(cli, files, tmp_path):
    """Issue 38 item 10: a 6 h maximum has no step 0 (nor does a centre's tp at times); the missing fields
    are listed and the line names the steps every field has (it offered no fix)."""
    proc = _ingest(cli, files["control25"], tmp_path / "s.zarr", "--variables", "2t,mx2t6")
    assert proc.returncode == 66
    assert "mx2t6 member 0 step 0 h" in _error(proc)
    assert _error(proc).endswith("pass --steps 6,12 to ingest the steps every field has")


def test_a_name_the_file_lacks_is_missing_naming_what_it_holds(cli, files, tmp_path):
    proc = _ingest(cli, files["control25"], tmp_path / "s.zarr", "--variables", "2t,nope")
    assert proc.returncode == 66
    assert "variable nope" in _error(proc) and "2d (paramId 168" in _error(proc)


def test_folder_of_grib2_files(cli, files, tmp_path):
    """(issue 29) a folder of *.grib2 files is GRIB forecasts, not "no forecasts found"."""
    folder = tmp_path / "in"
    folder.mkdir()
    write_control_25(folder / "a.grib2", steps=(0,))
    write_control_25(folder / "b.grib2", steps=(6, 12))
    out = tmp_path / "s.zarr"
    proc = _ingest(cli, folder, out, "--variables", "2t")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert contract.open_store(out).sizes["step"] == 3


# --- 3: a store whose lead is not 48 h -------------------------------------------------------------------
def _truth_t2m(path: Path, valid: list[str]) -> Path:
    """ERA5-like t2m at the given valid times (netCDF, latitude north -> south)."""
    rng = np.random.default_rng(5)
    da = xr.DataArray(
        280.0 + rng.normal(0.0, 3.0, (len(valid), *GRID.shape)).astype(np.float32),
        dims=("time", "latitude", "longitude"),
        attrs={"units": "K"},
        coords={"time": pd.to_datetime(valid), "latitude": GRID.latitudes()[::-1], "longitude": GRID.longitudes()},
    )
    da.to_dataset(name="t2m").to_netcdf(path)
    return path


def test_lead_78_store_inspects(cli, files, tmp_path):
    """Inspecting the +78 h store ended in KeyError "not all values found in index 'step'" (_stats_table);
    the truth was reported missing at 48 h for every date (coverage looked at 48 h only)."""
    out = tmp_path / "s.zarr"
    truth = _truth_t2m(tmp_path / "era5_t2m.nc", ["2012-03-04T06"])  # 2012-03-01 + 78 h only
    proc = _ingest(cli, files["lead78"], out, "--truth", str(truth))
    assert proc.returncode == 0, proc.stderr[-3000:]
    ds = contract.open_store(out)
    assert ds.sizes["member"] == 51 and list(ds["step"].values) == [pd.Timedelta(hours=78)]
    assert ds.attrs["truth_missing_at_48h"] == {"truth_t2m": ["2012-03-02"]}
    shown = cli("inspect", str(out))
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert "shown at 78 h" in shown.stdout and "missing at 78 h: {'truth_t2m': 1}" in shown.stdout
    info = json.loads(cli("inspect", str(out), "--json").stdout)
    stats = contract.open_statistics(out)
    assert info["statistics"]["fields"]["t2m"]["mean"] == pytest.approx(float(stats["t2m_mean"].values[0]))


# --- 4: time-processed fields, starts with their own steps --------------------------------------------
def test_monthly_means_are_refused_saying_what_they_are(cli, files, tmp_path):
    """Was "4312 forecast fields missing: ... step 696 h ...": monthly means (stepType avg) of starts with
    their own steps. Now one line says so; nothing is stored as instantaneous t2m."""
    out = tmp_path / "s.zarr"
    proc = _ingest(cli, files["seasonal"], out)
    assert proc.returncode == 65
    err = _error(proc)
    assert "time-processed" in err and "time: mean" in err and "stepType avg" in err and "missing" not in err
    assert "28 members, 3 starts" in err
    assert not out.exists()


def test_lagged_instantaneous_starts_are_refused_naming_the_fix(cli, tmp_path):
    """Instantaneous fields whose starts have their own steps (a lagged ensemble): refused naming --steps,
    not reported as missing fields; with --steps, the steps every start has are ingested."""
    folder = tmp_path / "lagged"
    folder.mkdir()
    write_tp_accumulated(folder / "a.grib2", steps=(0, 6, 12))
    _shift_date(write_tp_accumulated(tmp_path / "late.grib2", steps=(6, 12, 18)), folder / "b.grib2", 20120229)
    proc = _ingest(cli, folder, tmp_path / "s.zarr", "--variables", "t2m")
    assert proc.returncode == 65
    err = _error(proc)
    assert "different steps" in err and "--steps 6,12" in err and "missing" not in err
    proc = _ingest(cli, folder, tmp_path / "s.zarr", "--variables", "t2m", "--steps", "6,12")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert contract.open_store(tmp_path / "s.zarr").sizes["init_time"] == 2


def _shift_date(src: Path, dst: Path, date: int) -> None:
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        while (h := eccodes.codes_grib_new_from_file(fin)) is not None:
            eccodes.codes_set(h, "dataDate", date)
            eccodes.codes_write(h, fout)
            eccodes.codes_release(h)


def test_accumulated_precipitation_across_steps(cli, files, tmp_path):
    """tp accumulated from step 0 is ingested as the schema's tp, labelled 'time: sum' from step 0."""
    out = tmp_path / "s.zarr"
    proc = _ingest(cli, files["tp"], out, "--variables", "tp")
    assert proc.returncode == 0, proc.stderr[-3000:]
    ds = contract.open_store(out)
    assert ds["tp"].attrs["cell_methods"] == "time: sum"
    tp = ds["tp"].values[0]  # (member, step, lat, lon)
    assert (np.diff(tp, axis=1) >= -1e-6).all() and float(tp[:, -1].mean()) > 0
    assert cli("inspect", str(out)).returncode == 0


def test_precipitation_over_6h_windows_is_not_tp_since_start(cli, tmp_path):
    path = write_tp_accumulated(tmp_path / "tp6.grib2", window=6)
    proc = _ingest(cli, path, tmp_path / "s.zarr", "--variables", "tp")
    assert proc.returncode == 65
    err = _error(proc)
    assert "the 6 h before the step" in err and "accumulated from step 0" in err


# --- inspect FILE ----------------------------------------------------------------------------------
def test_inspect_file_lists_what_a_grib_file_holds(cli, files):
    proc = cli("inspect", str(files["control25"]))
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = proc.stdout
    for needle in ("2d", "168", "not in schema", "t2m", "mx2t6", "max", "accum", "regular_ll 5 deg 37x72"):
        assert needle in text, needle
    info = json.loads(cli("inspect", str(files["control25"]), "--json").stdout)
    assert len(info["parameters"]) == 25
    assert info["members"] == [0] and info["steps_h"] == [0, 6, 12]
    seasonal = json.loads(cli("inspect", str(files["seasonal"]), "--json").stdout)
    assert seasonal["parameters"][0]["step_type"] == "avg" and len(seasonal["members"]) == 28
    assert len(seasonal["starts"]) == 3


def test_inspect_file_netcdf(cli, synth_netcdf):
    nc = next(p for p in sorted(synth_netcdf.iterdir()) if p.name.startswith("output.sfc."))
    proc = cli("inspect", str(nc))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "t2m" in proc.stdout and "number" in proc.stdout


def test_expectation_resolves_names():
    assert sources.Expectation(variables=("2t", "165", "MSL", "d2m")).variables == ("t2m", "u10", "msl", "d2m")
    with pytest.raises(ConfigError, match="more than once"):
        sources.Expectation(variables=("2t", "t2m"))


def test_netcdf_variables_beyond_the_schema_are_named_once(cli, tmp_path):
    """A cfgrib-style netCDF file with d2m next to t2m: t2m is taken, d2m named in one INFO line (it was
    dropped without a word)."""
    rng = np.random.default_rng(6)
    shape = (2, 1, 2, *GRID.shape)  # (number, time, step, latitude, longitude)
    coords = {
        "number": [1, 2],
        "time": pd.to_datetime(["2012-03-01"]),
        "step": pd.to_timedelta([0, 24], unit="h"),
        "latitude": GRID.latitudes()[::-1],
        "longitude": GRID.longitudes(),
    }
    dims = tuple(coords)
    ds = xr.Dataset(
        {
            n: (dims, (v + rng.normal(0.0, 2.0, shape)).astype(np.float32), {"units": "K"})
            for n, v in (("t2m", 280.0), ("d2m", 275.0))
        },
        coords=coords,
    )
    ds.to_netcdf(tmp_path / "f.nc")
    out = tmp_path / "s.zarr"
    proc = _ingest(cli, tmp_path / "f.nc", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _stored(out) == ["t2m"]
    lines = [ln for ln in proc.stderr.splitlines() if "not taken: d2m" in ln]
    assert len(lines) == 1, proc.stderr[-3000:]
    shown = cli("inspect", str(tmp_path / "f.nc"))
    assert shown.returncode == 0 and "d2m" in shown.stdout and "not in schema" in shown.stdout
