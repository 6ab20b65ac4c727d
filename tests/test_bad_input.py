"""Bad input: a clear one-line error naming the file and the problem, a non-zero exit code, and no
store that looks complete."""

import contextlib
import io
import json
import shutil

import numpy as np
import pytest

from postcast.datasets.sources import conventions
from postcast.datasets.sources import messages as grib
from postcast.datasets.synth import synthetic, synthfiles
from postcast.datasets.synth.synthetic import SynthConfig

SMALL = SynthConfig(seed=5, resolution=10.0, years=(2016, 2017), dates_per_year=1, levels=(500, 850), format="grib")
PL, SFC = grib.file_name("pl", 7, 2), grib.file_name("sfc", 7, 2)


@pytest.fixture(scope="module")
def good_grib(tmp_path_factory):
    out = tmp_path_factory.mktemp("bad") / "good"
    synthfiles.write_synthetic(SMALL, out, progress=False)
    assert (out / PL).exists() and (out / SFC).exists()
    return out


@pytest.fixture
def src(good_grib, tmp_path):
    d = tmp_path / "src"
    shutil.copytree(good_grib, d)
    return d


def assert_fails(cli, src, tmp_path, code, *needles, extra=()):
    out = tmp_path / "out.zarr"
    proc = cli("ingest", str(src), "--out", str(out), "--threads", *extra)
    err = proc.stderr.strip().splitlines()
    last = [line for line in err if line.startswith("postcast: error:")]
    assert proc.returncode == code, proc.stderr[-2000:]
    assert len(last) == 1, proc.stderr[-2000:]
    for n in needles:
        assert n in last[0], last[0]
    assert not out.exists()  # nothing that looks complete
    return last[0]


def test_good_input_passes(cli, src, tmp_path):
    proc = cli("ingest", str(src), "--out", str(tmp_path / "ok.zarr"), "--threads")
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_truncated_grib(cli, src, tmp_path):
    data = (src / PL).read_bytes()
    (src / PL).write_bytes(data[: len(data) // 2 + 17])
    assert_fails(cli, src, tmp_path, 65, PL, "truncated")


def test_corrupt_grib_header_is_corrupt_not_missing(cli, src, tmp_path):
    """A damaged message header hides the message from eccodes; that is corrupt data (65: re-fetch), not
    a missing field (66 would tell a scheduler to wait and retry)."""
    data = bytearray((src / SFC).read_bytes())
    second = data.find(b"GRIB", 10)
    data[second : second + 4] = b"XXXX"  # the reader cannot find this message any more
    (src / SFC).write_bytes(bytes(data))
    msg = assert_fails(cli, src, tmp_path, 65, "not GRIB", SFC)
    assert "re-fetch" in msg and not (tmp_path / "out.zarr.missing.json").exists()


def test_corrupt_grib_parameter(cli, src, tmp_path):
    data = bytearray((src / SFC).read_bytes())
    data[8 + 8] = 250  # section 1 octet 9: indicatorOfParameter of the first message
    (src / SFC).write_bytes(bytes(data))
    assert_fails(cli, src, tmp_path, 65, SFC, "not an ENS-10 variable")


@pytest.mark.parametrize(
    ("what", "keep", "needle"),
    [
        ("variable", lambda k: k["shortName"] != "2t", "t2m"),
        ("level", lambda k: not (k["level"] == 850 and k["dataDate"] == 20170702), "850 hPa"),
        ("member", lambda k: not (k["number"] == 3 and k["dataDate"] == 20160702), "member 3"),
        ("step", lambda k: k["endStep"] != 24, "step 24 h"),
    ],
)
def test_missing_fields_are_reported(cli, src, tmp_path, what, keep, needle):
    for name in (PL, SFC):
        grib.copy_messages(src / name, src / f"{name}.tmp", keep=keep)
        (src / f"{name}.tmp").replace(src / name)
    msg = assert_fails(cli, src, tmp_path, 66, "missing", needle)
    report = json.loads((tmp_path / "out.zarr.missing.json").read_text())
    assert all(needle in m for m in report["missing"]), what
    assert msg


def test_missing_file(cli, src, tmp_path):
    (src / SFC).unlink()
    assert_fails(cli, src, tmp_path, 66, "missing", SFC)


def test_wrong_grid(cli, src, tmp_path):
    other = SynthConfig(**{**SMALL.to_dict(), "resolution": 5.0, "years": SMALL.years, "levels": SMALL.levels})
    synthfiles.write_synthetic(other, tmp_path / "coarse", progress=False)
    shutil.copy(tmp_path / "coarse" / SFC, src / SFC)
    assert_fails(cli, src, tmp_path, 65, "different grids")


def test_nonexistent_source(cli, tmp_path):
    assert_fails(cli, tmp_path / "nope", tmp_path, 66, "no such file")


def _netcdf(tmp_path, mutate):
    cfg = SynthConfig(**{**SMALL.to_dict(), "format": "zarr", "years": SMALL.years, "levels": (850,)})
    ds = conventions.to_ens10(synthetic.forecast_dataset(cfg, variables=["t", "t2m"]).compute())
    ds = mutate(ds)
    path = tmp_path / "forecast.nc"
    ds.to_netcdf(path)
    return path


def test_nans_where_none_belong(cli, tmp_path):
    def poke(ds):
        v = ds["t"].values.copy()
        v[1, 4, 2, 0, 5, 5] = np.nan
        ds["t"] = (ds["t"].dims, v, ds["t"].attrs)
        return ds

    path = _netcdf(tmp_path, poke)
    assert_fails(cli, path, tmp_path, 65, "forecast.nc", "NaN", "'t'", extra=("--variables", "t,t2m"))


def test_unknown_units(cli, tmp_path):
    path = _netcdf(tmp_path, lambda ds: ds.assign(t=ds["t"].assign_attrs(units="furlongs")))
    assert_fails(cli, path, tmp_path, 65, "forecast.nc", "units 'furlongs'", extra=("--variables", "t,t2m"))


def test_mislabelled_units(cli, tmp_path):
    path = _netcdf(tmp_path, lambda ds: ds.assign(t2m=(ds["t2m"] - 273.15).assign_attrs(units="K")))
    assert_fails(cli, path, tmp_path, 65, "'t2m'", "outside the plausible", extra=("--variables", "t,t2m"))


def test_converted_units_are_accepted(cli, tmp_path):
    path = _netcdf(tmp_path, lambda ds: ds.assign(t2m=(ds["t2m"] - 273.15).assign_attrs(units="degC")))
    proc = cli("ingest", str(path), "--out", str(tmp_path / "ok.zarr"), "--variables", "t,t2m", "--threads")
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_bad_cli_usage(cli, tmp_path):
    proc = cli("ingest", str(tmp_path), "--out", str(tmp_path / "o.zarr"), "--levels", "123")
    assert proc.returncode == 2 and "not ENS-10 levels" in proc.stderr
    proc = cli("synth", "--out", str(tmp_path / "s"), "--resolution", "7")
    assert proc.returncode == 2 and "does not divide" in proc.stderr
    proc = cli("ingest")
    assert proc.returncode == 2 and "needs SOURCE and --out" in proc.stderr


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["forecast", "--checkpoint", "x.ckpt"], "the following arguments are required"),
        (["evaluate", "s.zarr", "--bootstrap", "many"], "invalid int value: 'many'"),
        (["serve", "out", "--no-such-option"], "unrecognized arguments: --no-such-option"),
        (["config", "validate"], "the following arguments are required"),
    ],
)
def test_a_usage_error_is_one_line_that_points_at_help(cli, argv, said):
    """argparse printed its whole usage block (7-9 lines) above the error; one line now: the problem and
    where the help is, exit 2."""
    proc = cli(*argv)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert said in line and line.startswith(f"postcast {argv[0]}") and line.endswith("--help)"), line


