"""The service over a changing, imperfect archive (issue 17, defect 4): replaced files are reloaded,
unreadable or foreign files are skipped with a degraded /health, and a valid query never gets 500.

In-process (the FastAPI app through ``TestClient``) so each case costs milliseconds, not a server start.
"""

import os
import shutil

import numpy as np
import pytest
import xarray as xr
from fastapi.testclient import TestClient

from postcast.datasets import schema
from postcast.serve.app import create_app
from postcast.serve.grid import Locator, _nearest
from postcast.serve.testing import write_forecasts

POINT = {"target": "t850", "lat": 45.0, "lon": 10.0}


def _client(root, **kw):
    return TestClient(create_app(root, **kw), raise_server_exceptions=False)


def _stored_mean(path, lat=45.0, lon=10.0):
    with xr.open_dataset(path) as ds:
        return float(ds["t850_mean"].isel(forecast_reference_time=0).sel(latitude=lat, longitude=lon))


def test_replaced_file_is_served_fresh_after_refresh(tmp_path):
    paths = write_forecasts(tmp_path / "a", n=2)
    client = _client(tmp_path / "a")
    before = client.get("/forecast/point", params=POINT).json()["mean"]
    assert before == pytest.approx(_stored_mean(paths[-1]))
    newer = write_forecasts(tmp_path / "b", n=2, seed=7)[-1]
    os.replace(newer, paths[-1])  # an atomic rewrite of the newest product, as `forecast --overwrite` does
    assert client.get("/forecasts", params={"refresh": "true"}).status_code == 200
    after = client.get("/forecast/point", params=POINT).json()["mean"]
    assert after == pytest.approx(_stored_mean(paths[-1])) and after != pytest.approx(before)


