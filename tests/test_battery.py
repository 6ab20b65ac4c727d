"""Every CLI verb on bad input: exit code in {2, 65, 66} (74 for a full disk), exactly one ``postcast: error:`` (or
``INVALID``) line on stderr, no traceback, and nothing marked complete.

Most cases run in-process through :func:`postcast.cli.main` (the one place errors become exit codes);
the full-disk cases run as real processes under ``ulimit -f`` (RLIMIT_FSIZE). The tally of the run (cases,
clean, data safe) is printed at its end (tests/battery.py); ``pytest -m battery`` runs every file's cases.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import web
from battery import TALLY, Outcome, assert_ok, in_process, subprocess_case

from postcast.datasets import contract, integrity, io
from postcast.datasets.sources import messages as grib
from postcast.datasets.synth import synthfiles
from postcast.datasets.synth.synthetic import SynthConfig

ROOT = Path(__file__).resolve().parents[1]
SMALL = SynthConfig(seed=5, resolution=10.0, years=(2016, 2017), dates_per_year=1, levels=(500, 850), format="grib")
PL, SFC = grib.file_name("pl", 7, 2), grib.file_name("sfc", 7, 2)


# --- inputs -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def grib_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("battery") / "grib"
    synthfiles.write_synthetic(SMALL, out, progress=False)
    return out


@pytest.fixture
def src(grib_src: Path, tmp_path: Path) -> Path:
    d = tmp_path / "src"
    shutil.copytree(grib_src, d)
    return d


def no_store(out: Path) -> bool:
    return not contract.is_complete(out)


# --- ingest -----------------------------------------------------------------------------------------
@pytest.mark.battery
def test_ingest_unreadable_file(src, tmp_path, capsys):
    (src / SFC).unlink()
    (src / SFC).symlink_to(src / "gone.grib")  # listed, but cannot be opened (root reads any mode bits)
    out = tmp_path / "out.zarr"
    assert_ok(
        "ingest: unreadable input file",
        in_process(["ingest", str(src), "--out", str(out), "--threads"], capsys),
        no_store(out),
    )


@pytest.mark.battery
def test_ingest_flipped_grib_magic_is_corrupt_not_missing(src, tmp_path, capsys):
    data = bytearray((src / SFC).read_bytes())
    data[0] ^= 0x01  # "GRIB" -> "FRIB"
    (src / SFC).write_bytes(bytes(data))
    out = tmp_path / "out.zarr"
    res = in_process(["ingest", str(src), "--out", str(out), "--threads"], capsys)
    res.codes = frozenset({65})  # corrupt, not missing (66 would tell a scheduler to retry)
    assert_ok("ingest: flipped GRIB magic", res, no_store(out))


@pytest.mark.battery
def test_ingest_missing_source(tmp_path, capsys):
    out = tmp_path / "out.zarr"
    assert_ok(
        "ingest: missing source",
        in_process(["ingest", str(tmp_path / "nope"), "--out", str(out)], capsys),
        no_store(out),
    )


@pytest.mark.battery
def test_ingest_disk_full(grib_src, tmp_path):
    out = tmp_path / "out.zarr"
    res = subprocess_case(["ingest", str(grib_src), "--out", str(out), "--threads"], fsize=64 * 1024)
    assert_ok("ingest: disk full (ulimit -f)", res, no_store(out) and not out.exists())


@pytest.mark.battery
def test_ingest_bad_data_found_on_a_worker_process(tmp_path):
    """The default cluster runs the date tasks in worker processes: a date refused there used to add
    distributed's multi-line 'Compute Failed ... Traceback:' log to the one error line."""
    import numpy as np
    import pandas as pd
    import xarray as xr

    lat, lon = np.linspace(-90, 90, 19), np.arange(36) * 10.0
    celsius = 15.0 + 10.0 * np.cos(np.radians(lat))[:, None] * np.ones(lon.size)  # degC labelled K
    xr.Dataset(
        {"t2m": (("time", "number", "latitude", "longitude"), celsius[None, None], {"units": "K"})},
        coords={
            "time": [pd.Timestamp("2017-07-03")],
            "number": [0],
            "latitude": lat,
            "longitude": lon,
            "step": np.timedelta64(0, "h"),
        },
    ).to_netcdf(tmp_path / "degc.nc")
    out = tmp_path / "out.zarr"
    res = subprocess_case(["ingest", str(tmp_path / "degc.nc"), "--out", str(out), "--workers", "1"])
    res.codes = frozenset({65})
    assert_ok("ingest: bad data found on a worker process", res, no_store(out))


