"""Forgetting an endpoint through the admin service: an admin token only; refused (409) while
the endpoint holds work unless forced; never removes a request; names an earlier version took
(e.g. with a leading space) are listed and can be forgotten too."""

from __future__ import annotations

import time

import httpx
import pytest
import redis

from prq import AsyncQueue
from prq.core.keys import KeySchema, encode_endpoint
from tests.redis_servers import async_wait_until

pytestmark = pytest.mark.integration

ROUTE = "/api/endpoint"


def register(client: redis.Redis, key_prefix: str, endpoint: str) -> None:
    """List `endpoint` in the registry as a node's report would (nothing queued for it)."""
    client.zadd(
        KeySchema(key_prefix).endpoints, {encode_endpoint(endpoint): int(time.time() * 1e3)}
    )


def registered(client: redis.Redis, key_prefix: str, endpoint: str) -> bool:
    return client.zscore(KeySchema(key_prefix).endpoints, encode_endpoint(endpoint)) is not None


async def listed(http: httpx.AsyncClient, headers: dict[str, str]) -> list[str]:
    response = await http.get("/api/endpoints", headers=headers)
    assert response.status_code == 200, response.text
    return [info["endpoint"] for info in response.json()]


async def test_an_admin_forgets_an_idle_endpoint_and_a_read_token_cannot(
    http: httpx.AsyncClient,
    admin: dict[str, str],
    read: dict[str, str],
    redis_client: redis.Redis,
    key_prefix: str,
) -> None:
    # Given an idle endpoint made by a typo, listed by the admin service
    typo = "poll://biling-7"
    register(redis_client, key_prefix, typo)
    assert typo in await listed(http, read)

    # When a read token or no token asks to forget it, Then it is refused and stays
    assert (await http.delete(ROUTE, params={"endpoint": typo})).status_code == 401
    refused = await http.delete(ROUTE, params={"endpoint": typo}, headers=read)
    assert refused.status_code == 403 and refused.json()["error"]["type"] == "forbidden"
    assert registered(redis_client, key_prefix, typo)

    # When an admin forgets it, Then it is gone from the list
    response = await http.delete(ROUTE, params={"endpoint": typo}, headers=admin)
    assert response.status_code == 200, response.text
    assert response.json() == {
        "endpoint": typo, "registered": True, "forgotten": True,
        "depth": 0, "in_flight": 0, "receivers": 0,
    }  # fmt: skip
    assert typo not in await listed(http, read)
    assert not registered(redis_client, key_prefix, typo)

    # And forgetting it again, or an endpoint never listed, is 404
    again = await http.delete(ROUTE, params={"endpoint": typo}, headers=admin)
    assert again.status_code == 404 and again.json()["error"]["type"] == "not_found"
    # And a bad name is 422
    bad = await http.delete(ROUTE, params={"endpoint": "a\u200bb"}, headers=admin)
    assert bad.status_code == 422


async def test_an_endpoint_with_queued_work_is_forgotten_only_by_force_and_keeps_its_work(
    http: httpx.AsyncClient,
    admin: dict[str, str],
    sender: AsyncQueue,
    redis_client: redis.Redis,
    key_prefix: str,
) -> None:
    # Given an endpoint with one request queued and no receiver
    endpoint = "poll://forget-busy"
    request_id = await sender.notify(endpoint, "m", {"n": 1})
    await async_wait_until(
        lambda: registered(redis_client, key_prefix, endpoint), 10.0, message="registered"
    )

    # When an admin forgets it without force, Then it is refused (409), and nothing changes
    refused = await http.delete(ROUTE, params={"endpoint": endpoint}, headers=admin)
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"]["type"] == "conflict"
    assert "1 queued" in refused.json()["error"]["message"]
    assert registered(redis_client, key_prefix, endpoint)

    # When forced, Then the registry entry goes, and the request stays queued
    forced = await http.delete(ROUTE, params={"endpoint": endpoint, "force": "true"}, headers=admin)
    assert forced.status_code == 200, forced.text
    assert forced.json()["forgotten"] is True and forced.json()["depth"] == 1
    page = await http.get("/api/queued", params={"endpoint": endpoint}, headers=admin)
    assert page.status_code == 200 and [item["id"] for item in page.json()["items"]] == [request_id]


async def test_a_name_an_earlier_version_took_is_listed_and_can_be_forgotten(
    http: httpx.AsyncClient,
    admin: dict[str, str],
    redis_client: redis.Redis,
    key_prefix: str,
) -> None:
    # Given a name with a leading space, which new work is refused, left in the registry
    old = " poll://old"
    register(redis_client, key_prefix, old)

    # Then the admin views list it (reading old data never fails), and an admin forgets it
    assert old in await listed(http, admin)
    one = await http.get("/api/endpoint", params={"endpoint": old}, headers=admin)
    assert one.status_code == 200 and one.json()["endpoint"] == old
    response = await http.delete(ROUTE, params={"endpoint": old}, headers=admin)
    assert response.status_code == 200 and response.json()["forgotten"] is True
    assert old not in await listed(http, admin)