def test_the_archive_is_watched_without_an_explicit_refresh(tmp_path):
    write_forecasts(tmp_path, n=1)
    client = _client(tmp_path, watch_s=0.0)  # rescan before every request
    assert client.get("/health").json()["forecasts"] == 1
    write_forecasts(tmp_path, n=3)  # two more init times appear
    body = client.get("/forecast/point", params=POINT).json()
    assert body["init_time"] == "2017-01-04T00:00:00" and client.get("/health").json()["forecasts"] == 3


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_unreadable_newest_file_is_skipped_not_500(tmp_path, damage):
    paths = write_forecasts(tmp_path, n=3)
    newest = paths[-1]
    if damage == "truncate":
        data = newest.read_bytes()
        newest.write_bytes(data[: len(data) // 2])
    else:
        newest.write_bytes(b"not a netCDF file at all\n" * 10)
    client = _client(tmp_path)
    point = client.get("/forecast/point", params=POINT)
    assert point.status_code == 200, point.text
    assert point.json()["init_time"] == "2017-01-03T00:00:00"  # the newest readable forecast
    assert point.json()["mean"] == pytest.approx(_stored_mean(paths[-2]))
    png = client.get("/map.png", params={"target": "t850"})
    assert png.status_code == 200 and png.content[:4] == b"\x89PNG"
    gone = client.get("/forecast/point", params={**POINT, "time": "2017-01-06T00:00"})  # only the bad file covers it
    assert gone.status_code == 404 and "unreadable" in gone.json()["detail"]
    health = client.get("/health").json()
    assert health["status"] == "degraded" and health["forecasts"] == 2
    assert [s["path"] for s in health["skipped"]] == [str(newest.relative_to(tmp_path))]


def test_foreign_file_names_are_skipped_and_the_service_starts(tmp_path, caplog):
    write_forecasts(tmp_path, n=2)
    folder = tmp_path / "postprocessed" / "unet" / "t850"
    shutil.copy(folder / "t850_20170102T00.nc", folder / "t850_latest.nc")  # not a date
    (folder / "t850_20170102T00.nc.tmp-123").write_bytes(b"partial")  # an interrupted write: ignored silently
    client = _client(tmp_path)  # the service starts
    assert client.get("/forecasts", params={"refresh": "true"}).status_code == 200
    assert len(client.get("/forecasts").json()["forecasts"]) == 2
    health = client.get("/health").json()
    assert health["status"] == "degraded" and "t850_latest.nc" in health["skipped"][0]["path"]
    assert "not a forecast file name" in health["skipped"][0]["reason"]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "t850_latest.nc" in warnings[0]  # warned once, not at every rescan


def test_deleted_not_yet_cached_file_is_404_not_500(tmp_path):
    paths = write_forecasts(tmp_path, n=3)
    client = _client(tmp_path)
    paths[1].unlink()  # init 2017-01-03, valid 2017-01-05: listed at start, never loaded
    r = client.get("/forecast/point", params={**POINT, "time": "2017-01-05T00:00"})
    assert r.status_code == 404, r.text
    assert client.get("/forecast/point", params=POINT).status_code == 200
    assert client.get("/health").json()["forecasts"] == 2


def test_zarr_products_are_served_like_netcdf(tmp_path):
    paths = write_forecasts(tmp_path, n=2, formats=("zarr",))
    assert all(p.suffix == ".zarr" and p.is_dir() for p in paths)
    body = _client(tmp_path).get("/forecast/point", params=POINT).json()
    with xr.open_zarr(paths[-1], consolidated=False) as ds:
        expected = float(ds["t850_mean"].isel(forecast_reference_time=0).sel(latitude=45.0, longitude=10.0))
    assert body["init_time"] == "2017-01-03T00:00:00" and body["mean"] == pytest.approx(expected)


def test_map_is_rendered_once_per_file_and_parameters(tmp_path):
    write_forecasts(tmp_path, n=2)
    app = create_app(tmp_path)
    client = TestClient(app)
    first = client.get("/map.png", params={"target": "t850"})
    second = client.get("/map.png", params={"target": "t850"})
    other = client.get("/map.png", params={"target": "t850", "time": "2017-01-04T00:00"})
    assert first.content == second.content and other.content != first.content
    assert app.state.catalog.maps.renders == 2  # the second request was a cache hit
    assert np.frombuffer(first.content[:8], dtype=np.uint8).tolist() == [137, 80, 78, 71, 13, 10, 26, 10]


@pytest.mark.parametrize("resolution", [0.5, 5.0])
def test_grid_locator_agrees_with_argmin_distance(resolution):
    grid = schema.Grid(resolution)
    lat, lon = grid.latitudes(), grid.longitudes()
    find_lat, find_lon = Locator(lat, periodic=False), Locator(lon, periodic=True)
    assert find_lat.regular and find_lon.regular
    rng = np.random.default_rng(3)
    for y, x in zip(rng.uniform(-90, 90, 500), rng.uniform(0, 360, 500), strict=True):
        i, j = find_lat(y), find_lon(x)
        assert abs(lat[i] - y) == pytest.approx(abs(lat[_nearest(lat, y)] - y))  # as near as the argmin (ties aside)
        dj = min(abs(lon[j] - x), 360 - abs(lon[j] - x))
        dk = min(abs(lon[_nearest(lon, x, True)] - x), 360 - abs(lon[_nearest(lon, x, True)] - x))
        assert dj == pytest.approx(dk)
    irregular = Locator(np.array([0.0, 1.0, 5.0]), periodic=False)
    assert not irregular.regular and irregular(3.2) == 2 and irregular(-9.0) == 0


def test_a_model_whose_files_are_unreadable_is_answered_the_same_every_time(tmp_path):
    """A model whose only file cannot be read: the first query answered 404 "no forecast", every later one 422
    "not in the archive" (the file was taken out of the index). Now the same 404 each time, naming the model
    and that its files are unreadable (listed by /health)."""
    write_forecasts(tmp_path, n=2)
    bad = write_forecasts(tmp_path, n=1, model="mlp")[0]
    bad.write_bytes(b"not a netCDF file at all\n" * 10)
    client = _client(tmp_path)
    answers = [client.get("/forecast/point", params={**POINT, "model": "mlp"}) for _ in range(3)]
    assert [a.status_code for a in answers] == [404] * 3, [a.text for a in answers]
    details = {a.json()["detail"] for a in answers}
    assert len(details) == 1, details
    detail = details.pop()
    assert "'mlp'" in detail and "unreadable" in detail and "/health" in detail
    assert client.get("/forecast/point", params={**POINT, "model": "nope"}).status_code == 422  # truly absent
    assert client.get("/forecast/point", params=POINT).status_code == 200  # the readable model


@pytest.mark.parametrize(
    ("box", "says_order"),
    [
        ({"lat_min": 80.2, "lat_max": 80.4, "lon_min": 10.0, "lon_max": 20.0}, False),
        ({"lat_min": 50.0, "lat_max": 40.0, "lon_min": 0, "lon_max": 20}, True),
    ],
)
def test_an_empty_box_says_why_only(tmp_path, box, says_order):
    """A box between grid rows (latitude 80.2..80.4 on a 5 deg grid) was answered "... lat_min must not exceed
    lat_max", which it did not; that advice only when lat_min > lat_max."""
    write_forecasts(tmp_path, n=1)
    r = _client(tmp_path).get("/forecast/bbox", params={"target": "t850", **box})
    assert r.status_code == 404, r.text
    assert ("lat_min must not exceed lat_max" in r.json()["detail"]) == says_order, r.json()["detail"]
