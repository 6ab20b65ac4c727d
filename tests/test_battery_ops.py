"""Bad-input cases of issue 29 in the shared battery (tests/battery.py): download addresses, ingest's
worker count and concurrent runs into one store, decompress on a full disk, compress's member index and
the pipeline's compress stage, forecast from a damaged store. Each: the exit code, exactly one error
line, no traceback, and nothing left that a reader would take for a result."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import xarray as xr
import yaml
from battery import assert_ok, in_process, subprocess_case

from postcast.cli import main
from postcast.datasets import contract

ROOT = Path(__file__).resolve().parents[1]


# --- download ---------------------------------------------------------------------------------------
@pytest.mark.battery
@pytest.mark.parametrize("url", ["../../", "ftp://example.org/ens10/", "http://"])
def test_download_base_url_not_an_address(tmp_path, capsys, url):
    out = tmp_path / "d"
    res = in_process(["download", "ens10", "--start", "2018-01-01", "--base-url", url, "--out", str(out)], capsys)
    assert_ok(f"download: --base-url {url}", res, not out.exists())
    assert res.code == 2 and "--base-url" in res.error_lines[0]


# --- ingest -----------------------------------------------------------------------------------------
@pytest.mark.battery
def test_ingest_more_workers_than_the_machine_holds(synth_zarr, tmp_path, capsys):
    """--workers 1000 started for minutes (and exhausted the memory); refused before anything starts,
    naming the bound (2 per core): no partial store, so no date was started."""
    out = tmp_path / "s.zarr"
    res = in_process(["ingest", str(synth_zarr), "--out", str(out), "--workers", "1000"], capsys)
    assert_ok("ingest: --workers 1000", res, not out.exists() and not contract.partial_path(out).exists())
    bound = 2 * len(os.sched_getaffinity(0))
    assert res.code == 2 and f"1..{bound}" in res.error_lines[0]


@pytest.mark.battery
def test_a_second_ingest_into_one_store_is_refused_and_a_dead_ones_lock_taken_over(synth_zarr, tmp_path, capsys):
    """Process A ingests and is stopped (SIGSTOP) half way, holding the store; process B, the same
    command, is refused with one line naming A; A is then killed, and the next run takes its stale lock
    over and completes the store."""
    out = tmp_path / "s.zarr"
    argv = ["ingest", str(synth_zarr), "--out", str(out), "--threads", "--workers", "1"]
    a = subprocess.Popen([sys.executable, "-m", "postcast", "--no-progress", *argv], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 600  # against a hang only
        while not (contract.partial_path(out) / "plan.json").exists() and a.poll() is None:
            assert time.monotonic() < deadline, "process A did not start its ingest"
            time.sleep(0.05)
        os.kill(a.pid, signal.SIGSTOP)  # A holds the store and stays half way
        res = subprocess_case(argv)
        assert_ok("ingest: a second ingest into the same --out", res, not contract.is_complete(out))
        assert res.code == 2 and f"pid {a.pid}" in res.error_lines[0] and "another ingest" in res.error_lines[0]
    finally:
        a.kill()
        a.wait()
    assert main(["--no-progress", *argv]) == 0  # A's lock is stale: taken over
    assert contract.is_complete(out) and not Path(f"{out}.lock").exists()


# --- decompress / compress -----------------------------------------------------------------------------
@pytest.mark.battery
def test_decompress_to_zarr_on_a_full_disk_leaves_nothing_openable(artefact, tmp_path):
    out = tmp_path / "d.zarr"
    res = subprocess_case(["decompress", str(artefact), "--out", str(out)], fsize=16 * 1024)
    assert_ok("decompress: disk full, zarr output (ulimit -f)", res, not out.exists())
    with pytest.raises(FileNotFoundError):
        xr.open_zarr(out)
    assert not list(tmp_path.iterdir())  # nor a temporary beside it


@pytest.mark.battery
def test_decompress_on_a_full_disk_prints_one_line_not_the_pending_writes(artefact, tmp_path, monkeypatch):
    """zarr-python's own pipeline (POSTCAST_ZARRS=0) writes chunks concurrently on its event loop; on a
    full disk the writes still pending were destroyed at exit, each printing a traceback ('Task was
    destroyed but it is pending!', 'Exception ignored in ...') after the one error line."""
    monkeypatch.setenv("POSTCAST_ZARRS", "0")
    out = tmp_path / "d.zarr"
    res = subprocess_case(["decompress", str(artefact), "--out", str(out), "--resolution", "0.5"], fsize=8 * 1024)
    assert_ok("decompress: disk full, many zarr chunks (ulimit -f)", res, not out.exists())
    assert res.err.strip().splitlines() == res.error_lines, res.err[-2000:]


@pytest.mark.battery
@pytest.mark.parametrize("member", ["99", "10", "-1", "abc"])
def test_compress_member_out_of_range(store, tmp_path, capsys, member):
    out = tmp_path / "m.pcnf"
    res = in_process(
        [
            "compress",
            str(store),
            "--var",
            "t",
            "--level",
            "850",
            "--member",
            member,
            "--steps",
            "2",
            "--width",
            "8",
            "--depth",
            "1",
            "--out",
            str(out),
        ],
        capsys,
    )
    assert_ok(f"compress: --member {member}", res, not out.exists())
    assert res.code == 2 and "0..9" in res.error_lines[0]


@pytest.mark.battery
def test_pipeline_compress_stage_of_a_preset_reading_sst(tmp_path, capsys, monkeypatch):
    """The compress stage with a T2m preset (it reads SST, NaN over land): refused before any stage runs."""
    monkeypatch.chdir(tmp_path)
    cfg = {
        "kind": "pipeline",
        "workdir": str(tmp_path / "work"),
        "workers": 1,
        "processes": False,
        "synth": {"seed": 3, "resolution": 10.0, "years": [2012, 2017], "dates_per_year": 3, "levels": [500, 850]},
        "evaluate": False,
        "compress": [{"preset": str(ROOT / "configs/train/emos_t2m.yaml"), "field": {"width": 8, "steps": 20}}],
    }
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(cfg))
    res = in_process(["run", str(path)], capsys)
    assert_ok("run: compress stage of a preset reading sst", res, not (tmp_path / "work" / "compressed").exists())
    assert res.code == 2 and "sst" in res.error_lines[0] and "emos_t850" in res.error_lines[0]
    assert not (tmp_path / "work" / "synth").exists()  # no stage ran


