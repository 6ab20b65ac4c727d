"""Every verb reads a store at any lead (issue 30): a +78 h store goes through inspect, train fit (at
``--data.cfg.sample.step_h 78``), evaluate and forecast; a model whose lead the data lacks is refused in one
line naming the lead the data holds and the fix, never an internal error. Forecast from operational GRIB files:
the 25-parameter control forecast (the model's inputs taken, the rest skipped) and tp accumulated from step 0."""

from __future__ import annotations

from pathlib import Path

import eccodes
import numpy as np
import pandas as pd
import pytest
import xarray as xr
from battery import assert_ok, in_process
from test_operational_files import GRID, _truth_t2m, write_control_25, write_lead_78, write_tp_accumulated

from postcast.datasets import schema, sources
from postcast.datasets.sources import messages as grib

ROOT = Path(__file__).resolve().parents[1]
PRESET = str(ROOT / "configs/train/tiny_emos_t2m.yaml")  # target t2m, every surface variable by default
# train (2012), val (2014) and test (2016) dates: the split years of schema.Splits
DATES = (20120301, 20120302, 20120305, 20120306, 20140301, 20160301, 20160302)
INPUTS_78 = "[t2m,msl]"  # the +78 h file holds 2t and msl only (the preset's default reads all 11 surface fields)
INPUTS_48 = "[t2m,tp]"  # the 48 h checkpoint reads tp, which the operational files hold accumulated from step 0


def _valid(dates: tuple[int, ...], step_h: int) -> list[str]:
    return [(pd.Timestamp(str(d)) + pd.Timedelta(hours=step_h)).isoformat() for d in dates]


def _error(proc) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("postcast: error:")]
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


def _train(cli, store: Path, root: Path, *extra: str):
    return cli(
        "train",
        "fit",
        "-c",
        PRESET,
        "--data.cfg.store",
        str(store),
        "--trainer.default_root_dir",
        str(root),
        "--trainer.max_epochs",
        "1",
        "--data.cfg.batch_size",
        "2",
        *extra,
    )


def _checkpoint(root: Path) -> Path:
    return sorted(root.rglob("*.ckpt"))[-1]


def _restep(src: Path, dst: Path, step_h: int) -> Path:
    """A copy of a GRIB file with every message at ``step_h`` (eccodes)."""
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        while (h := eccodes.codes_grib_new_from_file(fin)) is not None:
            eccodes.codes_set(h, "step", step_h)
            eccodes.codes_write(h, fout)
            eccodes.codes_release(h)
    return dst