# --- inspect ----------------------------------------------------------------------------------------
@pytest.mark.battery
def test_inspect_missing_and_incomplete(store, tmp_path, capsys):
    assert_ok("inspect: missing store", in_process(["inspect", str(tmp_path / "nope.zarr")], capsys))
    copy = tmp_path / "s.zarr"
    shutil.copytree(store, copy)
    io.update_zarr_attrs(copy, {contract.COMPLETE_ATTR: False})
    assert_ok(
        "train fit: incomplete store",
        in_process(
            [
                "train",
                "fit",
                "-c",
                str(ROOT / "configs/train/tiny_emos_t2m.yaml"),
                "--data.cfg.store",
                str(copy),
                "--trainer.default_root_dir",
                str(tmp_path / "runs"),
            ],
            capsys,
        ),
    )
    chunk = next(p for p in (copy / "ens_mean_t2m" / "c").rglob("*") if p.is_file())
    chunk.unlink()
    io.update_zarr_attrs(copy, {contract.COMPLETE_ATTR: True})
    res = in_process(["inspect", str(copy), "--verify"], capsys)
    assert_ok("inspect --verify: deleted chunk", res, not integrity.verify(copy).ok)


# --- config / train -------------------------------------------------------------------------------
@pytest.mark.battery
def test_config_validate_unknown_target(tmp_path, capsys):
    preset = tmp_path / "t999.yaml"
    preset.write_text("model: {family: emos}\ndata: {cfg: {sample: {target: t999}}}\n")
    res = in_process(["config", "validate", str(preset)], capsys)
    assert_ok("config validate: target t999", res)
    assert "t999" in res.error_lines[0]


@pytest.mark.battery
def test_train_bad_target_and_missing_store(store, tmp_path, capsys):
    preset = str(ROOT / "configs/train/tiny_emos_t2m.yaml")
    assert_ok(
        "train fit: target t999",
        in_process(
            [
                "train",
                "fit",
                "-c",
                preset,
                "--data.cfg.store",
                str(store),
                "--data.cfg.sample.target",
                "t999",
                "--trainer.default_root_dir",
                str(tmp_path / "runs"),
            ],
            capsys,
        ),
    )
    assert_ok(
        "train fit: missing store",
        in_process(
            [
                "train",
                "fit",
                "-c",
                preset,
                "--data.cfg.store",
                str(tmp_path / "nope.zarr"),
                "--trainer.default_root_dir",
                str(tmp_path / "runs"),
            ],
            capsys,
        ),
    )


# --- evaluate / forecast: checkpoints ---------------------------------------------------------------
def _flipped(ckpt: Path, tmp_path: Path) -> Path:
    import torch

    data = bytearray(ckpt.read_bytes())
    coef = torch.load(ckpt, weights_only=True)["state_dict"]["net.coef"].numpy().tobytes()
    data[bytes(data).find(coef[:16]) + 1] ^= 0x04
    out = tmp_path / "flipped.ckpt"
    out.write_bytes(bytes(data))
    return out


