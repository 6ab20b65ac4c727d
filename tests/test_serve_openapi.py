"""The OpenAPI document matches every response: schemathesis (v4) generates requests from it, valid and
invalid, sends them to the real service (uvicorn on loopback, token set) and runs its conformance checks
(no 5xx, documented status codes, content types and headers, bodies matching the schemas, invalid data
rejected, auth enforced). Bounded: a few examples per operation, about 20 s in all.
"""

import pytest
import schemathesis
import web
from hypothesis import HealthCheck, settings
from schemathesis.config import SchemathesisConfig

from postcast.serve.testing import running_server, write_forecasts

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ACCEPTED = ["2xx", "3xx", "401", "403", "404", "409", "429", "5xx"]  # schemathesis's default for valid data


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    out = tmp_path_factory.mktemp("forecasts")
    write_forecasts(out, n=2)
    write_forecasts(out, target="z500", n=1, model="mlp")
    with running_server(out, token=TOKEN) as url:
        yield url


@pytest.fixture(scope="module")
def api_schema(served):
    config = SchemathesisConfig.from_dict(
        {
            "auth": {"openapi": {"bearer": {"bearer": TOKEN}}},
            # 422 answers a schema-valid request that breaks a rule the parameter schema cannot state
            # because it depends on another parameter (a negative threshold for tp24, whose values are
            # never below 0); schemathesis's defaults plus 422, nothing else
            "checks": {"positive_data_acceptance": {"expected-statuses": [*ACCEPTED, "422"]}},
        }
    )
    return schemathesis.openapi.from_url(f"{served}/openapi.json", headers=AUTH, config=config)


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
def test_every_response_matches_the_openapi_document(case):
    # the token comes from the config (and is left out on purpose to test 401); validation raises on a
    # response that breaks the document (status, content type, schema) or a server error
    response = case.call_and_validate(timeout=10)
    assert response.status_code < 500, response.text[:300]


def test_the_generated_requests_reached_the_forecasts(served):
    """Runs after the test above: its requests were authorised and answered with data, not just 401s."""
    import re

    text = web.get(f"{served}/metrics", headers=AUTH).text
    for path in ("/forecast/point", "/forecast/bbox", "/map.png", "/forecasts"):
        ok = re.search(rf'postcast_requests_total{{path="{re.escape(path)}",status="200"}} (\d+)', text)
        assert ok and int(ok.group(1)) > 0, path
    assert re.search(r'status="401"} [1-9]', text)  # and some were sent without the token, on purpose
