"""Issue 38's exit codes and messages, in the shared battery (tests/battery.py): an unwritable ingest
output (under a regular file, its lock a folder) is an I/O error (74), not a bug (70); a forecast name
that cannot be a file name is a usage error (2); inspect names what a path is instead of suggesting
``ingest --out`` over it; an ambiguous variable name, a GRIB file named .nc and tp in mm labelled m each
get the fix. Each: the exit code, exactly one error line, no traceback, nothing left marked complete."""

from __future__ import annotations

import contextlib
import os
import shutil

import pytest
import xarray as xr
from battery import DISK_FULL, Outcome, assert_ok, in_process, subprocess_case

from postcast.datasets import contract


def _ingest(src, out, capsys, *extra: str) -> Outcome:
    return in_process(["ingest", str(src), "--out", str(out), "--threads", "--workers", "1", *extra], capsys)


# --- ingest --out that cannot be written: 74 ------------------------------------------------------------
@pytest.mark.battery
def test_ingest_out_under_a_regular_file(synth_zarr, tmp_path, capsys):
    (tmp_path / "file").write_text("not a folder\n")
    out = tmp_path / "file" / "s.zarr"
    res = _ingest(synth_zarr, out, capsys)
    assert_ok("ingest: --out under a regular file", Outcome(res.code, res.err, frozenset(DISK_FULL)))
    assert str(out) in res.error_lines[0] and "choose a writable folder" in res.error_lines[0]
    assert (tmp_path / "file").read_text() == "not a folder\n"


@pytest.mark.battery
def test_ingest_lock_is_a_folder(synth_zarr, tmp_path, capsys):
    out = tmp_path / "s.zarr"
    (tmp_path / "s.zarr.lock").mkdir()
    res = _ingest(synth_zarr, out, capsys)
    assert_ok("ingest: OUT.lock a folder", Outcome(res.code, res.err, frozenset(DISK_FULL)), not out.exists())
    assert "remove the folder" in res.error_lines[0] and (tmp_path / "s.zarr.lock").is_dir()


