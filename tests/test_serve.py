"""The forecast service over real HTTP on loopback: queries, bad requests, auth, metrics, map."""

import httpx
import numpy as np
import pytest
import web
import xarray as xr

from postcast.serve.testing import running_server, write_forecasts


@pytest.fixture(scope="module")
def forecasts(tmp_path_factory):
    out = tmp_path_factory.mktemp("forecasts")
    write_forecasts(out, n=3)
    return out


@pytest.fixture(scope="module")
def server(forecasts):
    with running_server(forecasts) as url:
        yield url


def test_point_query_returns_the_stored_values(server, forecasts):
    r = web.get(
        f"{server}/forecast/point",
        params={"target": "t850", "lat": 47.4, "lon": 8.6, "time": "2017-01-05T00:00", "threshold": 280},
    )
    assert r.status_code == 200
    body = r.json()
    ds = xr.open_dataset(next(forecasts.rglob("t850_20170103T00.nc"))).isel(forecast_reference_time=0)
    point = ds.sel(latitude=45.0, longitude=10.0)
    assert body["init_time"] == "2017-01-03T00:00:00" and (body["latitude"], body["longitude"]) == (45.0, 10.0)
    assert body["mean"] == pytest.approx(float(point["t850_mean"])) and body["units"] == "K"
    assert body["quantiles"]["0.5"] == pytest.approx(body["mean"], rel=1e-6)
    assert body["exceedance"]["273.15"] == pytest.approx(float(point["t850_exceedance_probability"][0]))
    from scipy.stats import norm

    assert body["exceedance"]["280"] == pytest.approx(norm.sf(280, body["mean"], body["std"]), rel=1e-5)
    latest = web.get(f"{server}/forecast/point", params={"target": "t850", "lat": 0, "lon": -170}).json()
    assert latest["init_time"] == "2017-01-04T00:00:00" and latest["longitude"] == -170.0  # as asked (issue 38)


def test_bbox_listing_health_metrics_and_map(server):
    r = web.get(
        f"{server}/forecast/bbox",
        params={"target": "t850", "lat_min": 40, "lat_max": 50, "lon_min": -10, "lon_max": 10},
    )
    body = r.json()
    assert r.status_code == 200 and body["latitude"] == [40.0, 45.0, 50.0]
    assert body["longitude"] == [-10.0, -5.0, 0.0, 5.0, 10.0] and np.asarray(body["mean"]).shape == (3, 5)  # W to E
    listing = web.get(f"{server}/forecasts").json()["forecasts"]
    assert [f["init_time"][:10] for f in listing] == ["2017-01-02", "2017-01-03", "2017-01-04"]
    assert web.get(f"{server}/health").json()["forecasts"] == 3
    png = web.get(f"{server}/map.png", params={"target": "t850"})
    assert png.headers["content-type"] == "image/png" and png.content[:4] == b"\x89PNG"
    assert "<img" in web.get(f"{server}/").text
    assert "/forecast/point" in web.get(f"{server}/openapi.json").json()["paths"]
    metrics = web.get(f"{server}/metrics").text
    assert 'postcast_requests_total{path="/forecast/bbox",status="200"}' in metrics
    assert "postcast_forecasts 3" in metrics


@pytest.mark.parametrize(
    ("params", "status"),
    [
        ({"target": "q700", "lat": 0, "lon": 0}, 422),  # unknown target
        ({"target": "t850", "lat": 95, "lon": 0}, 422),  # latitude out of range
        ({"target": "t850", "lon": 0}, 422),  # missing latitude
        ({"target": "t850", "lat": 0, "lon": 0, "time": "yesterday-ish"}, 422),
        ({"target": "t850", "lat": 0, "lon": 0, "time": "2030-01-01"}, 404),  # no such forecast
        ({"target": "z500", "lat": 0, "lon": 0}, 404),  # no forecast for that target
    ],
)
def test_bad_requests_get_4xx(server, params, status):
    r = web.get(f"{server}/forecast/point", params=params)
    assert r.status_code == status and "detail" in r.json()


def test_bearer_token(forecasts):
    with running_server(forecasts, token="s3cret") as url:
        q = {"target": "t850", "lat": 0, "lon": 0}
        assert web.get(f"{url}/forecast/point", params=q).status_code == 401
        bad = web.get(f"{url}/forecast/point", params=q, headers={"Authorization": "Bearer nope"})
        assert bad.status_code == 401
        ok = web.get(f"{url}/forecast/point", params=q, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200 and ok.json()["target"] == "t850"
        assert web.get(f"{url}/health").status_code == 200  # health stays open for probes


def test_serve_says_where_it_listens_logs_each_request_and_says_when_it_stopped(forecasts, tmp_path):
    """A real ``postcast serve`` process: its address at start, one access line per request, a line when
    SIGTERM stops it, exit 0 (it printed nothing at all before)."""
    import signal
    import subprocess
    import sys
    import time

    from postcast.serve.testing import free_port

    port, log = free_port(), tmp_path / "serve.log"
    with log.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "postcast", "serve", str(forecasts), "--port", str(port)],
            stdout=err,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.time() + 300  # against a hang only: start-up on a busy machine is slow
        while f"http://127.0.0.1:{port}" not in log.read_text():
            assert proc.poll() is None and time.time() < deadline, log.read_text()
            time.sleep(0.2)
        while True:  # the address is announced just before uvicorn binds it
            try:
                assert web.get(f"http://127.0.0.1:{port}/forecasts").status_code == 200
                break
            except httpx.TransportError:
                assert time.time() < deadline, log.read_text()
                time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
    text = log.read_text()
    assert code == 0, text
    assert '"GET /forecasts HTTP/1.1" 200' in text
    assert "Traceback" not in text and text.rstrip().splitlines()[-1].endswith("postcast serve stopped")


def test_targets_come_from_the_schema(server):
    """The target parameter was a hand-written regex (z500|t850|t2m) and the map defaulted to t850: both
    now come from the schema, the OpenAPI document enumerates the targets, and the map without a target
    shows the latest forecast's."""
    from postcast.datasets import schema

    doc = web.get(f"{server}/openapi.json").json()
    for path in ("/forecast/point", "/forecast/bbox", "/map.png"):
        params = doc["paths"][path]["get"]["parameters"]
        target = next(p for p in params if p["name"] == "target")
        schemas = [target["schema"], *target["schema"].get("anyOf", [])]
        assert any(s.get("enum") == list(schema.TARGETS) for s in schemas), (path, target)
    r = web.get(f"{server}/map.png")
    assert r.status_code == 200 and r.headers["content-type"] == "image/png"
