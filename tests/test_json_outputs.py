"""Every JSON file postcast writes is standard JSON: no bare NaN or Infinity (issue 38 item 5: evaluate wrote
``"dm_p_value": NaN`` with 2 test dates, which a strict reader such as JavaScript's ``JSON.parse`` refuses)."""

from __future__ import annotations

import json
import math

import numpy as np

from postcast.datasets import io


def _refuse(constant: str) -> None:
    raise ValueError(f"not JSON: {constant}")


def test_non_finite_numbers_are_written_as_null(tmp_path):
    path = tmp_path / "metrics.json"
    obj = {"dm_p_value": math.nan, "ci95": [-math.inf, 1.5], "deep": {"x": math.inf, "n": 3, "ok": True}}
    io.write_json(path, obj)
    read = json.loads(path.read_text(), parse_constant=_refuse)
    assert read == {"dm_p_value": None, "ci95": [None, 1.5], "deep": {"x": None, "n": 3, "ok": True}}


def test_numpy_floats_are_numbers_not_strings(tmp_path):
    path = tmp_path / "s.json"
    io.write_json(path, {"a": np.float64(0.25), "b": np.float32(math.nan), "c": np.int64(4)})
    assert json.loads(path.read_text(), parse_constant=_refuse) == {"a": 0.25, "b": None, "c": 4}
