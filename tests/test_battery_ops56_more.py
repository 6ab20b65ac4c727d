"""Bad-input cases of issue 56 left after the first pass, in the shared battery (tests/battery.py): an
``evaluate`` of a store that lacks a target's pressure level, a full scratch folder (TMPDIR) during the local
EMOS's fit, and the noise a local-EMOS ``train fit`` printed. Each: the exit code, exactly one error line
naming what is wrong and the fix, no traceback, nothing left that a reader would take for a result."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr
from battery import Outcome, assert_ok, in_process

from postcast.datasets import integrity
from postcast.datasets.ingest.run import IngestConfig, ingest
from postcast.datasets.synth import synthfiles
from postcast.datasets.synth.synthetic import SynthConfig

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def store_850(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 10 deg store whose forecasts hold the 850 hPa level only (its truth holds z500 all the same)."""
    root = tmp_path_factory.mktemp("store_850")
    cfg = SynthConfig(seed=3, resolution=10.0, years=(2012, 2017), dates_per_year=3, levels=(850,))
    synthfiles.write_synthetic(cfg, root / "synth", progress=False)
    ingest(IngestConfig(source=str(root / "synth"), out=str(root / "s.zarr"), processes=False, progress=False))
    return root / "s.zarr"


def test_evaluate_picks_the_targets_the_store_holds(store_850, tmp_path, capsys):
    """Only level 850: evaluate picked z500 and ended with exit 70 (KeyError on ``level``); now the targets
    the store can score, t850 among them and z500 not."""
    out = tmp_path / "eval"
    res = in_process(["evaluate", str(store_850), "--out", str(out), "--bootstrap", "10", "--workers", "0"], capsys)
    assert res.code == 0, res.err[-3000:]
    scored = set(json.loads((out / "metrics.json").read_text())["targets"])
    assert "t850" in scored and "z500" not in scored, scored


@pytest.mark.battery
def test_evaluate_of_a_target_whose_level_the_store_lacks(store_850, tmp_path, capsys):
    """``--targets z500`` on a store with level 850 only: one line naming the level, the levels there and the fix."""
    out = tmp_path / "eval"
    argv = ["evaluate", str(store_850), "--targets", "z500", "--out", str(out), "--bootstrap", "10", "--workers", "0"]
    res = in_process(argv, capsys)
    assert_ok("evaluate: a target whose level the store lacks", res, not (out / "metrics.json").exists())
    line = res.error_lines[0]
    assert "500" in line and "850" in line and "--targets" in line, line


@pytest.mark.battery
def test_inspect_verify_reports_the_infinities_of_an_older_store(store_850, tmp_path, capsys):
    """A store written before ingest refused infinities (its truth holds +-Inf, its checksums recorded over them,
    as that ingest did): ``inspect --verify`` passed; now it fails (65) naming the array and the count."""
    old = tmp_path / "old.zarr"
    shutil.copytree(store_850, old)
    truth = zarr.open_array(old / "truth_t850", mode="r+")
    values = truth[0]  # the first date's
    values.reshape(-1)[[7, 11]] = np.inf, -np.inf
    truth[0] = values
    integrity.record(old)  # the checksums of what is there now, as the older ingest recorded them
    res = in_process(["inspect", str(old), "--verify"], capsys)
    assert_ok("inspect --verify: an older store holding infinities", res)
    line = res.error_lines[0]
    assert res.code == 65 and "truth_t850" in line and "2 infinite" in line, line


def _in_a_full_tmpdir(argv: list[str], tmp: Path, cwd: Path) -> Outcome:
    """``postcast ARGV`` in a mount namespace of its own whose TMPDIR ``tmp`` is a 16 KiB tmpfs (full at once)."""
    script = f'mount -t tmpfs -o size=16k tmpfs "{tmp}" && exec "$@"'
    cmd = ["unshare", "-m", "sh", "-c", script, "sh", sys.executable, "-m", "postcast", "--no-progress"]
    proc = subprocess.run(
        [*cmd, "--log-level", "ERROR", *argv],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        cwd=cwd,
        env={**os.environ, "PYTHONWARNINGS": "ignore", "TMPDIR": str(tmp)},
    )
    return Outcome(proc.returncode, proc.stderr, frozenset({74}))


