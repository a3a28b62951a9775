"""Every error has one JSON shape; unexpected failures answer 500 without their details."""

from __future__ import annotations

import httpx
import pytest

from prq.core.errors import InvalidEndpoint, PrqError, QueueUnavailable
from tests.api.conftest import MakeApi

pytestmark = pytest.mark.integration


def error_of(response: httpx.Response) -> dict[str, str]:
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"type", "message"}
    error: dict[str, str] = body["error"]
    return error


async def test_unknown_routes_and_methods_answer_in_the_error_shape(
    http: httpx.AsyncClient, admin: dict[str, str]
) -> None:
    missing = await http.get("/api/nothing-here", headers=admin)
    assert missing.status_code == 404 and error_of(missing)["type"] == "not_found"
    wrong = await http.delete("/api/endpoints", headers=admin)
    assert wrong.status_code == 405 and error_of(wrong)["type"] == "method_not_allowed"
    assert wrong.headers["allow"] == "GET"


@pytest.mark.parametrize(
    ("raised", "status", "error_type"),
    [
        (RuntimeError("internal detail: redis://:hunter2@10.0.0.7"), 500, "internal_error"),
        (PrqError("internal detail: redis://:hunter2@10.0.0.7"), 500, "internal_error"),
        (QueueUnavailable("internal detail: redis://:hunter2@10.0.0.7"), 503, "queue_unavailable"),
        (InvalidEndpoint("endpoint must be 1-200 characters, got 0"), 422, "invalid_endpoint"),
    ],
)
async def test_errors_raised_by_a_route_are_mapped_without_leaking(
    make_api: MakeApi,
    admin: dict[str, str],
    raised: Exception,
    status: int,
    error_type: str,
) -> None:
    # Given a service with a route that raises (added for this test only)
    api = make_api()

    async def failing() -> None:
        raise raised

    api.app.add_api_route("/api/failing", failing)
    async with httpx.AsyncClient(base_url=api.url, timeout=15) as http:
        # When it is called
        response = await http.get("/api/failing", headers=admin)
    # Then the status and type say what kind of failure it was, and nothing internal leaks
    assert response.status_code == status, response.text
    error = error_of(response)
    assert error["type"] == error_type
    assert "hunter2" not in response.text and "10.0.0.7" not in response.text