@pytest.mark.battery
def test_pipeline_compress_stage_of_a_derived_target(tmp_path, capsys, monkeypatch):
    """The compress stage with a tp24 preset: the artefact holds ensemble statistics, not the tp members tp24 is
    derived from, so compressed training cannot use it (its sampler asks for the members: KeyError 'tp', exit 70).
    Before: every stage ran and wrote that artefact (exit 0); now refused before any stage runs."""
    monkeypatch.chdir(tmp_path)
    cfg = {
        "kind": "pipeline",
        "workdir": str(tmp_path / "work"),
        "workers": 1,
        "processes": False,
        "synth": {
            "seed": 3,
            "resolution": 10.0,
            "years": [2012, 2017],
            "dates_per_year": 3,
            "levels": [850],
            "targets": ["tp24"],
        },
        "evaluate": False,
        "compress": [
            {
                "preset": str(ROOT / "configs/train/emos_tp24.yaml"),  # no sst among its inputs
                "field": {"width": 8, "steps": 20},
            }
        ],
    }
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(cfg))
    res = in_process(["run", str(path)], capsys)
    assert_ok("run: compress stage of a derived target", res, not (tmp_path / "work" / "compressed").exists())
    assert res.code == 2 and "tp24" in res.error_lines[0] and "derived" in res.error_lines[0]
    assert not (tmp_path / "work" / "synth").exists()  # no stage ran


# --- forecast ---------------------------------------------------------------------------------------
@pytest.mark.battery
def test_forecast_from_a_store_with_a_deleted_chunk(t2m_ckpt, store, tmp_path, capsys):
    """A chunk of the last date deleted: damaged input (65), and the fix names forecast's own options
    (it said 'pass --members without 1', exit 66)."""
    copy = tmp_path / "s.zarr"
    shutil.copytree(store, copy)
    last = contract.open_store(copy).sizes["init_time"] - 1
    shutil.rmtree(copy / "t2m" / "c" / str(last))
    out = tmp_path / "fc"
    res = in_process(
        [
            "forecast",
            "--checkpoint",
            str(t2m_ckpt),
            "--input",
            str(copy),
            "--init-time",
            "2017-11-01",
            "--out",
            str(out),
        ],
        capsys,
    )
    res.codes = frozenset({65})
    assert_ok("forecast: store with a deleted chunk", res, not list(out.rglob("*.nc")))
    line = res.error_lines[0]
    assert "--members" not in line and "--init-time/--end" in line and "2017-11-01" in line
