"""The service validates what it reads from disk and answers strict JSON (issue 38 item 5): a deeply nested
or ill-typed metrics.json, products with NaN quantiles, exceedances or thresholds or with parameters
outside their family's domain, and longitudes in either convention. Every answer is parsed with a strict
parser (bare NaN / Infinity refused)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from fastapi.testclient import TestClient

from postcast.datasets import schema
from postcast.pipeline.products.archive import (
    DEFAULT_QUANTILES,
    EXTENSIONS,
    POSTPROCESSED,
    product_path,
    write_product,
)
from postcast.pipeline.products.content import Law
from postcast.serve.app import create_app
from postcast.serve.testing import postprocessed, write_forecasts

INIT = pd.Timestamp("2017-01-02")


def _refuse(name: str) -> float:
    raise ValueError(f"not JSON: {name}")


def strict(r) -> dict:
    """The answer's JSON, refusing NaN, Infinity and -Infinity (the JSON standard has none of them)."""
    return json.loads(r.text, parse_constant=_refuse)


def _client(root: Path) -> TestClient:
    return TestClient(create_app(root, watch_s=None), raise_server_exceptions=False)


def _write_law(root: Path, target: str, law: Law, model: str = "emos", thresholds=(1.0,)) -> None:
    grid = schema.Grid(5.0)
    mean = np.full(grid.shape, 1.0)
    ds = postprocessed(mean, mean, target, INIT, grid, thresholds, law)
    write_product(ds, product_path(root, POSTPROCESSED, model, target, INIT, EXTENSIONS["netcdf"]))


def _params(family: str, **values: float) -> dict[str, np.ndarray]:
    shape = schema.Grid(5.0).shape
    return {k: np.full(shape, v) for k, v in values.items()}


BAD_LAWS = {
    "csg shape < 0": ("tp24", "csg", {"shape": -1.0, "scale": 1.0, "shift": 0.5}),
    "clogistic scale 0": ("tp24", "clogistic", {"loc": 1.0, "scale": 0.0}),
    "truncnormal sigma < 0": ("ws10", "truncnormal", {"mu": 5.0, "sigma": -2.0}),
}


@pytest.mark.parametrize("case", list(BAD_LAWS))
def test_a_product_with_invalid_parameters_is_skipped_never_served(tmp_path, case):
    """Served bare NaN (and exceedance probabilities of 5.0): now the file is unreadable, listed by /health."""
    target, family, values = BAD_LAWS[case]
    p = _params(family, **values)
    with np.errstate(all="ignore"):
        law = Law.of(family, p, DEFAULT_QUANTILES, (1.0,))
    _write_law(tmp_path, target, law)
    client = _client(tmp_path)
    r = client.get("/forecast/point", params={"target": target, "lat": 10, "lon": 10, "threshold": 3})
    assert r.status_code == 404, r.text
    strict(r)
    health = strict(client.get("/health"))
    assert health["status"] == "degraded" and health["skipped"], health


@pytest.mark.parametrize("what", ["quantiles", "exceedance", "thresholds"])
def test_a_product_with_nan_quantiles_exceedances_or_thresholds_is_not_served(tmp_path, what):
    p = _params("gaussian", mu=1.0, sigma=2.0)
    law = Law.of("gaussian", p, DEFAULT_QUANTILES, (1.0,))
    thresholds = (1.0,)
    if what == "quantiles":
        law.quantiles[2, 3, 4] = np.nan
    elif what == "exceedance":
        law.exceedance[0, 3, 4] = np.nan
    else:
        thresholds = (np.nan,)
    _write_law(tmp_path, "t2m", law, thresholds=thresholds)
    client = _client(tmp_path)
    lat, lon = schema.Grid(5.0).latitudes()[3], schema.Grid(5.0).longitudes()[4]  # where the NaN is
    r = client.get("/forecast/point", params={"target": "t2m", "lat": lat, "lon": lon})
    assert r.status_code == 404, r.text
    strict(r)
    assert strict(client.get("/health"))["status"] == "degraded"


def _scored(tmp_path: Path, scores: dict[str, object] | str) -> TestClient:
    root = tmp_path / "forecasts"
    for k, model in enumerate(["a", "b", "c"]):
        write_forecasts(root, target="t2m", n=1, model=model, seed=k)
    by_model = {m: {"global": {"crps_weighted": v}} for m, v in scores.items()} if isinstance(scores, dict) else {}
    text = scores if isinstance(scores, str) else json.dumps({"targets": {"t2m": {"forecasts": by_model}}})
    (root / "metrics.json").write_text(text)
    return _client(root)