@pytest.mark.battery
@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_ingest_out_in_a_read_only_folder(synth_zarr, tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    res = _ingest(synth_zarr, ro / "s.zarr", capsys)
    assert_ok("ingest: --out in a read-only folder", Outcome(res.code, res.err, frozenset(DISK_FULL)))


@pytest.mark.battery
@pytest.mark.distributed  # a LocalCluster of processes; the tracebacks did not show here (a guard)
def test_ingest_with_worker_processes_onto_a_full_disk_is_one_line(synth_zarr, tmp_path):
    """A LocalCluster of worker processes (the default) and a file size limit: the one error line, and no
    asyncio "Task exception was never retrieved" or dask tracebacks after it."""
    out = tmp_path / "s.zarr"
    res = subprocess_case(["ingest", str(synth_zarr), "--out", str(out), "--workers", "1"], fsize=64 * 1024)
    assert_ok("ingest: worker processes, disk full (ulimit -f)", res, not contract.is_complete(out))
    assert "never retrieved" not in res.err and "distributed" not in res.err, res.err[-3000:]


# --- forecast --name ------------------------------------------------------------------------------------
@pytest.mark.battery
@pytest.mark.parametrize(("case", "name"), [("300 characters", "n" * 300), ("a backslash", "a\\b")])
def test_forecast_name_that_is_no_file_name(tmp_path, capsys, case, name):
    ckpt = tmp_path / "m.ckpt"
    ckpt.write_bytes(b"")
    out = tmp_path / "fc"
    argv = ["forecast", "--checkpoint", str(ckpt), "--input", str(tmp_path), "--out", str(out)]
    res = in_process([*argv, "--init-time", "2017-01-01", "--name", name], capsys)
    assert_ok(f"forecast: --name of {case}", res, not out.exists())
    assert res.code == 2 and "1-100 characters" in res.error_lines[0] and len(res.error_lines[0]) < 300


# --- inspect: what the path is, not `ingest --out` over it ----------------------------------------------
def _inspect(path, capsys) -> Outcome:
    return in_process(["inspect", str(path)], capsys)


@pytest.mark.battery
def test_inspect_missing_path(tmp_path, capsys):
    res = _inspect(tmp_path / "nope.zarr", capsys)
    assert_ok("inspect: a missing path", res)
    assert res.code == 66 and "no such file or directory" in res.error_lines[0] and "--out" not in res.error_lines[0]


@pytest.mark.battery
@pytest.mark.parametrize("case", ["fifo", "/dev/zero"])
def test_inspect_pipe_or_device(tmp_path, capsys, case):
    path = tmp_path / "fifo" if case == "fifo" else "/dev/zero"
    if case == "fifo":
        os.mkfifo(path)
    res = _inspect(path, capsys)
    assert_ok(f"inspect: a {case}", res)
    assert res.code == 65 and "neither a file nor a folder" in res.error_lines[0] and "--out" not in res.error_lines[0]


@pytest.mark.battery
def test_inspect_grib_folder_suggests_ingesting_it(synth_grib, capsys):
    res = _inspect(synth_grib, capsys)
    assert_ok("inspect: a folder of GRIB files", res)
    assert res.code == 65 and f"postcast ingest {synth_grib} --out STORE.zarr" in res.error_lines[0]


@pytest.mark.battery
def test_inspect_forecast_zarr(synth_zarr, capsys):
    res = _inspect(synth_zarr / "forecast.zarr", capsys)
    assert_ok("inspect: a raw forecast zarr", res)
    assert res.code == 65 and "not a postcast training store" in res.error_lines[0]
    assert f"--out {synth_zarr / 'forecast.zarr'}" not in res.error_lines[0]


@pytest.mark.battery
def test_inspect_compressed_artefact(tmp_path, capsys):
    art = tmp_path / "t850.pcnf"
    art.write_bytes(b"PCNF\x01\x00" + bytes(64))
    res = _inspect(art, capsys)
    assert_ok("inspect: a .pcnf artefact", res)
    assert res.code == 65 and "postcast decompress" in res.error_lines[0] and "--out " + str(art) not in res.err


@pytest.mark.battery
def test_inspect_grib_file_named_nc(synth_grib, tmp_path, capsys):
    grib = next(p for p in sorted(synth_grib.rglob("*")) if p.is_file() and p.read_bytes()[:4] == b"GRIB")
    named = tmp_path / "forecast.nc"
    shutil.copy(grib, named)
    res = _inspect(named, capsys)
    assert_ok("inspect: a GRIB file named .nc", res)
    assert res.code == 65 and "it is a GRIB file: rename it" in res.error_lines[0]


# --- ingest: names and units ------------------------------------------------------------------------------
@pytest.mark.battery
def test_ingest_ambiguous_variable_name(synth_zarr, tmp_path, capsys):
    out = tmp_path / "s.zarr"
    res = _ingest(synth_zarr, out, capsys, "--variables", "air_temperature")
    assert_ok("ingest: --variables air_temperature (t and t2m)", res, not out.exists())
    assert res.code == 2 and "ambiguous" in res.error_lines[0] and "t and t2m" in res.error_lines[0]


@pytest.mark.battery
def test_ingest_tp_in_mm_labelled_m_names_the_fix(synth_zarr, tmp_path, capsys):
    ds = xr.open_zarr(synth_zarr / "forecast.zarr", consolidated=False).load()
    ds["tp"] = (ds["tp"] * 1000.0).assign_attrs(units="m")
    src = tmp_path / "mm"
    src.mkdir()
    ds.to_zarr(src / "forecast.zarr", consolidated=False)
    out = tmp_path / "s.zarr"
    res = _ingest(src, out, capsys)
    assert_ok("ingest: tp in mm labelled m", res, not contract.is_complete(out))
    assert res.code == 65 and "set units 'mm'" in res.error_lines[0]


# --- forecast from a checkpoint with NaN weights: a WARNING on stderr, the flagged raw fallback -------------
def test_forecast_from_nan_weights_warns(t2m_ckpt, synth_zarr, tmp_path):
    """Decided: the product is written (the raw-ensemble fallback, flagged postcast_fallback=1, as for any
    model that cannot run) and the run exits 0, but a WARNING on stderr at the default log level names the
    non-finite output (it was one INFO line)."""
    import subprocess
    import sys

    import torch

    from postcast.models.module import content_checksum

    ckpt = torch.load(t2m_ckpt, map_location="cpu", weights_only=True)
    weights = ckpt["state_dict"]
    ckpt["state_dict"] = {
        k: torch.full_like(v, float("nan")) if v.is_floating_point() else v for k, v in weights.items()
    }
    ckpt["postcast"]["checksum"] = content_checksum(ckpt, ckpt["postcast"])  # a sound file of a broken model
    nan = tmp_path / "nan.ckpt"
    torch.save(ckpt, nan)
    out = tmp_path / "fc"
    argv = ["forecast", "--checkpoint", str(nan), "--input", str(synth_zarr), "--init-time", "2017-01-01"]
    proc = subprocess.run(
        [sys.executable, "-m", "postcast", "--no-progress", *argv, "--end", "2017-12-31", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    warned = [ln for ln in proc.stderr.splitlines() if " WARNING " in ln and "non-finite" in ln]
    assert warned and "fallback" in proc.stdout
    assert all(xr.open_dataset(p).attrs["postcast_fallback"] == 1 for p in out.rglob("*.nc"))


def test_ingest_says_nothing_of_dask_ports(synth_zarr, tmp_path):
    """With port 8787 taken (by another cluster's dashboard, or here), an ingest's LocalCluster printed
    distributed's "Port 8787 is already in use" warning (3 lines) on stderr."""
    import socket
    import subprocess
    import sys

    with socket.socket() as taken:
        with contextlib.suppress(OSError):  # (already taken by someone else: as good)
            taken.bind(("", 8787))
            taken.listen()
        argv = ["ingest", str(synth_zarr), "--out", str(tmp_path / "s.zarr"), "--threads", "--workers", "1"]
        proc = subprocess.run(
            [sys.executable, "-m", "postcast", "--no-progress", *argv], capture_output=True, text=True, timeout=300
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "8787" not in proc.stderr and "Warning" not in proc.stderr, proc.stderr[-3000:]
