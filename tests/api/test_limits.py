"""Per-endpoint capacity limits through the admin service: read with any token, replaced with an
admin token only, validated strictly, and shown in the endpoint listing and in `/metrics`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis

from prq import AsyncQueue, Request, RequestState
from prq.core.keys import KeySchema
from tests.api.test_metrics import gauge, scrape
from tests.queue_facades import wait_for_state
from tests.redis_servers import async_wait_until, scan_keys

pytestmark = pytest.mark.integration

ENDPOINT = "poll://limits-1"
ROUTE = "/api/endpoint/limits"


def limits_key(key_prefix: str, endpoint: str) -> str:
    return KeySchema(key_prefix).endpoint(endpoint).limits


def stored(client: redis.Redis, key_prefix: str, endpoint: str = ENDPOINT) -> dict[str, str]:
    """The limits hash as Redis holds it, decoded."""
    raw: dict[bytes, bytes] = client.hgetall(limits_key(key_prefix, endpoint))  # type: ignore[assignment]
    return {k.decode(): v.decode() for k, v in raw.items()}


@contextlib.asynccontextmanager
async def queued_request(sender: AsyncQueue, endpoint: str) -> AsyncIterator[None]:
    """A caller waiting on one request queued on `endpoint` (so nodes report the endpoint)."""
    request = Request(endpoint=endpoint, method="m")
    call = asyncio.create_task(sender.queue_and_wait(request))
    try:
        await wait_for_state(sender, request.id, RequestState.QUEUED)
        yield
    finally:
        call.cancel()
        await asyncio.wait_for(asyncio.gather(call, return_exceptions=True), 10)


async def test_a_read_token_reads_the_limits_but_cannot_change_them(
    http: httpx.AsyncClient,
    read: dict[str, str],
    redis_client: redis.Redis,
    key_prefix: str,
) -> None:
    # Given an endpoint without limits
    # When a read-only token asks for its limits, Then they are both null
    response = await http.get(ROUTE, params={"endpoint": ENDPOINT}, headers=read)
    assert response.status_code == 200, response.text
    assert response.json() == {"endpoint": ENDPOINT, "max_in_flight": None, "max_pending": None}

    # When it tries to set them, Then it is refused with 403 and Redis holds nothing
    refused = await http.put(
        ROUTE, params={"endpoint": ENDPOINT}, json={"max_in_flight": 3}, headers=read
    )
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"]["type"] == "forbidden"
    assert stored(redis_client, key_prefix) == {}


async def test_no_token_can_neither_read_nor_change_the_limits(
    http: httpx.AsyncClient, redis_client: redis.Redis, key_prefix: str
) -> None:
    assert (await http.get(ROUTE, params={"endpoint": ENDPOINT})).status_code == 401
    put = await http.put(ROUTE, params={"endpoint": ENDPOINT}, json={"max_in_flight": 3})
    assert put.status_code == 401, put.text
    assert stored(redis_client, key_prefix) == {}


async def test_an_admin_replaces_the_limits_and_every_read_shows_them(
    http: httpx.AsyncClient,
    admin: dict[str, str],
    read: dict[str, str],
    redis_client: redis.Redis,
    key_prefix: str,
) -> None:
    params = {"endpoint": ENDPOINT}

    # When an admin sets both limits
    response = await http.put(
        ROUTE, params=params, json={"max_in_flight": 3, "max_pending": 100}, headers=admin
    )

    # Then the answer, a read with the read token, and Redis all hold them
    expected = {"endpoint": ENDPOINT, "max_in_flight": 3, "max_pending": 100}
    assert response.status_code == 200, response.text
    assert response.json() == expected
    assert (await http.get(ROUTE, params=params, headers=read)).json() == expected
    assert stored(redis_client, key_prefix) == {"mif": "3", "mp": "100"}

    # When only max_pending is given, Then max_in_flight is removed (PUT replaces both)
    replaced = await http.put(ROUTE, params=params, json={"max_pending": 5}, headers=admin)
    assert replaced.json() == {"endpoint": ENDPOINT, "max_in_flight": None, "max_pending": 5}
    assert stored(redis_client, key_prefix) == {"mp": "5"}

    # When both are null (or left out), Then the endpoint has no limits and no limits hash
    cleared = await http.put(
        ROUTE, params=params, json={"max_in_flight": None, "max_pending": None}, headers=admin
    )
    assert cleared.json() == {"endpoint": ENDPOINT, "max_in_flight": None, "max_pending": None}
    assert redis_client.exists(limits_key(key_prefix, ENDPOINT)) == 0
    await http.put(ROUTE, params=params, json={"max_in_flight": 1}, headers=admin)
    assert (await http.put(ROUTE, params=params, json={}, headers=admin)).status_code == 200
    assert redis_client.exists(limits_key(key_prefix, ENDPOINT)) == 0


@pytest.mark.parametrize(
    "body",
    [
        {"max_in_flight": 0},
        {"max_in_flight": -1},
        {"max_pending": 0},
        {"max_pending": -1},
        {"max_in_flight": "3"},
        {"max_pending": "many"},
        {"max_in_flight": 2.5},
        {"max_in_flight": True},
        {"max_in_flight": 2**53 + 1},
        {"max_in_flight": 3, "max_inflight": 4},
        {"extra": 1},
        [3, 4],
        "3",
    ],
)
async def test_invalid_limits_are_422_and_change_nothing(
    http: httpx.AsyncClient,
    admin: dict[str, str],
    redis_client: redis.Redis,
    key_prefix: str,
    body: Any,
) -> None:
    # Given an endpoint with a limit
    params = {"endpoint": ENDPOINT}
    await http.put(ROUTE, params=params, json={"max_in_flight": 7}, headers=admin)

    # When an admin sends limits that are not positive JSON integers, or unknown fields
    response = await http.put(ROUTE, params=params, json=body, headers=admin)

    # Then they are refused with 422, naming the field, not echoing the value
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["type"] == "validation_error" and error["message"].startswith("body")
    assert "many" not in error["message"]
    # And the limit set before is still there
    assert stored(redis_client, key_prefix) == {"mif": "7"}


async def test_a_put_without_a_json_body_is_422(
    http: httpx.AsyncClient, admin: dict[str, str]
) -> None:
    params = {"endpoint": ENDPOINT}
    for content in (b"", b"{not json", b"null"):
        response = await http.put(
            ROUTE,
            params=params,
            content=content,
            headers={**admin, "Content-Type": "application/json"},
        )
        assert response.status_code == 422, (content, response.text)
        assert response.json()["error"]["type"] == "validation_error"


@pytest.mark.parametrize(
    "endpoint",
    ["", "x" * 201, "poll://bell\x07", "poll://new\nline", "poll://zero\u200bwidth"],
)
async def test_invalid_endpoint_names_are_422(
    http: httpx.AsyncClient,
    admin: dict[str, str],
    redis_client: redis.Redis,
    key_prefix: str,
    endpoint: str,
) -> None:
    # When an endpoint name that is not 1-200 printable characters is read or limited
    responses = [
        await http.get(ROUTE, params={"endpoint": endpoint}, headers=admin),
        await http.put(
            ROUTE, params={"endpoint": endpoint}, json={"max_in_flight": 3}, headers=admin
        ),
    ]
    # Then both are refused with 422 in the one error shape, and nothing is written
    for response in responses:
        assert response.status_code == 422, response.text
        assert response.json()["error"]["type"] in ("validation_error", "invalid_endpoint")
    assert [k for k in scan_keys(redis_client, key_prefix) if b"lim" in k] == []


async def test_a_missing_or_unknown_query_parameter_is_422(
    http: httpx.AsyncClient, admin: dict[str, str]
) -> None:
    for params in ({}, {"endpoint": ENDPOINT, "other": "x"}):
        for response in (
            await http.get(ROUTE, params=params, headers=admin),
            await http.put(ROUTE, params=params, json={"max_pending": 2}, headers=admin),
        ):
            assert response.status_code == 422, response.text


@pytest.mark.parametrize(
    "endpoint", ['poll://<b>&"x"</b>', "poll://a*b?[c]", "poll://{tag}:x", "poll://ünï/código"]
)
async def test_hostile_but_valid_names_are_limited_under_their_own_key(
    http: httpx.AsyncClient,
    admin: dict[str, str],
    redis_client: redis.Redis,
    key_prefix: str,
    endpoint: str,
) -> None:
    # When an admin limits an endpoint whose name holds markup, globs, braces or unicode
    response = await http.put(
        ROUTE, params={"endpoint": endpoint}, json={"max_pending": 9}, headers=admin
    )
    # Then the name comes back as given, and only that endpoint's limits key holds the limit
    assert response.status_code == 200, response.text
    assert response.json() == {"endpoint": endpoint, "max_in_flight": None, "max_pending": 9}
    assert stored(redis_client, key_prefix, endpoint) == {"mp": "9"}
    keys = scan_keys(redis_client, key_prefix)
    assert [k.decode() for k in keys if k.endswith(b":lim")] == [limits_key(key_prefix, endpoint)]
    read_back = await http.get(ROUTE, params={"endpoint": endpoint}, headers=admin)
    assert read_back.json()["max_pending"] == 9


async def test_the_endpoint_listing_and_metrics_show_the_limits(
    http: httpx.AsyncClient,
    admin: dict[str, str],
    read: dict[str, str],
    sender: AsyncQueue,
) -> None:
    other = "poll://limits-none"
    # Given a listed endpoint with max_in_flight only, and one without limits
    async with queued_request(sender, ENDPOINT), queued_request(sender, other):
        put = await http.put(
            ROUTE, params={"endpoint": ENDPOINT}, json={"max_in_flight": 4}, headers=admin
        )
        assert put.status_code == 200, put.text

        # When the endpoints are listed (nodes report them every 0.2 s)
        async def both_listed() -> dict[str, Any] | None:
            infos = (await http.get("/api/endpoints", headers=read)).json()
            found = {i["endpoint"]: i for i in infos}
            return found if {ENDPOINT, other} <= set(found) else None

        listed = await async_wait_until(both_listed, 10, 0.05, "both endpoints listed")

        # Then each shows its limits (null: none), as does the one-endpoint view
        assert (listed[ENDPOINT]["max_in_flight"], listed[ENDPOINT]["max_pending"]) == (4, None)
        assert (listed[other]["max_in_flight"], listed[other]["max_pending"]) == (None, None)
        one = (await http.get("/api/endpoint", params={"endpoint": ENDPOINT}, headers=read)).json()
        assert (one["max_in_flight"], one["max_pending"]) == (4, None)

        # And /metrics has a gauge for each limit that is set, and none for those that are not
        families = await scrape(http, read)
        assert gauge(families, "prq_endpoint_max_in_flight", ENDPOINT) == 4
        assert gauge(families, "prq_endpoint_max_pending", ENDPOINT) is None
        assert gauge(families, "prq_endpoint_max_in_flight", other) is None
        assert gauge(families, "prq_endpoint_max_pending", other) is None
        assert gauge(families, "prq_endpoint_depth", other) == 1

        # When the limits change, Then the next scrape follows
        await http.put(
            ROUTE, params={"endpoint": ENDPOINT}, json={"max_pending": 50}, headers=admin
        )
        families = await scrape(http, read)
        assert gauge(families, "prq_endpoint_max_in_flight", ENDPOINT) is None
        assert gauge(families, "prq_endpoint_max_pending", ENDPOINT) == 50


@pytest.mark.parametrize("value", ["abc", "0", "-2", "2.5", " 3", "9" * 30])
async def test_a_malformed_stored_limit_shows_as_none_with_a_warning(
    http: httpx.AsyncClient,
    read: dict[str, str],
    sender: AsyncQueue,
    redis_client: redis.Redis,
    key_prefix: str,
    caplog: pytest.LogCaptureFixture,
    value: str,
) -> None:
    # Given a listed endpoint whose limits hash someone else wrote: one bad value, one good
    caplog.set_level(logging.WARNING, logger="prq.ops.endpoint_view")
    redis_client.hset(limits_key(key_prefix, ENDPOINT), mapping={"mif": value, "mp": "8"})
    async with queued_request(sender, ENDPOINT):

        async def listed() -> dict[str, Any] | None:
            response = await http.get("/api/endpoints", headers=read)
            assert response.status_code == 200, response.text
            return next((i for i in response.json() if i["endpoint"] == ENDPOINT), None)

        # When it is listed, read and scraped
        info = await async_wait_until(listed, 10, 0.05, "endpoint listed")
        one = await http.get(ROUTE, params={"endpoint": ENDPOINT}, headers=read)
        families = await scrape(http, read)

    # Then nothing fails: the bad value shows as no limit, the good one as it is
    assert (info["max_in_flight"], info["max_pending"]) == (None, 8)
    assert one.status_code == 200, one.text
    assert one.json() == {"endpoint": ENDPOINT, "max_in_flight": None, "max_pending": 8}
    assert gauge(families, "prq_endpoint_max_in_flight", ENDPOINT) is None
    assert gauge(families, "prq_endpoint_max_pending", ENDPOINT) == 8
    # And the operator is told, with the endpoint and the field
    warnings = [r.getMessage() for r in caplog.records if "malformed stored limit" in r.msg]
    assert warnings and all("max_in_flight" in w and ENDPOINT in w for w in warnings)


async def test_other_methods_are_405_naming_both_methods_of_the_path(
    http: httpx.AsyncClient, admin: dict[str, str]
) -> None:
    for method in ("DELETE", "POST", "PATCH"):
        response = await http.request(method, ROUTE, params={"endpoint": ENDPOINT}, headers=admin)
        assert response.status_code == 405, response.text
        assert response.headers["allow"] == "GET, PUT"
        assert response.json()["error"]["type"] == "method_not_allowed"


async def test_a_body_that_is_not_text_is_400(
    http: httpx.AsyncClient, admin: dict[str, str], redis_client: redis.Redis, key_prefix: str
) -> None:
    response = await http.put(
        ROUTE,
        params={"endpoint": ENDPOINT},
        content=b"\xff\xfe\x00",
        headers={**admin, "Content-Type": "application/json"},
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["type"] == "bad_request"
    assert stored(redis_client, key_prefix) == {}


async def test_an_integral_json_number_is_an_integer_limit(
    http: httpx.AsyncClient, admin: dict[str, str]
) -> None:
    # JSON Schema's "integer" includes 3.0 (schemathesis sends such numbers); 2.5 stays refused
    params = {"endpoint": ENDPOINT}
    done = await http.put(ROUTE, params=params, json={"max_in_flight": 3.0}, headers=admin)
    assert done.status_code == 200, done.text
    assert done.json()["max_in_flight"] == 3