def test_a_deeply_nested_metrics_json_is_a_broken_scores_file_not_a_500(tmp_path):
    client = _scored(tmp_path, '{"targets": ' + "[" * 100_000 + "]" * 100_000 + "}")
    r = client.get("/forecasts")
    assert r.status_code == 200, r.text
    assert [m["crps"] for m in strict(r)["targets"][0]["models"]] == [None, None, None]
    health = strict(client.get("/health"))
    assert health["status"] == "degraded" and health["skipped"][0]["path"] == "metrics.json", health


def test_boolean_or_negative_scores_do_not_rank_models(tmp_path):
    """true was read as 1.0 and -5 ranked best: a CRPS is a non-negative number, anything else is unscored."""
    client = _scored(tmp_path, {"a": True, "b": -5, "c": 0.5})
    (entry,) = strict(client.get("/forecasts"))["targets"]
    assert entry["default_model"] == "c"
    assert {m["model"]: m["crps"] for m in entry["models"]} == {"c": 0.5, "a": None, "b": None}


@pytest.fixture(scope="module")
def grid_client(tmp_path_factory) -> TestClient:
    root = tmp_path_factory.mktemp("lon")
    write_forecasts(root, target="t2m", n=1)
    write_forecasts(root, target="tp24", n=1)
    return _client(root)


def _box_lon(client: TestClient, lo: float, hi: float) -> list[float]:
    q = {"target": "t2m", "lat_min": 0, "lat_max": 5, "lon_min": lo, "lon_max": hi}
    r = client.get("/forecast/bbox", params=q)
    assert r.status_code == 200, r.text
    out = strict(r)
    assert len(out["mean"][0]) == len(out["longitude"])
    return out["longitude"]


@pytest.mark.parametrize(
    ("lo", "hi", "want"),
    [
        (0, 360, list(np.arange(0.0, 360.0, 5.0))),  # was [0.0]
        (-180, 180, list(np.arange(-180.0, 180.0, 5.0))),  # was [180]
        (-10, 350, list(np.arange(-10.0, 350.0, 5.0))),  # was [350]
        (-10, 10, [-10.0, -5.0, 0.0, 5.0, 10.0]),  # was [0, 5, 10, 350, 355]: west to east now
        (350, 10, [350.0, 355.0, 0.0, 5.0, 10.0]),
        (20, 30, [20.0, 25.0, 30.0]),
    ],
)
def test_bbox_longitudes_run_west_to_east_in_the_asked_convention(grid_client, lo, hi, want):
    assert _box_lon(grid_client, lo, hi) == want


def test_bbox_columns_follow_their_longitudes(grid_client):
    """The box's mean columns are those of its longitudes: -10..10 is 350, 355, 0, 5, 10 of the grid."""
    q = {"target": "t2m", "lat_min": 0, "lat_max": 0}
    west = strict(grid_client.get("/forecast/bbox", params={**q, "lon_min": -10, "lon_max": 10}))["mean"][0]
    a = strict(grid_client.get("/forecast/bbox", params={**q, "lon_min": 350, "lon_max": 355}))["mean"][0]
    b = strict(grid_client.get("/forecast/bbox", params={**q, "lon_min": 0, "lon_max": 10}))["mean"][0]
    assert west == a + b


def test_a_point_is_answered_in_the_asked_longitude_convention(grid_client):
    """lon=-170 was answered as 190."""
    r = strict(grid_client.get("/forecast/point", params={"target": "t2m", "lat": 0, "lon": -170}))
    assert r["longitude"] == -170.0
    east = strict(grid_client.get("/forecast/point", params={"target": "t2m", "lat": 0, "lon": 190}))
    assert east["longitude"] == 190.0


def test_a_threshold_below_the_targets_range_is_refused(grid_client):
    """threshold=-1 was accepted for rain (P(tp24 > -1 mm) is 1 whatever the forecast)."""
    r = grid_client.get("/forecast/point", params={"target": "tp24", "lat": 0, "lon": 0, "threshold": -1})
    assert r.status_code == 422 and "-1" in strict(r)["detail"], r.text
    ok = grid_client.get("/forecast/point", params={"target": "tp24", "lat": 0, "lon": 0, "threshold": 0})
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("where", ["lat", "lon"])
def test_a_nan_coordinate_is_refused_as_not_finite(grid_client, where):
    """lat=nan was refused as "should be <= 90" (issue 38 item 10): a NaN is not out of range, it is no number."""
    params = {"target": "t2m", "lat": 10, "lon": 10, where: "nan"}
    r = grid_client.get("/forecast/point", params=params)
    assert r.status_code == 422 and "finite" in strict(r)["detail"] and "<=" not in strict(r)["detail"], r.text
