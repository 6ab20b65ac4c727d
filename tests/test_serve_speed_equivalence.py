"""The point query's fast path (issue 58) answers exactly as FastAPI's validated path does, and the answers
stay right: every query below gets the same status, body and content type with the fast path on and off
(the route's ``fast`` function unset: FastAPI validates every parameter), the values agree with a direct
reading of the file (xarray, nearest grid point found independently, scipy for a threshold the file does
not carry), and the parts encoded once per file (the answer's head and law, the map's headers) follow a
replaced file.

In-process (the FastAPI app through ``TestClient``): no server start.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from fastapi import Query
from fastapi.testclient import TestClient
from scipy import stats

from postcast.datasets import schema
from postcast.pipeline.products.archive import DEFAULT_QUANTILES, EXTENSIONS, POSTPROCESSED, product_path, write_product
from postcast.pipeline.products.content import Law
from postcast.serve.app import create_app
from postcast.serve.fast import POINT_PARAMS, FastRoute, closed_bounds, number, point_params
from postcast.serve.testing import postprocessed, write_forecasts

INIT = pd.Timestamp("2017-01-02")


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> Path:
    """t850 (Gaussian, three init times, 2.5 deg), z500 of another model, and tp24 with a CSG law and raw members."""
    root = tmp_path_factory.mktemp("archive")
    write_forecasts(root, n=3, resolution=2.5)
    write_forecasts(root, target="z500", n=1, model="mlp")
    grid = schema.Grid(5.0)
    rng = np.random.default_rng(1)
    params = {
        "shape": np.full(grid.shape, 2.0),
        "scale": 1.0 + rng.random(grid.shape),
        "shift": np.full(grid.shape, 0.5),
    }
    law = Law.of("csg", params, DEFAULT_QUANTILES, (1.0, 10.0))
    ds = postprocessed(
        np.ones(grid.shape), np.ones(grid.shape), "tp24", INIT, grid, (1.0, 10.0), law, rng.random((5, *grid.shape))
    )
    write_product(ds, product_path(root, POSTPROCESSED, "emos", "tp24", INIT, EXTENSIONS["netcdf"]))
    return root


def _clients(root: Path, token: str | None = None) -> tuple[TestClient, TestClient]:
    """The service as served (fast path on) and the same service with FastAPI validating every query."""
    fast, slow = create_app(root, token, watch_s=None), create_app(root, token, watch_s=None)
    routes = [r for r in slow.router.routes if isinstance(r, FastRoute)]
    assert [r.path for r in routes] == ["/forecast/point"]
    routes[0].fast = None
    return TestClient(fast, raise_server_exceptions=False), TestClient(slow, raise_server_exceptions=False)


NUMBERS = [
    "47.4", "-33.25", "1e1", "+5", ".5", "5.", "-0", "00012", "1.5E-1", "1e-400", "%2D5", "%2B5", " 5", "5 ", "+5",
    "1_0", "nan", "NaN", "inf", "-infinity", "1e400", "", "abc", "0x10", "5e", "--5", "1,5", "%D9%A3", "90",
    "90.0000001", "-90", "-90.0001", "-180", "-180.0001", "360", "360.0001", "12345678901234567890123",
]  # fmt: skip


def _queries() -> list[str]:
    rng = np.random.default_rng(3)
    out = [
        f"target=t850&lat={rng.uniform(-90, 90):.3f}&lon={rng.uniform(-180, 360):.3f}&time=2017-01-0{d}T00:00"
        for d in rng.integers(3, 8, 40)
    ]
    for v in NUMBERS:
        out += [
            f"target=t850&lat={v}&lon=10",
            f"target=t850&lat=10&lon={v}",
            f"target=tp24&lat=10&lon=10&threshold={v}",
        ]
    out += [f"target={t}&lat=10&lon=10" for t in ("t850", "T850", "t850%0A", "", "z500", "t2m", "tp24", "t%38%35%30")]
    out += [
        f"target=t850&lat=10&lon=10&time={t}" for t in ("2017-01-04", "2017-01-04T00:00Z", "", "garbage", "1500-01-01")
    ]
    out += [f"target=z500&lat=10&lon=10&model={m}" for m in ("mlp", "unet", "", "nope", "unet%00")]
    out += [
        "", "lat=10&lon=10", "target=t850&lon=10", "target=t850&lat=10&lat=20&lon=10", "target=t850&lat=10&lon=10&",
        "target=t850&lat=10&lon=10&target=z500", "target=t850&lat=10&lon=10&bogus=1", "target=t850&lat&lon=10",
        "target=t850&lat=10&lon=10&threshold", "target=t850&lat=10&lon=10&model", "target=t850&lat=10&lon=10&time",
        "target=t850&lat=10&lon=10&threshold=273.15", "target=t850&lat=10&lon=-170&threshold=1e300",
        "target=tp24&lat=10&lon=10&threshold=-0.5", "target=tp24&lat=10&lon=10&threshold=0",
        "lon=10&target=tp24&lat=10",
    ]  # fmt: skip
    return out


def _answer(client: TestClient, method: str, query: str, headers: dict[str, str]) -> tuple:
    r = client.request(method, f"/forecast/point?{query}", headers=headers)
    return r.status_code, r.content, r.headers.get("content-type"), r.headers.get("www-authenticate")


@pytest.mark.parametrize("token", [None, "s3cret"])
def test_the_fast_path_answers_as_fastapi_validation_does(archive, token):
    fast, slow = _clients(archive, token)
    good = {"Authorization": f"Bearer {token}"} if token else {}
    asked = [(good, q) for q in _queries()]
    if token:  # refused before any route: a few suffice
        asked += [(h, q) for h in ({}, {"Authorization": "Bearer wrong"}) for q in _queries()[::25]]
    for headers, query in asked:
        for method in ("GET", "HEAD"):
            assert _answer(fast, method, query, headers) == _answer(slow, method, query, headers), (query, method)
    assert fast.get("/openapi.json", headers=good).content == slow.get("/openapi.json", headers=good).content


def test_plain_queries_take_the_fast_path_and_odd_ones_do_not():
    def scope(query: str) -> dict:
        return {"query_string": query.encode()}

    assert point_params(scope("target=t850&lat=47.4&lon=-8.6&time=2017-01-04T00:00")) == {
        "target": "t850", "lat": 47.4, "lon": -8.6, "time": "2017-01-04T00:00", "model": None, "threshold": None,
    }  # fmt: skip
    for odd in (
        "target=t850&lat=1&lat=2&lon=3",
        "target=t850&lat=1",
        "target=T850&lat=1&lon=2",
        "target=t850&lat=1_0&lon=2",
    ):
        assert point_params(scope(odd)) is None, odd
    assert [number(t, -90.0, 90.0) for t in ("1e1", "-.5", "5.", "+0")] == [10.0, -0.5, 5.0, 0.0]
    assert [number(t, -90.0, 90.0) for t in ("nan", "inf", " 1", "1e400", "90.5", "٣", "0x1")] == [None] * 7


def test_the_fast_path_reads_every_parameter_the_route_takes(archive):
    """A parameter added to the route, or a constraint the fast path does not check, must not slip past it."""
    route = next(r for r in create_app(archive, watch_s=None).router.routes if isinstance(r, FastRoute))
    assert {p.alias for p in route.dependant.query_params} == POINT_PARAMS
    assert closed_bounds(Annotated[float, Query(ge=-1.0, le=2.0, allow_inf_nan=False)]) == (-1.0, 2.0)
    with pytest.raises(ValueError, match="fast path"):
        closed_bounds(Annotated[float, Query(gt=0.0)])


def _nearest(values: np.ndarray, x: float, periodic: bool) -> int:
    d = np.abs(values - x)
    return int(np.argmin(np.minimum(d, 360.0 - d) if periodic else d))


@pytest.mark.parametrize(
    ("target", "lat", "lon", "threshold"),
    [
        ("t850", 47.4, 8.6, 280.0),
        ("t850", -89.9, -179.9, None),
        ("t850", 12.6, 359.0, 250.5),
        ("tp24", 10.2, -20.0, 3.3),
    ],
)
def test_the_point_answer_is_the_files_values_at_the_nearest_grid_point(archive, target, lat, lon, threshold):
    fast, _ = _clients(archive)
    params = {"target": target, "lat": lat, "lon": lon, **({"threshold": threshold} if threshold is not None else {})}
    body = json.loads(fast.get("/forecast/point", params=params).content)
    path = sorted(archive.rglob(f"{target}_*.nc"))[-1]  # the latest init time
    with xr.open_dataset(path) as opened:
        ds = opened.isel(forecast_reference_time=0).load()
    i, j = _nearest(ds.latitude.values, lat, False), _nearest(ds.longitude.values, lon % 360.0, True)
    at = ds.isel(latitude=i, longitude=j)
    grid_lon = float(ds.longitude[j])
    assert body["latitude"] == float(ds.latitude[i])
    assert body["longitude"] == (grid_lon - 360.0 if lon < 0 and grid_lon > 180.0 else grid_lon)
    assert (body["mean"], body["std"]) == (float(at[f"{target}_mean"]), float(at[f"{target}_std"]))
    levels = [f"{q:g}" for q in ds["quantile"].values]
    assert body["quantiles"] == dict(zip(levels, at[f"{target}_quantile"].values.tolist(), strict=True))
    stored = dict(
        zip(
            [f"{t:g}" for t in ds.threshold.values], at[f"{target}_exceedance_probability"].values.tolist(), strict=True
        )
    )
    assert {k: v for k, v in body["exceedance"].items() if k in stored} == stored
    if target == "t850":
        assert body["exceedance"][f"{threshold:g}" if threshold else "273.15"] == pytest.approx(
            stats.norm.sf(threshold or 273.15, body["mean"], body["std"]), rel=1e-5, abs=1e-12
        )
        assert body["members"] is None and body["law"]["family"] == "gaussian"
    else:
        assert body["members"] == at[f"{target}_raw_member"].values.tolist() and body["law"]["family"] == "csg"
        assert 0.0 <= body["exceedance"][f"{threshold:g}"] <= 1.0
    assert body["init_time"] == pd.Timestamp(ds.forecast_reference_time.values).isoformat()


def test_the_parts_encoded_once_follow_a_replaced_file(tmp_path):
    """The point answer's head and law and the map's headers are kept with the loaded file: a file replaced by
    one on another grid, with other units of thresholds, is answered from the new one."""
    paths = write_forecasts(tmp_path / "a", n=1, resolution=5.0)
    client = TestClient(create_app(tmp_path / "a", watch_s=None), raise_server_exceptions=False)
    point = {"target": "t850", "lat": 41.0, "lon": 11.0}
    before = client.get("/forecast/point", params=point).json()
    extent = client.get("/map.png", params={"target": "t850"}).headers["x-map-extent"]
    assert before["latitude"] == 40.0 and extent == "-182.5,177.5,-90,90"
    newer = write_forecasts(tmp_path / "b", n=1, resolution=2.0, seed=5)[-1]
    os.replace(newer, paths[-1])
    assert client.get("/forecasts", params={"refresh": "true"}).status_code == 200
    after = client.get("/forecast/point", params=point).json()
    assert after["latitude"] == 42.0 and after["mean"] != before["mean"]
    assert client.get("/map.png", params={"target": "t850"}).headers["x-map-extent"] == "-181,179,-90,90"


def test_time_now_is_read_again_at_each_request_not_frozen_at_the_first():
    """``time=now`` named the first request's moment for the life of the server: parse_time cached its answer
    for the text "now". Two parses, the clock moved on between them: the second is later."""
    from postcast.serve.schemas import parse_time

    first = parse_time("now")
    assert first is not None
    while pd.Timestamp("now") <= first:  # wait for the clock to tick (an event, not a fixed sleep)
        pass
    second = parse_time("now")
    assert second is not None and second > first
    assert parse_time("2017-01-04T00:00") == pd.Timestamp("2017-01-04")  # absolute times still parse the same
