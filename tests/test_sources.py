"""One registry of source kinds (zarr, netCDF, GRIB) for forecasts and truth alike: a path is judged by
what it is (a zarr store's metadata, netCDF/HDF5 or GRIB content), not by three different name rules."""

from __future__ import annotations

import shutil

import pytest

from postcast.datasets import contract, sources
from postcast.datasets.core.errors import BadInputError, MissingInputError


def _forecast_only(tmp_path, synth_zarr):
    src = tmp_path / "fc"
    src.mkdir()
    (src / "forecast.zarr").symlink_to(synth_zarr / "forecast.zarr")
    return src


def test_truth_in_a_zarr_store_under_any_name_is_found(cli, synth_zarr, tmp_path):
    """--truth at a zarr store not named *.zarr found nothing and wrote the store without truth, exit 0."""
    truth = tmp_path / "analyses"
    shutil.copytree(synth_zarr / "era5.zarr", truth)
    out = tmp_path / "s.zarr"
    proc = cli(
        "ingest",
        str(_forecast_only(tmp_path, synth_zarr)),
        "--truth",
        str(truth),
        "--out",
        str(out),
        "--threads",
        "--variables",
        "t,z,t2m",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert {"truth_t850", "truth_z500", "truth_t2m"} <= set(contract.open_store(out).data_vars)


def test_truth_that_yields_nothing_exits_66_naming_what_was_searched(cli, synth_zarr, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "README.txt").write_text("not truth")
    out = tmp_path / "s.zarr"
    proc = cli(
        "ingest", str(_forecast_only(tmp_path, synth_zarr)), "--truth", str(empty), "--out", str(out), "--threads"
    )
    assert proc.returncode == 66, proc.stderr[-2000:]
    line = next(ln for ln in proc.stderr.splitlines() if ln.startswith("postcast: error:"))
    assert f"truth {empty}: no truth found; searched for a zarr store and netCDF files" in line
    assert not contract.is_complete(out)


def test_grib_truth_is_refused_with_the_fix(synth_grib, tmp_path):
    only_grib = tmp_path / "analyses"
    only_grib.mkdir()
    for p in synth_grib.glob("output.*"):
        shutil.copy(p, only_grib / p.name)
    with pytest.raises(BadInputError, match="GRIB analyses are not read as truth: convert them to netCDF"):
        sources.truth_paths(only_grib)


def test_kinds_by_content_and_name(synth_zarr, synth_grib, synth_netcdf, tmp_path):
    """A zarr store, a netCDF file and a GRIB file are recognised under names that say nothing; a folder of
    *.grib2 files holds GRIB forecasts (it answered "no forecasts found")."""
    grib = next(p for p in sorted(synth_grib.iterdir()) if p.name.startswith("output.pl."))
    nc = next(p for p in sorted(synth_netcdf.iterdir()) if p.suffix == ".nc")
    for src, kind in ((synth_zarr / "forecast.zarr", "zarr"), (nc, "netcdf"), (grib, "grib")):
        anon = tmp_path / f"anon_{kind}"
        (shutil.copytree if src.is_dir() else shutil.copy)(src, anon)
        assert sources.kind_of(anon) == kind
    folder = tmp_path / "grib2"
    folder.mkdir()
    for p in synth_grib.iterdir():
        if p.name.startswith("output."):
            shutil.copy(p, folder / f"{p.name.replace('.', '_')}.grib2")
    found = sources.discover(folder)
    assert isinstance(found.forecast, sources.GribSource) and len(found.forecast.files) == 2 * len(
        [p for p in synth_grib.iterdir() if p.name.startswith("output.pl.")]
    )
    assert sources.find_sources(folder) == ("grib", sorted(folder.iterdir()))
    with pytest.raises(MissingInputError, match="no such file or directory"):
        sources.truth_paths(tmp_path / "missing")