@pytest.mark.battery
def test_evaluate_bad_checkpoints(store, t2m_ckpt, tmp_path, capsys):
    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(b"not a checkpoint at all")
    for case, ckpt, extra in (
        ("evaluate: checkpoint of another target", t2m_ckpt, ["--targets", "t850"]),
        ("evaluate: garbage checkpoint", garbage, []),
        ("evaluate: bit-flipped checkpoint", _flipped(t2m_ckpt, tmp_path), []),
    ):
        out = tmp_path / case.split(": ")[1].replace(" ", "_")
        res = in_process(
            ["evaluate", str(store), "--checkpoints", str(ckpt), "--bootstrap", "5", "--out", str(out), *extra], capsys
        )
        assert_ok(case, res, not (out / "metrics.json").exists())


@pytest.mark.battery
def test_forecast_bad_inputs(t2m_ckpt, synth_zarr, tmp_path, capsys):
    out = tmp_path / "fc"
    base = ["forecast", "--checkpoint", str(t2m_ckpt), "--init-time", "2017-02-01", "--out", str(out)]
    dangling = tmp_path / "dangling.zarr"
    dangling.symlink_to(tmp_path / "gone")
    assert_ok("forecast: unreadable input", in_process([*base, "--input", str(dangling)], capsys))
    assert_ok("forecast: bad init time", in_process([*base, "--input", str(synth_zarr), "--init-time", "soon"], capsys))
    assert_ok(
        "forecast: bit-flipped checkpoint",
        in_process(
            [
                "forecast",
                "--checkpoint",
                str(_flipped(t2m_ckpt, tmp_path)),
                "--input",
                str(synth_zarr),
                "--init-time",
                "2017-02-01",
                "--out",
                str(out),
            ],
            capsys,
        ),
    )
    assert not list(out.rglob("*.nc"))


@pytest.mark.battery
def test_forecast_disk_full_leaves_nothing_and_stale_temporaries_go(t2m_ckpt, synth_zarr, tmp_path):
    """Disk full while writing: one line, no product; a killed writer's .tmp-PID is removed by the next run."""
    out = tmp_path / "fc"
    argv = [
        "forecast",
        "--checkpoint",
        str(t2m_ckpt),
        "--input",
        str(synth_zarr),
        "--init-time",
        "2017-02-01",
        "--end",
        "2017-10-31",
        "--out",
        str(out),
    ]
    res = subprocess_case(argv, fsize=4096)
    assert_ok("forecast: disk full (ulimit -f)", res, not [p for p in out.rglob("*.nc") if not p.name.startswith(".")])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid that no longer runs
    product = next(iter(sorted(out.rglob("*.tmp-*")) or [None]), None)
    folder = product.parent if product is not None else out / "postprocessed" / "emos" / "t2m"
    folder.mkdir(parents=True, exist_ok=True)
    stale = folder / f".t2m_2017020100.nc.tmp-{dead.pid}"
    stale.write_bytes(b"half a file")
    assert subprocess_case(argv).code == 0
    assert not stale.exists() and not list(out.rglob("*.tmp-*"))