@pytest.mark.battery
def test_a_full_tmpdir_during_the_emos_fit_names_the_scratch_folder(store_850, tmp_path):
    """The local EMOS's fit spills its bands to a scratch folder under TMPDIR; that filesystem full was "cannot
    write the output: No space left on device" (74), blaming an output that was never written. Now 74 naming
    the scratch folder and the fix (TMPDIR)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    probe = subprocess.run(["unshare", "-m", "sh", "-c", f'mount -t tmpfs tmpfs "{tmp}"'], check=False)
    if shutil.which("unshare") is None or probe.returncode != 0:
        pytest.skip("no mount namespace here (unshare -m and mount need CAP_SYS_ADMIN)")
    runs = tmp_path / "runs"
    argv = ["train", "fit", "-c", str(ROOT / "configs/train/emos_t2m.yaml"), "--data.cfg.store", str(store_850)]
    res = _in_a_full_tmpdir([*argv, "--trainer.default_root_dir", str(runs)], tmp, tmp_path)
    assert_ok("train fit: TMPDIR full during the EMOS fit", res, not list(runs.rglob("best*.ckpt")))
    line = res.error_lines[0]
    assert "TMPDIR" in line and str(tmp) in line and "the output" not in line, line


def test_a_local_emos_fit_prints_no_lightning_warning(store_850, tmp_path):
    """Every local-EMOS ``train fit`` printed Lightning's "The number of training batches (1) is smaller than the
    logging interval Trainer(log_every_n_steps=10)" (and "`training_step` returned `None`"): the fit at train
    start leaves the epochs nothing to optimise, so the interval is every step. Python's warnings left on."""
    argv = ["train", "fit", "-c", str(ROOT / "configs/train/emos_t2m.yaml"), "--data.cfg.store", str(store_850)]
    argv += ["--trainer.default_root_dir", str(tmp_path / "runs"), "--trainer.max_epochs", "2"]
    proc = subprocess.run(
        [sys.executable, "-m", "postcast", "--no-progress", "--log-level", "WARNING", *argv],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        env={k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "log_every_n_steps" not in proc.stderr and "returned `None`" not in proc.stderr, proc.stderr[-3000:]


def _degc_labelled_kelvin(path: Path, dates: int, bad: tuple[int, ...]) -> None:
    """A netCDF of ``dates`` daily 48 h t2m fields (5 members, 5 deg), the dates ``bad`` in degC labelled K."""
    import pandas as pd
    import xarray as xr

    lat, lon = np.linspace(-90, 90, 37), np.arange(72) * 5.0
    kelvin = 280.0 + 10.0 * np.cos(np.radians(lat))[:, None] * np.ones(lon.size)  # (lat, lon)
    data = np.repeat(np.stack([kelvin] * dates)[:, None], 5, axis=1)  # (time, number, lat, lon)
    data[list(bad)] -= 273.15
    xr.Dataset(
        {"t2m": (("time", "number", "latitude", "longitude"), data, {"units": "K"})},
        coords={
            "time": pd.date_range("2017-01-03", periods=dates, freq="1D"),
            "number": range(5),
            "latitude": lat,
            "longitude": lon,
            "step": np.timedelta64(48, "h"),
        },
    ).to_netcdf(path)


@pytest.mark.battery
def test_a_refused_ingest_on_thread_workers_prints_no_cancelled_error(tmp_path):
    """A date refused while other dates ran on a threaded cluster printed distributed's "Async instruction for
    <Task cancelled ...> ended with CancelledError" warnings (one per task cut short as the cluster closed)
    before the error line, at the default log level: now the error line alone."""
    _degc_labelled_kelvin(tmp_path / "bad.nc", 60, bad=(3, 30))
    out = tmp_path / "out.zarr"
    argv = ["ingest", str(tmp_path / "bad.nc"), "--out", str(out), "--threads"]
    proc = subprocess.run(
        [sys.executable, "-m", "postcast", "--no-progress", *argv],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    res = Outcome(proc.returncode, proc.stderr, frozenset({65}))
    assert_ok("ingest: a date refused on thread workers", res, not out.exists())
    noise = [ln for ln in proc.stderr.splitlines() if " INFO " not in ln and not ln.startswith("postcast: error:")]
    assert noise == [], proc.stderr[-3000:]
