"""The forecaster's page and what it draws (issue 40): /map.png draws the mean, the spread, any quantile
or an exceedance probability by the file's own family, with coastlines, degree axes, a colour scale
that fits the quantity and the family and units in its title; every answer names its law; the page and
the API docs load nothing from another host.

In-process (the FastAPI app through ``TestClient``); the numbers are checked against scipy on the
parameters read back from the files with xarray, and the coastline against capes' known positions.
"""

from __future__ import annotations

from html.parser import HTMLParser

import numpy as np
import pytest
import xarray as xr
from archive_files import CLIMATE_T2M, INITS, write_archive
from fastapi.testclient import TestClient
from scipy import stats

from postcast.datasets import schema
from postcast.serve.app import create_app

VALID = (INITS[-1] + np.timedelta64(schema.TARGET_STEP_H, "h")).isoformat()


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    return write_archive(tmp_path_factory.mktemp("page_archive"))


@pytest.fixture(scope="module")
def client(archive):
    return TestClient(create_app(archive, watch_s=None), raise_server_exceptions=False)


def _params(archive, target, model):
    """The stored parameters of the latest forecast, read with xarray (not the service's reader)."""
    path = archive / "postprocessed" / model / target / f"{target}_{INITS[-1]:%Y%m%dT%H}.nc"
    with xr.open_dataset(path) as ds:
        one = ds.isel(forecast_reference_time=0).load()
    names = dict(zip(*[iter(one.attrs["predictive_parameters"].replace(":", "").split())] * 2, strict=True))
    return {k: one[v].values.astype(np.float64) for k, v in names.items()}, one


def test_map_png_draws_each_quantity(client):
    """mean, spread, a quantile and a probability are four different pictures; the axes' place is said."""
    pngs = {}
    for show, extra in (("mean", {}), ("spread", {}), ("quantile", {"level": 0.9}), ("probability", {"threshold": 1})):
        r = client.get("/map.png", params={"target": "tp24", "model": "emos_csg", "show": show, **extra})
        assert r.status_code == 200 and r.content[:8] == b"\x89PNG\r\n\x1a\n", (show, r.text[:200])
        pngs[show] = r.content
        assert next(float(v) for v in r.headers["X-Map-Axes"].split(",")) > 0
        west, east, south, north = (float(v) for v in r.headers["X-Map-Extent"].split(","))
        assert west < -170 and east > 170 and south >= -90 and north <= 90
    assert len(set(pngs.values())) == 4
    first = client.get("/map.png", params={"target": "tp24", "model": "emos_csg", "show": "probability"})
    assert first.content == pngs["probability"]  # without threshold=: the file's first (1 mm)


@pytest.mark.parametrize(
    ("params", "says"),
    [
        ({"show": "median"}, "show"),
        ({"show": "quantile", "level": 1.2}, "level"),
    ],
)
def test_map_png_refuses_a_bad_choice(client, params, says):
    r = client.get("/map.png", params={"target": "t2m", **params})
    assert r.status_code == 422 and says in r.json()["detail"]


def _figure(client, archive, target, model, shown):
    from postcast.serve import rendering

    catalog = client.app.state.catalog
    entry, s = catalog.resolve(target, model, None)
    return rendering.figure(entry, s.field, shown)


def test_the_map_has_coastlines_axes_a_fitting_scale_and_names_its_law(client, archive):
    from postcast.pipeline.products import maps
    from postcast.serve.rendering import Shown

    fig = _figure(client, archive, "tp24", "emos_csg", Shown("probability", None, 10.0))
    ax = fig.axes[0]
    coast = [a for a in ax.get_lines() if a.get_gid() == maps.COASTLINE_GID]
    assert coast and np.isfinite(coast[0].get_xdata()).sum() > 4000
    assert "longitude" in ax.get_xlabel() and "latitude" in ax.get_ylabel()
    assert "csg law" in ax.get_title() and "probability of exceeding 10 mm" in ax.get_title()
    image = ax.get_images()[0]
    assert image.get_cmap().name == "YlGnBu" and image.get_clim() == (0.0, 1.0)  # sequential, 0..1
    t2m = _figure(client, archive, "t2m", "unet", Shown()).axes[0]
    assert t2m.get_images()[0].get_cmap().name not in ("RdBu", "RdBu_r", "RdYlBu_r")  # K is no anomaly
    assert "(K)" in t2m.get_title() and "gaussian law" in t2m.get_title()
    wind = _figure(client, archive, "ws10", None, Shown()).axes[0].get_images()[0]
    assert wind.get_cmap().name == "viridis" and wind.get_clim()[0] == 0.0  # a speed from zero


@pytest.mark.parametrize(
    ("lon", "lat", "name"),
    [
        (-5.6, 36.0, "Gibraltar"),
        (18.47, -34.36, "Cape of Good Hope"),
        (-67.27, -55.98, "Cape Horn"),
        (142.5, -10.7, "Cape York"),
    ],
)
def test_the_coastline_passes_known_capes(lon, lat, name):
    from postcast.pipeline.products import maps

    for lon_min in (-180.0, 0.0):
        x, y = maps.coastline(lon_min)
        ok = np.isfinite(x)
        assert x[ok].min() >= lon_min and x[ok].max() < lon_min + 360
        dx = (x[ok] - lon + 180.0) % 360.0 - 180.0
        assert np.hypot(dx, y[ok] - lat).min() < 1.5, name  # within the 1:110m outline's accuracy
        steps = np.abs(np.diff(x))
        assert np.nanmax(steps) < 180.0  # no line across the whole map


