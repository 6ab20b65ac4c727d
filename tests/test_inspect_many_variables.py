"""``postcast inspect FILE`` of a netCDF file with many variables (issue 38 item 9): 20 000 variables ran past
120 s, quadratic in their number (``ds[name]`` per variable scans every variable for its coordinates)."""

from __future__ import annotations

import sys
from pathlib import Path

import netCDF4
import pytest

from postcast.datasets import inspection


def _many(path: Path, n: int) -> Path:
    """A netCDF file of ``n`` small variables on one (latitude, longitude) grid, written with netCDF4."""
    with netCDF4.Dataset(path, "w") as d:
        d.createDimension("latitude", 3)
        d.createDimension("longitude", 4)
        d.createVariable("latitude", "f4", ("latitude",))[:] = [0.0, 1.0, 2.0]
        d.createVariable("longitude", "f4", ("longitude",))[:] = [0.0, 1.0, 2.0, 3.0]
        for i in range(n):
            d.createVariable(f"v{i:05d}", "f4", ("latitude", "longitude")).units = "K"
    return path


def _python_calls(path: Path) -> int:
    """The Python function calls ``inspect FILE`` makes (sys.setprofile): a count of work, not a time, so
    other jobs on the machine cannot make it pass or fail."""
    calls = 0

    def count(frame: object, event: str, arg: object) -> None:
        nonlocal calls
        calls += event == "call"

    sys.setprofile(count)
    try:
        info = inspection.file_summary(path)
    finally:
        sys.setprofile(None)
    assert len(info["parameters"]) == int(path.stem.split("_")[1])
    return calls


def test_inspect_work_grows_linearly_with_the_number_of_variables(tmp_path):
    """4x the variables costs about 4x the calls (quadratic: 16x)."""
    small, large = _many(tmp_path / "v_500.nc", 500), _many(tmp_path / "v_2000.nc", 2000)
    _python_calls(small)  # warm: imports and caches
    ratio = _python_calls(large) / _python_calls(small)
    assert ratio < 5.0, ratio


@pytest.mark.slow
def test_inspect_of_20000_variables(cli, tmp_path):
    path = _many(tmp_path / "v_20000.nc", 20_000)
    proc = cli("inspect", str(path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "v19999" in proc.stdout