def _ingest_with_truth(cli, grib: Path, out: Path, step_h: int) -> Path:
    truth = _truth_t2m(out.with_suffix(".truth.nc"), _valid(DATES, step_h))
    proc = cli("ingest", str(grib), "--out", str(out), "--truth", str(truth), "--threads")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def files(cli, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The +78 h GRIB file (control + 50 members of 2t and msl) and its store with truth on every date; the
    same file at +48 h and its store."""
    d = tmp_path_factory.mktemp("lead78")
    grib78 = write_lead_78(d / "ens78.grib", dates=DATES)
    grib48 = _restep(grib78, d / "ens48.grib", 48)
    return {
        "grib78": grib78,
        "store78": _ingest_with_truth(cli, grib78, d / "s78.zarr", 78),
        "grib48": grib48,
        "store48": _ingest_with_truth(cli, grib48, d / "s48.zarr", 48),
    }


@pytest.fixture(scope="module")
def ckpt78(cli, files, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``train fit`` of the tiny preset at +78 h on the +78 h store (inputs the file has)."""
    root = tmp_path_factory.mktemp("runs78")
    proc = _train(
        cli, files["store78"], root, "--data.cfg.sample.step_h", "78", "--data.cfg.sample.variables", INPUTS_78
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return _checkpoint(root)


@pytest.fixture(scope="module")
def ckpt48(cli, store, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A t2m checkpoint at the preset's +48 h (inputs t2m and tp) on the synthetic ENS-10 store."""
    root = tmp_path_factory.mktemp("runs48")
    proc = _train(cli, store, root, "--data.cfg.sample.variables", INPUTS_48)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return _checkpoint(root)


# --- 1: a model's lead the data lacks ---------------------------------------------------------------
@pytest.mark.battery
def test_train_at_a_lead_the_store_lacks_is_refused_naming_its_lead(files, tmp_path, capsys):
    """Was internal error (70) ``KeyError: Timedelta('2 days')`` from SampleSpec.select (normalisation)."""
    res = in_process(
        [
            "train",
            "fit",
            "-c",
            PRESET,
            "--data.cfg.store",
            str(files["store78"]),
            "--data.cfg.sample.variables",
            INPUTS_78,
            "--trainer.default_root_dir",
            str(tmp_path / "runs"),
            "--trainer.max_epochs",
            "1",
        ],
        capsys,
    )
    assert_ok("train fit: preset lead not in the store", res, not list(tmp_path.rglob("*.ckpt")))
    line = res.error_lines[0]
    assert res.code == 2 and "+48 h" in line and "+78 h" in line and "--data.cfg.sample.step_h 78" in line, line


@pytest.mark.battery
def test_evaluate_a_checkpoint_at_a_lead_the_store_lacks(files, ckpt78, tmp_path, capsys):
    """Was internal error (70) ``KeyError: "not all values found in index 'step'"`` from store.split_rows."""
    out = tmp_path / "eval"
    res = in_process(
        ["evaluate", str(files["store48"]), "--checkpoints", str(ckpt78), "--bootstrap", "5", "--out", str(out)], capsys
    )
    assert_ok("evaluate: checkpoint lead not in the store", res, not (out / "metrics.json").exists())
    line = res.error_lines[0]
    assert res.code == 2 and "+78 h" in line and "holds +48 h" in line, line


@pytest.mark.battery
def test_compress_at_a_lead_the_store_lacks(files, tmp_path, capsys):
    """Was internal error (70) ``KeyError: "not all values found in index 'step'"`` from compression/report.py."""
    out = tmp_path / "t48.pcnf"
    res = in_process(
        [
            "compress",
            str(files["store78"]),
            "--var",
            "truth_t2m",
            "--step-hours",
            "48",
            "--steps",
            "5",
            "--out",
            str(out),
        ],
        capsys,
    )
    assert_ok("compress: --step-hours not in the store", res, not out.exists())
    line = res.error_lines[0]
    assert res.code == 2 and "holds +78 h" in line and "--step-hours 78" in line, line


@pytest.mark.battery
def test_forecast_a_checkpoint_at_a_lead_the_file_lacks(files, ckpt78, tmp_path, capsys):
    """Refused (66) but advising ingest's option: "1 items missing: step 78 h (the source has 48 h: pass
    --steps 48 or omit it)"; forecast has no --steps, the fix is a checkpoint trained at the input's lead."""
    out = tmp_path / "fc"
    res = in_process(
        [
            "forecast",
            "--checkpoint",
            str(ckpt78),
            "--input",
            str(files["grib48"]),
            "--init-time",
            "2016-03-01",
            "--out",
            str(out),
        ],
        capsys,
    )
    assert_ok("forecast: checkpoint lead not in the input", res, not list(out.rglob("*.nc")))
    line = res.error_lines[0]
    assert "+78 h" in line and "48 h" in line and "--steps" not in line and "step_h 48" in line, line


# --- 2: a +78 h store through every verb ------------------------------------------------------------
def test_lead_78_through_inspect_train_evaluate_forecast(cli, files, ckpt78, tmp_path):
    """inspect, train fit at --data.cfg.sample.step_h 78 (the ckpt78 fixture), evaluate, forecast from the
    raw GRIB file: each exit 0; the products are valid at init + 78 h."""
    store = files["store78"]
    shown = cli("inspect", str(store))
    assert shown.returncode == 0 and "shown at 78 h" in shown.stdout, shown.stderr[-3000:]
    out = tmp_path / "eval"
    proc = cli("evaluate", str(store), "--checkpoints", str(ckpt78), "--bootstrap", "5", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert xr.open_dataset(next(out.rglob("results*.nc")))["lead"].values.tolist() == [78]
    fc = tmp_path / "fc"
    proc = cli(
        "forecast",
        "--checkpoint",
        str(ckpt78),
        "--input",
        str(files["grib78"]),
        "--init-time",
        "2016-03-01",
        "--end",
        "2016-03-02",
        "--out",
        str(fc),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    files_nc = sorted((fc / "postprocessed/emos/t2m").glob("*.nc"))
    assert len(files_nc) == 2, proc.stdout
    ds = xr.open_mfdataset(files_nc)
    assert ds.attrs["product"] == "postprocessed"
    assert ((ds["time"] - ds["forecast_reference_time"]).values == np.timedelta64(78, "h")).all()
    assert ds.sizes["latitude"] == GRID.n_lat and ds.sizes["longitude"] == GRID.n_lon


# --- 3, 4: forecast from operational files ----------------------------------------------------------
def test_forecast_from_the_25_parameter_control_file(cli, ckpt48, tmp_path):
    """The checkpoint reads t2m and tp; the GRIB2 control forecast holds 25 parameters (tp accumulated
    from step 0): the two are taken, the rest skipped."""
    grib = write_control_25(tmp_path / "control25.grib2", steps=(0, 24, 48))
    out = tmp_path / "fc"
    proc = cli(
        "--log-level",
        "INFO",
        "forecast",
        "--checkpoint",
        str(ckpt48),
        "--input",
        str(grib),
        "--init-time",
        "2024-01-15",
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = sorted((out / "postprocessed/emos/t2m").glob("*.nc"))
    assert len(files) == 1, (proc.stdout, proc.stderr[-3000:])
    ds = xr.open_dataset(files[0])
    assert ds.attrs["postcast_fallback"] == 0 and np.isfinite(ds["t2m_mean"].values).all()
    assert ((ds["time"] - ds["forecast_reference_time"]).values == np.timedelta64(48, "h")).all()


def test_forecast_from_tp_accumulated_across_steps(cli, ckpt48, tmp_path):
    """tp accumulated from step 0 (ENS-10's convention) is read at the model's lead as the 0-48 h total, on
    the checkpoint's 10 deg grid (whose points are points of the file's 5 deg grid), and post-processed."""
    path = write_tp_accumulated(tmp_path / "tp.grib2", steps=(0, 12, 24, 36, 48))
    out = tmp_path / "fc"
    proc = cli(
        "forecast", "--checkpoint", str(ckpt48), "--input", str(path), "--init-time", "2012-03-01", "--out", str(out)
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    files_nc = sorted((out / "postprocessed/emos/t2m").glob("*.nc"))
    assert len(files_nc) == 1, (proc.stdout, proc.stderr[-3000:])
    ds = xr.open_dataset(files_nc[0])
    assert ds.attrs["postcast_fallback"] == 0 and np.isfinite(ds["t2m_mean"].values).all()
    source = sources.discover(str(path)).forecast  # what forecast reads: its Expectation at the model's lead
    plan = source.plan(sources.Expectation(variables=("t2m", "tp"), steps_h=(48,), exact_grid=schema.Grid(10.0)))
    tp = source.load(pd.Timestamp("2012-03-01"), plan)["tp"].values[0, :, 0]  # (member, lat, lon)
    index = grib.index_file(path)
    rows = index[(index["var"] == "tp") & (index.step_h == 48)].sort_values("member")
    assert set(rows.start_step) == {0}
    totals = grib.decode(path, list(zip(rows.offset, rows.length, strict=True)), GRID.shape)  # latitude ascending
    np.testing.assert_allclose(tp, totals[:, ::2, ::2], rtol=1e-5)