def test_stale_temporaries_of_dead_processes_are_removed(tmp_path):
    """The next atomic write of a file removes what killed writers left beside it, not a live one's."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        stale = tmp_path / f".t850_2017010100.nc.tmp-{dead.pid}"
        old_dir = tmp_path / f".t850_2017010100.nc.old-{dead.pid}"
        busy = tmp_path / f".t850_2017010100.nc.tmp-{alive.pid}"
        other = tmp_path / f".t2m_2017010100.nc.tmp-{dead.pid}"  # another file's (a rerun may skip that file)
        for p in (stale, busy, other):
            p.write_bytes(b"half")
        old_dir.mkdir()
        io.write_text(tmp_path / "t850_2017010100.nc", "done")
        assert not stale.exists() and not old_dir.exists() and not other.exists()
        assert busy.exists() and (tmp_path / "t850_2017010100.nc").read_text() == "done"
    finally:
        alive.kill()
        alive.wait()


# --- compression ------------------------------------------------------------------------------------
@pytest.mark.battery
@pytest.mark.parametrize("resolution", ["0", "nan", "0.001", "-1"])
def test_decompress_absurd_resolution(artefact, tmp_path, capsys, resolution):
    out = tmp_path / "d.nc"
    res = in_process(["decompress", str(artefact), "--out", str(out), "--resolution", resolution], capsys)
    assert_ok(f"decompress --resolution {resolution}", res, not out.exists())
    assert res.code == 2


@pytest.mark.battery
def test_decompress_damaged_artefacts(artefact, tmp_path, capsys):
    data = bytearray(artefact.read_bytes())
    data[8] ^= 0x02  # the header-length field (outside the body's crc32)
    flipped = tmp_path / "flipped.pcnf"
    flipped.write_bytes(bytes(data))
    truncated = tmp_path / "truncated.pcnf"
    truncated.write_bytes(artefact.read_bytes()[:100])
    for case, path in (("decompress: flipped header length", flipped), ("decompress: truncated", truncated)):
        out = tmp_path / f"{path.stem}.nc"
        res = in_process(["decompress", str(path), "--out", str(out)], capsys)
        assert_ok(case, res, not out.exists())
        assert res.code == 65
    assert_ok("compress-report: truncated artefact", in_process(["compress-report", str(truncated)], capsys))


@pytest.mark.battery
def test_compress_bad_options(store, tmp_path, capsys):
    out = tmp_path / "x.pcnf"
    assert_ok(
        "compress: width 0",
        in_process(["compress", str(store), "--var", "truth_t850", "--width", "0", "--out", str(out)], capsys),
        not out.exists(),
    )
    assert_ok(
        "compress: missing source",
        in_process(["compress", str(tmp_path / "nope.zarr"), "--var", "truth_t850", "--out", str(out)], capsys),
        not out.exists(),
    )


# --- synth / run / serve ----------------------------------------------------------------------------
@pytest.mark.battery
def test_synth_and_run_bad_options(tmp_path, capsys):
    assert_ok(
        "synth: resolution nan",
        in_process(["synth", "--out", str(tmp_path / "s"), "--resolution", "nan"], capsys),
        not (tmp_path / "s").exists(),
    )
    assert_ok(
        "synth: 0 dates per year",
        in_process(["synth", "--out", str(tmp_path / "s"), "--dates-per-year", "0"], capsys),
        not (tmp_path / "s").exists(),
    )
    assert_ok("run: missing config", in_process(["run", str(tmp_path / "nope.yaml")], capsys))
    garbage = tmp_path / "garbage.yaml"
    garbage.write_bytes(b"\xff\xfe{{{ not yaml")
    assert_ok("run: unreadable config", in_process(["run", str(garbage)], capsys))


def _answers(port: int) -> bool:
    """Whether a server on the loopback ``port`` answers ``/health`` (any status)."""
    import httpx

    try:
        web.get(f"http://127.0.0.1:{port}/health", timeout=1.0)
    except httpx.HTTPError:
        return False
    return True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.battery
def test_serve_bad_folders(tmp_path, capsys):
    assert_ok("serve: missing folder", in_process(["serve", str(tmp_path / "nope")], capsys))
    folder = tmp_path / "fc" / "postprocessed" / "emos" / "t850"
    folder.mkdir(parents=True)
    (folder / "not-a-date.nc").write_bytes(b"junk")
    port = _free_port()
    cmd = [sys.executable, "-m", "postcast", "serve", str(tmp_path / "fc"), "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300  # either it refuses the folder with one line, or it serves (skipping the file)
    while proc.poll() is None and not _answers(port) and time.monotonic() < deadline:
        time.sleep(0.2)
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        TALLY["serve: badly named file"] = ("Traceback" not in err, True)
        assert "Traceback" not in err, err[-3000:]
        return
    assert_ok("serve: badly named file", Outcome(proc.returncode, proc.stderr.read() if proc.stderr else ""))
