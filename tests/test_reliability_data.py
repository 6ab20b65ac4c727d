"""Coordinates and values checked where they are read (issue 56, items 1 and 4): a forecast file whose
latitudes or longitudes are not finite, not monotonic, repeated or out of range, or whose quantiles decrease
with the level, or whose raw members are not finite, is refused (skipped, listed by /health with the reason),
never answered with a 500 or with silently dropped members.

In-process (the FastAPI app through ``TestClient``): each case costs milliseconds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from fastapi.testclient import TestClient

from postcast.datasets import schema
from postcast.pipeline.products.archive import EXTENSIONS, POSTPROCESSED, product_path, write_product
from postcast.serve.app import create_app
from postcast.serve.testing import postprocessed

INIT = pd.Timestamp("2017-01-02")
GRID = schema.Grid(5.0)  # 37 x 72


def _refuse(name: str) -> float:
    raise ValueError(f"not JSON: {name}")


def strict(r) -> dict:
    """The answer's JSON, refusing NaN and Infinity (the JSON standard has neither)."""
    return json.loads(r.text, parse_constant=_refuse)


def _field(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return 280.0 + rng.normal(0, 1, GRID.shape), 1.0 + rng.random(GRID.shape)


def _write(root: Path, model: str, *, lat=None, lon=None, members=None, quantiles=None, seed: int = 0) -> Path:
    """A t2m product of ``model`` on the 5 deg grid, with its coordinates, members or quantiles replaced."""
    mean, std = _field(seed)
    ds = postprocessed(mean, std, "t2m", INIT, GRID, (273.15,), members=members)
    if lat is not None:
        ds = ds.assign_coords(latitude=("latitude", np.asarray(lat, np.float64), ds["latitude"].attrs))
    if lon is not None:
        ds = ds.assign_coords(longitude=("longitude", np.asarray(lon, np.float64), ds["longitude"].attrs))
    if quantiles is not None:
        ds["t2m_quantile"].values[:] = quantiles[:, None].astype(np.float32)
    path = product_path(root, POSTPROCESSED, model, "t2m", INIT, EXTENSIONS["netcdf"])
    write_product(ds, path)
    return path


def _scores(root: Path, **crps: float) -> None:
    forecasts = {m: {"global": {"crps_weighted": v}} for m, v in crps.items()}
    (root / "metrics.json").write_text(json.dumps({"targets": {"t2m": {"forecasts": forecasts}}}))


def _client(root: Path) -> TestClient:
    return TestClient(create_app(root, watch_s=None), raise_server_exceptions=False)


def _bad_lat(kind: str) -> np.ndarray:
    lat = GRID.latitudes().copy()
    if kind == "nan":
        lat[5] = np.nan
    elif kind == "inf":
        lat[-1] = np.inf
    elif kind == "not monotonic":
        lat[[3, 4]] = lat[[4, 3]]
    elif kind == "repeated":
        lat[4] = lat[3]
    else:  # out of range
        lat = lat * 1.1
    return lat


BAD_LATITUDES = {
    "nan": "not finite",
    "inf": "not finite",
    "not monotonic": "monoton",
    "repeated": "repeat",
    "out of range": "-90..90",
}


@pytest.mark.parametrize("kind", list(BAD_LATITUDES))
def test_a_forecast_file_with_bad_latitudes_is_skipped_and_the_next_model_served(tmp_path, kind):
    """One NaN latitude in the best-ranked model's file gave 500 on the plain point query (issue 56 item 1)."""
    _write(tmp_path, "best", lat=_bad_lat(kind))
    good = _write(tmp_path, "other", seed=1)
    _scores(tmp_path, best=0.5, other=0.9)
    client = _client(tmp_path)
    r = client.get("/forecast/point", params={"target": "t2m", "lat": 45, "lon": 10})
    assert r.status_code == 200, r.text
    assert strict(r)["model"] == "other"
    health = strict(client.get("/health"))
    assert health["status"] == "degraded"
    (skip,) = health["skipped"]
    assert "best" in skip["path"] and good.name in skip["path"]
    for route in ("/forecast/bbox", "/map.png", "/forecast/law"):
        params = {"target": "t2m", "model": "best"}
        if route == "/forecast/bbox":
            params.update(lat_min=30, lat_max=50, lon_min=0, lon_max=20)
        answer = client.get(route, params=params)
        assert answer.status_code in (404, 422), (route, answer.text)  # its only file unreadable: not served
        assert strict(answer)["detail"]


@pytest.mark.parametrize("kind", list(BAD_LATITUDES))
def test_the_reason_a_bad_latitude_file_is_skipped_names_the_problem(tmp_path, kind):
    _write(tmp_path, "best", lat=_bad_lat(kind))
    app = create_app(tmp_path, watch_s=None)
    client = TestClient(app, raise_server_exceptions=False)
    assert client.get("/forecast/point", params={"target": "t2m", "lat": 45, "lon": 10}).status_code == 404
    (skip,) = app.state.catalog.skipped
    assert "latitude" in skip.reason and BAD_LATITUDES[kind] in skip.reason, skip.reason


@pytest.mark.parametrize("kind", ["nan", "repeated", "out of range"])
def test_a_forecast_file_with_bad_longitudes_is_skipped(tmp_path, kind):
    lon = GRID.longitudes().copy()
    if kind == "nan":
        lon[7] = np.nan
    elif kind == "repeated":
        lon[8] = lon[7]
    else:
        lon[-1] = 1e30  # an unmasked fill value
    _write(tmp_path, "best", lon=lon)
    app = create_app(tmp_path, watch_s=None)
    client = TestClient(app, raise_server_exceptions=False)
    r = client.get("/forecast/point", params={"target": "t2m", "lat": 45, "lon": 10})
    assert r.status_code == 404, r.text
    (skip,) = app.state.catalog.skipped
    assert "longitude" in skip.reason, skip.reason


@pytest.mark.parametrize("lon", [np.arange(-180.0, 180.0, 5.0), np.mod(np.arange(0.0, 360.0, 5.0) + 180.0, 360.0)])
def test_longitudes_in_either_convention_or_order_around_the_circle_are_served(tmp_path, lon):
    """Not every reordering is a fault: -180..175, and 180..355, 0..175 (once around, eastward), are one grid."""
    _write(tmp_path, "m", lon=lon)
    client = _client(tmp_path)
    r = client.get("/forecast/point", params={"target": "t2m", "lat": 45, "lon": -170})
    assert r.status_code == 200, r.text
    assert strict(r)["longitude"] == -170.0 and strict(client.get("/health"))["status"] == "ok"


def _levels_quantiles(decreasing: bool) -> np.ndarray:
    """(Q,) quantiles of the 7 default levels, everywhere: increasing, or with the 0.5 and 0.75 swapped."""
    q = np.array([270.0, 272.0, 275.0, 280.0, 285.0, 288.0, 290.0])
    if decreasing:
        q[[3, 4]] = q[[4, 3]]
    return np.broadcast_to(q[:, None, None], (q.size, *GRID.shape))


def test_a_forecast_file_whose_quantiles_decrease_with_the_level_is_refused(tmp_path):
    """Was served: the page's CDF would run backwards (issue 56 item 4)."""
    _write(tmp_path, "best", quantiles=_levels_quantiles(decreasing=True))
    app = create_app(tmp_path, watch_s=None)
    client = TestClient(app, raise_server_exceptions=False)
    r = client.get("/forecast/point", params={"target": "t2m", "lat": 45, "lon": 10})
    assert r.status_code == 404, r.text
    (skip,) = app.state.catalog.skipped
    assert "decrease" in skip.reason and "quantile" in skip.reason, skip.reason


def test_a_forecast_file_whose_quantiles_increase_is_served(tmp_path):
    _write(tmp_path, "best", quantiles=_levels_quantiles(decreasing=False))
    r = _client(tmp_path).get("/forecast/point", params={"target": "t2m", "lat": 45, "lon": 10})
    assert r.status_code == 200, r.text
    assert list(strict(r)["quantiles"].values()) == [270.0, 272.0, 275.0, 280.0, 285.0, 288.0, 290.0]


@pytest.mark.parametrize("bad", ["one nan", "all inf"])
def test_a_forecast_file_with_non_finite_raw_members_is_refused(tmp_path, bad):
    """A NaN member was dropped silently, and all-infinite members answered members: [] (issue 56 item 4)."""
    members = 280.0 + np.random.default_rng(3).normal(0, 1, (5, *GRID.shape))
    lat, lon = GRID.latitudes()[27], GRID.longitudes()[2]  # 45 N, 10 E
    if bad == "one nan":
        members[2, 27, 2] = np.nan
    else:
        members[:] = np.inf
    _write(tmp_path, "best", members=members)
    app = create_app(tmp_path, watch_s=None)
    client = TestClient(app, raise_server_exceptions=False)
    r = client.get("/forecast/point", params={"target": "t2m", "lat": lat, "lon": lon})
    assert r.status_code == 404, r.text
    (skip,) = app.state.catalog.skipped
    assert "raw members" in skip.reason and "not finite" in skip.reason, skip.reason


def test_finite_raw_members_are_served_whole(tmp_path):
    members = 280.0 + np.random.default_rng(3).normal(0, 1, (5, *GRID.shape))
    _write(tmp_path, "best", members=members)
    r = _client(tmp_path).get("/forecast/point", params={"target": "t2m", "lat": 45, "lon": 10})
    assert r.status_code == 200, r.text
    assert strict(r)["members"] == pytest.approx(members[:, 27, 2].astype(np.float32).tolist())
