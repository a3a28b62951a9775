"""The OpenAPI document: behind a token, lists every route with its errors, and the live
service conforms to it (schemathesis: every default check, zero failures)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from tests.api.conftest import Tokens
from tests.api.servers import ApiServer

pytestmark = pytest.mark.integration

#: Every documented operation, and the error statuses it declares.
OPERATIONS: dict[tuple[str, str], set[str]] = {
    ("get", "/health"): {"503"},
    ("get", "/api/whoami"): {"401"},
    ("get", "/api/endpoints"): {"401", "503"},
    ("get", "/api/endpoint"): {"401", "422", "503"},
    ("delete", "/api/endpoint"): {"401", "403", "404", "409", "422", "503"},
    ("get", "/api/queued"): {"401", "422", "503"},
    ("get", "/api/throughput"): {"401"},
    ("get", "/api/endpoint/limits"): {"401", "422", "503"},
    ("put", "/api/endpoint/limits"): {"400", "401", "403", "413", "422", "503"},
    ("get", "/api/dead-letters"): {"401", "422", "503"},
    ("post", "/api/dead-letters/replay"): {"400", "401", "403", "413", "422", "503"},
    ("post", "/api/dead-letters/purge"): {"400", "401", "403", "413", "422", "503"},
    ("get", "/api/requests/{request_id}"): {"401", "404", "422", "503"},
    ("post", "/api/requests/{request_id}/cancel"): {"401", "403", "404", "413", "422", "503"},
    ("get", "/metrics"): {"401", "503"},
}


async def test_the_openapi_document_lists_every_route(
    http: httpx.AsyncClient, tokens: Tokens
) -> None:
    # Given the document (it needs a token like the routes it describes)
    assert (await http.get("/openapi.json")).status_code == 401
    response = await http.get("/openapi.json", headers=tokens.read_header)
    assert response.status_code == 200
    document: dict[str, Any] = response.json()

    # Then it lists exactly the service's operations (no dashboard, no docs UI)
    assert document["openapi"].startswith("3.")
    found = {
        (method, path): operation
        for path, item in document["paths"].items()
        for method, operation in item.items()
    }
    assert set(found) == set(OPERATIONS)
    schemes = document["components"]["securitySchemes"]
    assert schemes["BearerToken"] == {
        "type": "http",
        "scheme": "bearer",
        "description": schemes["BearerToken"]["description"],
    }
    for key, errors in OPERATIONS.items():
        operation = found[key]
        # And each declares its errors, all with the one error body (health: its own body)
        responses = operation["responses"]
        assert errors | {"200"} == set(responses), key
        for status in errors - ({"503"} if key[1] == "/health" else set()):
            schema = responses[status]["content"]["application/json"]["schema"]
            assert schema == {"$ref": "#/components/schemas/ErrorBody"}, (key, status)
        # And every operation but health needs the bearer token
        guarded = operation.get("security") == [{"BearerToken": []}]
        assert guarded == (key[1] != "/health"), key
    assert (await http.get("/docs")).status_code == 404


@pytest.fixture
def api_schema(api: ApiServer, tokens: Tokens) -> Any:
    """The live document, with generation kept deterministic and to ASCII text.

    ASCII: endpoint names must be printable (`str.isprintable`), which the JSON Schema pattern
    can only approximate (it refuses control characters); ASCII text outside the control
    characters is printable, so every generated "valid" name really is valid.
    """
    schema = schemathesis.openapi.from_url(
        f"{api.url}/openapi.json", headers=tokens.admin_header, timeout=10
    )
    # The token as a configured header: schemathesis then never drops or mutates it as
    # "negative data" (a request with a valid token is not one that should be refused).
    schema.config.update(base_url=api.url, headers=tokens.admin_header)
    schema.config.generation.update(codec="ascii", deterministic=True, database="none")
    return schema


live = schemathesis.pytest.from_fixture("api_schema")


@live.parametrize()
@settings(
    max_examples=50,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_the_service_conforms_to_its_openapi_document(case: schemathesis.Case[Any]) -> None:
    # Given any request the document allows (and some it does not), with the admin token
    # When it is sent to the live service
    # Then no check fails: no 5xx, status codes, content types, headers and bodies as
    # documented, invalid input refused, valid input accepted, the token really required
    case.call_and_validate()
