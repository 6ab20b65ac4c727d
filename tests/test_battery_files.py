"""Bad-input battery, operational GRIB files (issue 30): each case ends in one error line with exit 65 or 66
and nothing marked complete. The files are written with eccodes by tests/test_operational_files.py."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from battery import assert_ok, in_process
from test_operational_files import write_control_25, write_seasonal_means, write_tp_accumulated

from postcast.datasets import contract


def _ingest(src: Path, out: Path, *extra: str) -> list[str]:
    return ["ingest", str(src), "--out", str(out), "--threads", *extra]


@pytest.mark.battery
def test_ingest_monthly_means(tmp_path, capsys):
    out = tmp_path / "s.zarr"
    res = in_process(_ingest(write_seasonal_means(tmp_path / "m.grib", members=3), out), capsys)
    assert_ok("ingest: monthly means (stepType avg) of starts with their own steps", res, not contract.is_complete(out))
    assert res.code == 65 and "time-processed" in res.err


@pytest.mark.battery
def test_ingest_precipitation_over_windows(tmp_path, capsys):
    out = tmp_path / "s.zarr"
    res = in_process(_ingest(write_tp_accumulated(tmp_path / "tp6.grib2", window=6), out, "--variables", "tp"), capsys)
    assert_ok("ingest: tp accumulated over 6 h windows", res, not contract.is_complete(out))
    assert res.code == 65


@pytest.mark.battery
def test_ingest_parameter_the_file_lacks(tmp_path, capsys):
    out = tmp_path / "s.zarr"
    res = in_process(_ingest(write_control_25(tmp_path / "c.grib2", steps=(0,)), out, "--variables", "2t,z"), capsys)
    assert_ok("ingest: --variables names a parameter the file lacks", res, not contract.is_complete(out))
    assert res.code == 66 and "variable z" in res.err


@pytest.mark.battery
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


def _records_a_case(fn: ast.FunctionDef, functions: dict[str, ast.FunctionDef], seen: frozenset[str]) -> bool:
    """Whether ``fn`` calls assert_ok, itself or through the module's own helpers."""
    called = {c.func.id for c in ast.walk(fn) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
    helpers = called.intersection(functions).difference(seen | {fn.name})
    return "assert_ok" in called or any(_records_a_case(functions[h], functions, seen | {fn.name}) for h in helpers)


def _is_battery_mark(d: ast.expr) -> bool:
    return ast.unparse(d) == "pytest.mark.battery"


def test_every_test_recording_a_case_carries_the_battery_mark():
    """``pytest -m battery`` runs the whole battery only if every test that records a case is marked."""
    unmarked = []
    for path in sorted(Path(__file__).parent.glob("test_*.py")):
        module = ast.parse(path.read_text())
        functions = {n.name: n for n in module.body if isinstance(n, ast.FunctionDef)}
        unmarked += [
            f"{path.name}::{name}"
            for name, fn in functions.items()
            if name.startswith("test_")
            and _records_a_case(fn, functions, frozenset())
            and not any(_is_battery_mark(d) for d in fn.decorator_list)
        ]
    assert unmarked == [], f"add @pytest.mark.battery to {unmarked}"