def test_map_quantities_follow_the_files_law(client, archive):
    """Quantiles and exceedance probabilities drawn are the family's own: scipy on the stored parameters."""
    from postcast.serve import law

    catalog = client.app.state.catalog
    p, _ = _params(archive, "t2m", "unet")
    f = catalog.resolve("t2m", "unet", None)[1].field
    np.testing.assert_allclose(
        law.quantity(f, "quantile", 0.9, None), stats.norm.ppf(0.9, p["mu"], p["sigma"]), rtol=1e-9
    )
    np.testing.assert_allclose(
        law.quantity(f, "probability", None, 270.0), stats.norm.sf(270.0, p["mu"], p["sigma"]), atol=1e-12
    )
    p, _ = _params(archive, "tp24", "emos_csg")
    f = catalog.resolve("tp24", "emos_csg", None)[1].field
    want = stats.gamma.sf(5.0 + p["shift"], p["shape"], scale=p["scale"])  # P(max(0, X - shift) > 5)
    np.testing.assert_allclose(law.quantity(f, "probability", None, 5.0), want, rtol=1e-7, atol=1e-12)


def test_every_answer_names_its_law(client, archive):
    point = {"lat": 10.0, "lon": 20.0}
    gauss_rain = client.get("/forecast/point", params={"target": "tp24", "model": "emos_gaussian_tp24", **point}).json()
    assert gauss_rain["law"]["family"] == "gaussian" and gauss_rain["law"]["units"] == "mm"
    _, one = _params(archive, "tp24", "emos_gaussian_tp24")
    share = float((one["tp24_quantile"].sel(quantile=0.05) < 0).mean())  # read back with xarray
    assert share > 0 and f"below 0 at {100 * share:.0f} % of points" in gauss_rain["law"]["note"]
    assert "negative" in gauss_rain["law"]["note"]
    assert gauss_rain["law"]["thresholds"]["source"] == "target"
    csg = client.get("/forecast/point", params={"target": "tp24", "model": "emos_csg", **point}).json()
    assert csg["law"]["family"] == "csg" and csg["law"]["note"] is None and "gamma" in csg["law"]["definition"].lower()
    t2m = client.get("/forecast/point", params={"target": "t2m", **point}).json()
    assert [float(k) for k in t2m["exceedance"]] == list(CLIMATE_T2M)
    assert t2m["law"]["thresholds"]["source"] == "training_climate" and "10/50/90 %" in t2m["law"]["thresholds"]["says"]
    box = client.get(
        "/forecast/bbox", params={"target": "ws10", "lat_min": 0, "lat_max": 20, "lon_min": 0, "lon_max": 20}
    ).json()
    assert box["law"]["family"] == "truncnormal" and box["law"]["units"] == "m s**-1"
    listing = client.get("/forecasts").json()["targets"]
    units = {t["target"]: t["units"] for t in listing}
    assert units == {"t2m": "K", "ws10": "m s**-1", "tp24": "mm"} and all("CRPS" in t["score"] for t in listing)


def test_a_point_answer_carries_the_raw_members_beside_the_law(client, archive):
    """Issue 40 item 1: the raw members at the point (what the law is to be compared with), as the file
    stores them (read back with xarray); JSON without NaN."""
    a = client.get("/forecast/point", params={"target": "tp24", "model": "emos_csg", "lat": 10.0, "lon": 20.0}).json()
    _, one = _params(archive, "tp24", "emos_csg")
    want = one["tp24_raw_member"].sel(latitude=10.0, longitude=20.0).values
    assert a["members"] == pytest.approx(want.tolist()) and len(a["members"]) == 10
    assert one["realization"].attrs["standard_name"] == "realization"


def test_the_law_of_a_forecast_and_the_default_model(client):
    r = client.get("/forecast/law", params={"target": "t2m"}).json()
    assert r["model"] == "unet"  # the lowest CRPS in metrics.json (0.95 < 1.10)
    assert r["lead_h"] == schema.TARGET_STEP_H and r["valid_time"] == VALID
    assert r["thresholds"] == list(CLIMATE_T2M) and 0.5 in r["quantile_levels"]


class _Refs(HTMLParser):
    """Every src and href of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.refs += [v for k, v in attrs if k in ("src", "href") and v]


def _refs(text):
    parser = _Refs()
    parser.feed(text)
    return parser.refs


@pytest.mark.parametrize("path", ["/", "/docs", "/redoc"])
def test_the_page_and_the_docs_load_only_local_assets(client, path):
    r = client.get(path)
    assert r.status_code == 200 and "text/html" in r.headers["content-type"]
    refs = [u for u in _refs(r.text) if not u.startswith(("data:", "#"))]
    assert refs and all(u.startswith("/") and not u.startswith("//") for u in refs), refs
    for url in refs:
        assert client.get(url).status_code == 200, url
    assert "cdn" not in r.text.lower() and "fonts.googleapis" not in r.text
    if path == "/docs":
        assert '"validatorUrl": null' in r.text  # Swagger UI's online validator badge is off
