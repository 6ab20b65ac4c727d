"""Every model of the archive is served (issue 31.7): ``model=`` on the queries, a default model per
target (the best-verified one: the lowest area-weighted CRPS in evaluate's ``metrics.json``), the
models in ``/forecasts`` and in the OpenAPI document; and ``/health`` shows no server path unless the
token comes with it (issue 29.8).

A real server on loopback over forecasts written by the archive's writer, scored by evaluate's own code
on the synthetic store; the archive sits where ``postcast run`` puts it (``WORKDIR/forecasts``, the
scores in ``WORKDIR/report/metrics.json``).
"""

import json

import pytest
import web
from fastapi.testclient import TestClient

from postcast.datasets import contract, schema
from postcast.pipeline.verify import evaluate, forecasts
from postcast.serve.app import create_app
from postcast.serve.testing import running_server, write_forecasts

TARGET = "t2m"
GOOD, BAD = "zeta_good", "alpha_bad"  # the better model is neither first by name nor written last
POINT = {"target": TARGET, "lat": 45.0, "lon": 10.0}
TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def summary(store):
    """evaluate's summary of two forecasts of t2m on the test split: GOOD is the raw-ensemble Gaussian,
    BAD the same shifted by 10 K (so its CRPS is clearly worse)."""
    ds = contract.open_store(store).load()
    ver = forecasts.verification_dataset(ds, schema.target(TARGET), "test")
    mu, sigma = ver["mu"].sel(forecast="raw").values, ver["sigma"].sel(forecast="raw").values
    ver = forecasts.add_forecast(forecasts.add_forecast(ver, GOOD, mu, sigma), BAD, mu + 10.0, sigma)
    return {"split": "test", "targets": {TARGET: evaluate.score(ver, evaluate.efi_fields(ds, ver), bootstrap=20)}}


def _archive(work, summary=None):
    """``work/forecasts`` with both models of TARGET (GOOD written first, BAD last) and, if given, the
    scores in ``work/report/metrics.json``."""
    root = work / "forecasts"
    write_forecasts(root, target=TARGET, n=2, model=GOOD, seed=1)
    write_forecasts(root, target=TARGET, n=2, model=BAD, seed=2)
    if summary is not None:
        (work / "report").mkdir(parents=True)
        (work / "report" / "metrics.json").write_text(json.dumps(summary))
    return root


@pytest.fixture(scope="module")
def server(tmp_path_factory, summary):
    root = _archive(tmp_path_factory.mktemp("work"), summary)
    with running_server(root, token=TOKEN) as url:
        yield url


def _crps(summary, model):
    return summary["targets"][TARGET]["forecasts"][model]["global"]["crps_weighted"]


def test_each_model_is_reachable_and_the_default_is_the_best_verified(server, summary):
    assert _crps(summary, GOOD) < _crps(summary, BAD)  # the scores the service must read
    answers = {}
    queries = {
        "/forecast/point": POINT,
        "/forecast/bbox": {"target": TARGET, "lat_min": 40, "lat_max": 50, "lon_min": 0, "lon_max": 10},
    }
    for model in (GOOD, BAD):
        for path, query in queries.items():
            r = web.get(f"{server}{path}", params={**query, "model": model}, headers=AUTH)
            assert r.status_code == 200, r.text
            assert r.json()["model"] == model
            answers[(path, model)] = r.json()["mean"]
        png = web.get(f"{server}/map.png", params={"target": TARGET, "model": model}, headers=AUTH)
        assert png.status_code == 200 and png.content[:4] == b"\x89PNG"
    assert answers[("/forecast/point", GOOD)] != answers[("/forecast/point", BAD)]
    assert answers[("/forecast/bbox", GOOD)] != answers[("/forecast/bbox", BAD)]

    listing = web.get(f"{server}/forecasts", headers=AUTH).json()
    (entry,) = [t for t in listing["targets"] if t["target"] == TARGET]
    assert entry["default_model"] == GOOD and "metrics.json" in entry["chosen_by"]
    assert {m["model"]: m["crps"] for m in entry["models"]} == pytest.approx(
        {GOOD: _crps(summary, GOOD), BAD: _crps(summary, BAD)}
    )
    assert {f["model"] for f in listing["forecasts"]} == {GOOD, BAD}
    default = web.get(f"{server}/forecast/point", params=POINT, headers=AUTH).json()
    assert default["model"] == entry["default_model"] and default["mean"] == answers[("/forecast/point", GOOD)]


def test_the_openapi_document_enumerates_the_models(server):
    doc = web.get(f"{server}/openapi.json", headers=AUTH).json()
    for path in ("/forecast/point", "/forecast/bbox", "/map.png"):
        param = next(p for p in doc["paths"][path]["get"]["parameters"] if p["name"] == "model")
        schemas = [param["schema"], *param["schema"].get("anyOf", [])]
        assert any(s.get("enum") == sorted([GOOD, BAD]) for s in schemas), (path, param)