@pytest.mark.parametrize(
    "argv",
    [
        ["synth", "--resolution", "10"],
        ["evaluate", "store.zarr"],
        ["forecast", "--checkpoint", "c.ckpt", "--input", "in", "--init-time", "2017-01-01"],
        ["ingest", "src"],
    ],
)
def test_an_out_below_a_regular_file_is_an_output_error(cli, tmp_path, argv):
    """``--out FILE/sub`` (FILE a regular file) ended with exit 70 on a NotADirectoryError from the writer."""
    (tmp_path / "afile").write_text("not a folder")
    proc = cli(*argv, "--out", str(tmp_path / "afile" / "sub"))
    assert proc.returncode == 74, proc.stderr[-2000:]
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("postcast:")]
    assert f"{tmp_path / 'afile'} is a file, not a folder" in line


def test_a_reader_that_stops_reading_gets_no_traceback(store):
    """`postcast inspect STORE | head -1`: the pipe closes before postcast writes; no traceback, exit 0."""
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "postcast", "inspect", str(store)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # long before the interpreter has started: the write meets a closed pipe
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 0 and "Traceback" not in err, err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["ingest", "SRC", "--levels", "500,500"], "--levels lists 500 more than once"),
        (["ingest", "SRC", "--steps", "24,24"], "--steps lists 24 more than once"),
        (["ingest", "SRC", "--variables", ""], "--variables is empty"),
        (["ingest", "SRC", "--grid", "0"], "--grid 0.0: give a resolution between 0.1 and 90"),
        (["ingest", "SRC", "--grid", "inf"], "--grid inf: give a resolution"),
        (["ingest", "SRC", "--grid", "0.001"], "--grid 0.001: give a resolution between 0.1 and 90"),
        (
            ["forecast", "--checkpoint", "CKPT", "--input", "SRC", "--init-time", "2017-01-01", "--thresholds", "nan"],
            "--thresholds [nan]: give finite numbers",
        ),
        (
            [
                "forecast",
                "--checkpoint",
                "CKPT",
                "--input",
                "SRC",
                "--init-time",
                "2017-01-01",
                "--quantiles",
                "0.5,0.5",
            ],
            "--quantiles [0.5, 0.5]: give each value once",
        ),
        (["compress", "SRC", "--var", "truth_t850", "--sigma", "nan"], "sigma=nan: give a positive finite number"),
    ],
)
def test_values_are_checked_before_work_starts(synth_zarr, tmp_path, argv, says):
    """Duplicates gave stores with duplicate coordinates marked complete, NaN thresholds all-NaN
    exceedance (served as invalid JSON), a NaN sigma an all-NaN artefact, --grid 0.001 a 28 TiB
    allocation after 74 s: each is now refused at once, one line, exit 2, nothing written."""
    from postcast.cli import main

    ckpt = tmp_path / "any.ckpt"
    ckpt.write_bytes(b"refused before it is read")
    out = tmp_path / "out"
    argv = [str(synth_zarr) if a == "SRC" else str(ckpt) if a == "CKPT" else a for a in argv]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["--no-progress", *argv, "--out", str(out)])
    lines = [ln for ln in err.getvalue().splitlines() if ln.startswith("postcast: error:")]
    assert code == 2 and len(lines) == 1 and says in lines[0], err.getvalue()[-2000:]
    assert not out.exists()
