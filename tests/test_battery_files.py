"""Bad-input battery, operational GRIB files (issue 30): each case ends in one error line with exit 65 or 66
and nothing marked complete. The files are written with eccodes by tests/test_operational_files.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from battery import assert_ok, in_process
from test_operational_files import write_control_25, write_seasonal_means, write_tp_accumulated

from postcast.datasets import contract


def _ingest(src: Path, out: Path, *extra: str) -> list[str]:
    return ["ingest", str(src), "--out", str(out), "--threads", *extra]


def test_ingest_monthly_means(tmp_path, capsys):
    out = tmp_path / "s.zarr"
    res = in_process(_ingest(write_seasonal_means(tmp_path / "m.grib", members=3), out), capsys)
    assert_ok("ingest: monthly means (stepType avg) of starts with their own steps", res, not contract.is_complete(out))
    assert res.code == 65 and "time-processed" in res.err


def test_ingest_precipitation_over_windows(tmp_path, capsys):
    out = tmp_path / "s.zarr"
    res = in_process(_ingest(write_tp_accumulated(tmp_path / "tp6.grib2", window=6), out, "--variables", "tp"), capsys)
    assert_ok("ingest: tp accumulated over 6 h windows", res, not contract.is_complete(out))
    assert res.code == 65


def test_ingest_parameter_the_file_lacks(tmp_path, capsys):
    out = tmp_path / "s.zarr"
    res = in_process(_ingest(write_control_25(tmp_path / "c.grib2", steps=(0,)), out, "--variables", "2t,z"), capsys)
    assert_ok("ingest: --variables names a parameter the file lacks", res, not contract.is_complete(out))
    assert res.code == 66 and "variable z" in res.err


@pytest.mark.parametrize("damage", ["not GRIB", "truncated"])
def test_inspect_damaged_file(tmp_path, capsys, damage):
    path = tmp_path / "f.grib2"
    if damage == "truncated":
        data = write_control_25(tmp_path / "whole.grib2", steps=(0,)).read_bytes()
        path.write_bytes(data[: len(data) // 2 + 5])
    else:
        path.write_bytes(b"this is no GRIB file\n" * 10)
    res = in_process(["inspect", str(path)], capsys)
    assert_ok(f"inspect FILE: {damage}", res)
    assert res.code == 65