@pytest.mark.parametrize(("model", "status"), [("unet", 422), ("", 422)])
def test_an_unknown_model_is_refused_naming_the_available_ones(server, model, status):
    r = web.get(f"{server}/forecast/point", params={**POINT, "model": model}, headers=AUTH)
    assert r.status_code == status and GOOD in r.json()["detail"] and BAD in r.json()["detail"], r.text


def test_a_model_without_that_target_is_404_naming_the_targets_models(tmp_path):
    root = _archive(tmp_path)
    write_forecasts(root, target="t850", n=1, model="unet")
    client = TestClient(create_app(root), raise_server_exceptions=False)
    r = client.get("/forecast/point", params={**POINT, "model": "unet"})
    assert r.status_code == 404 and BAD in r.json()["detail"] and GOOD in r.json()["detail"], r.text
    assert client.get("/forecast/point", params={**POINT, "target": "t850", "model": "unet"}).status_code == 200


def test_without_scores_the_default_follows_the_documented_rule(tmp_path):
    """No metrics.json: the first model by name, said so in /forecasts, and answering without model=."""
    client = TestClient(create_app(_archive(tmp_path)), raise_server_exceptions=False)
    (entry,) = client.get("/forecasts").json()["targets"]
    assert entry["default_model"] == BAD and "first by name" in entry["chosen_by"]
    assert [m["crps"] for m in entry["models"]] == [None, None]
    assert client.get("/forecast/point", params=POINT).json()["model"] == BAD


def test_health_shows_no_server_path_without_the_token(server, tmp_path_factory):
    """/health is open to probes: it said where the archive lives through the unreadable files' reasons.
    Without the token it shows counts and names; with it, the details."""
    root = _archive(tmp_path_factory.mktemp("work"))
    newest = sorted(root.rglob(f"{TARGET}_20170103T00.nc"))  # one per model
    for path in newest:
        path.write_bytes(b"not a netCDF file\n" * 10)
    (root / "postprocessed" / GOOD / TARGET / "t2m_latest.nc").write_bytes(b"foreign")
    with running_server(root, token=TOKEN) as url:
        for model in (GOOD, BAD):  # each reads its newest file, finds it unreadable and answers from the one before
            r = web.get(f"{url}/forecast/point", params={**POINT, "model": model}, headers=AUTH)
            assert r.status_code == 200 and r.json()["init_time"] == "2017-01-02T00:00:00", r.text
        body = web.get(f"{url}/health").text
        assert str(root) not in body and str(tmp_path_factory.getbasetemp()) not in body, body
        health = json.loads(body)
        assert health["status"] == "degraded" and len(health["skipped"]) == 3
        assert {s["path"] for s in health["skipped"]} >= {str(p.relative_to(root)) for p in newest}
        full = web.get(f"{url}/health", headers=AUTH).json()
        assert full["archive"] == str(root) and any("unreadable" in s["reason"] for s in full["skipped"])


def _model_enum(client):
    params = client.get("/openapi.json").json()["paths"]["/forecast/point"]["get"]["parameters"]
    return next(p for p in params if p["name"] == "model")["schema"]["enum"]


def test_the_model_enum_follows_the_archive(tmp_path):
    root = _archive(tmp_path)
    client = TestClient(create_app(root, watch_s=0.0), raise_server_exceptions=False)
    assert _model_enum(client) == [BAD, GOOD]
    write_forecasts(root, target="t850", n=1, model="unet")  # a new model appears
    assert _model_enum(client) == [BAD, "unet", GOOD]


def test_scores_in_the_archive_are_read_and_a_broken_file_is_skipped(tmp_path, summary):
    """``ROOT/metrics.json`` (evaluate's summary copied into the archive) is read as well; one that is not
    evaluate's is listed under /health, named but not placed, and the default falls back to the rule."""
    root = _archive(tmp_path)
    (root / "metrics.json").write_text("{not json")
    client = TestClient(create_app(root, watch_s=0.0), raise_server_exceptions=False)
    health = client.get("/health").json()
    assert health["status"] == "degraded" and health["skipped"][0]["path"] == "metrics.json"
    assert str(tmp_path) not in json.dumps(health)
    assert client.get("/forecast/point", params=POINT).json()["model"] == BAD
    (root / "metrics.json").write_text(json.dumps(summary))
    (entry,) = client.get("/forecasts").json()["targets"]
    assert entry["default_model"] == GOOD and entry["chosen_by"].endswith(" metrics.json")
    assert client.get("/health").json()["status"] == "ok"
