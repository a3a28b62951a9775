"""Endpoints, queued requests, request status and cancel, against requests really queued (or
picked up) by other prq nodes on the same Redis."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from prq import (
    AsyncQueue,
    CancelledAfterPickup,
    CancelledBeforePickup,
    Request,
    RequestState,
    Response,
)
from tests.api.conftest import QUEUE_SETTINGS
from tests.queue_facades import wait_for_state
from tests.redis_servers import async_wait_until

pytestmark = pytest.mark.integration

ENDPOINT = "poll://billing-7"


@contextlib.asynccontextmanager
async def waiting_calls(
    sender: AsyncQueue, requests: list[Request]
) -> AsyncIterator[list[asyncio.Task[Response]]]:
    """Callers waiting on `requests` (queued once this enters); cancelled, bounded, on exit."""
    calls = [asyncio.create_task(sender.queue_and_wait(r)) for r in requests]
    try:
        for request in requests:
            await wait_for_state(sender, request.id, RequestState.QUEUED)
        yield calls
    finally:
        for call in calls:
            call.cancel()
        await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 10)


async def listed(http: httpx.AsyncClient, headers: dict[str, str], depth: int) -> Any:
    """Wait until /api/endpoints shows ENDPOINT with `depth` (nodes report every 0.2 s)."""

    async def check() -> Any:
        infos = (await http.get("/api/endpoints", headers=headers)).json()
        return next((i for i in infos if i["endpoint"] == ENDPOINT and i["depth"] == depth), None)

    return await async_wait_until(check, 10, 0.05, f"{ENDPOINT} listed with depth {depth}")


async def test_endpoints_and_queued_requests_are_listed(
    http: httpx.AsyncClient, read: dict[str, str], sender: AsyncQueue
) -> None:
    # Given three requests queued on one endpoint by another node, nobody serving it
    requests = [
        Request(endpoint=ENDPOINT, method=f"charge{i}", params={"n": i}, priority=0)
        for i in range(3)
    ]
    async with waiting_calls(sender, requests):
        # When the endpoints are listed
        info = await listed(http, read, depth=3)

        # Then the endpoint shows its depth, nothing in flight, and its oldest request's age
        assert info["in_flight"] == 0 and info["receivers"] == 0
        assert info["oldest_age_s"] is not None and info["oldest_age_s"] >= 0
        assert info["enqueued_total"] >= 3 and info["last_seen_ms"] > 0
        one = (await http.get("/api/endpoint", params={"endpoint": ENDPOINT}, headers=read)).json()
        assert (one["endpoint"], one["depth"]) == (ENDPOINT, 3)

        # And its queued requests page in pickup order, without their parameters
        first = await http.get(
            "/api/queued", params={"endpoint": ENDPOINT, "limit": 2}, headers=read
        )
        rest = await http.get(
            "/api/queued", params={"endpoint": ENDPOINT, "offset": 2}, headers=read
        )
        assert first.status_code == 200, first.text
        page, tail = first.json(), rest.json()
        assert (page["total"], page["offset"], page["limit"]) == (3, 0, 2)
        ids = [item["id"] for item in page["items"] + tail["items"]]
        assert ids == [r.id for r in requests]
        assert [item["method"] for item in page["items"]] == ["charge0", "charge1"]
        assert all(item["body_bytes"] > 0 and "params" not in item for item in page["items"])

        # And each request's status is "queued" on that endpoint
        status = (await http.get(f"/api/requests/{requests[0].id}", headers=read)).json()
        assert (status["state"], status["endpoint"]) == ("queued", ENDPOINT)


async def test_an_endpoint_nobody_used_is_all_zero(
    http: httpx.AsyncClient, read: dict[str, str]
) -> None:
    response = await http.get("/api/endpoint", params={"endpoint": "poll://nobody"}, headers=read)
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["depth"], body["in_flight"], body["oldest_age_s"]) == (0, 0, None)
    page = await http.get("/api/queued", params={"endpoint": "poll://nobody"}, headers=read)
    assert page.json()["total"] == 0 and page.json()["items"] == []


async def test_cancel_before_pickup_withdraws_and_fails_the_caller(
    http: httpx.AsyncClient, admin: dict[str, str], read: dict[str, str], sender: AsyncQueue
) -> None:
    # Given a caller waiting on a queued request
    request = Request(endpoint=ENDPOINT, method="m")
    async with waiting_calls(sender, [request]) as (call,):
        # When an admin cancels it through the API
        response = await http.post(f"/api/requests/{request.id}/cancel", headers=admin)

        # Then it is withdrawn, and the caller gets CancelledBeforePickup
        assert response.status_code == 200, response.text
        assert response.json() == {"id": request.id, "cancelled": True, "state": "withdrawn"}
        with pytest.raises(CancelledBeforePickup):
            await asyncio.wait_for(call, 10)
        status = (await http.get(f"/api/requests/{request.id}", headers=read)).json()
        assert (status["state"], status["reason"]) == ("withdrawn", "cancelled")
        await listed(http, read, depth=0)

        # And cancelling again changes nothing
        again = await http.post(f"/api/requests/{request.id}/cancel", headers=admin)
        assert again.json() == {"id": request.id, "cancelled": False, "state": "withdrawn"}


async def test_cancel_after_pickup_signals_the_receiver_and_fails_the_caller(
    http: httpx.AsyncClient,
    admin: dict[str, str],
    read: dict[str, str],
    sender: AsyncQueue,
    redis_url: str,
    key_prefix: str,
) -> None:
    # Given a request a receiver has picked up (in flight)
    receiver = AsyncQueue.from_url(redis_url, prefix=key_prefix, settings=QUEUE_SETTINGS)
    request = Request(endpoint=ENDPOINT, method="m")
    try:
        async with waiting_calls(sender, [request]) as (call,):
            pending = await receiver.dequeue(ENDPOINT, timeout_s=5)
            assert pending is not None and pending.id == request.id
            await wait_for_state(sender, request.id, RequestState.TAKEN)
            shown = (await http.get(f"/api/requests/{request.id}", headers=read)).json()
            assert shown["state"] == "taken" and shown["taken_ms"] is not None
            one = await http.get("/api/endpoint", params={"endpoint": ENDPOINT}, headers=read)
            assert (one.json()["depth"], one.json()["in_flight"]) == (0, 1)

            # When an admin cancels it
            response = await http.post(f"/api/requests/{request.id}/cancel", headers=admin)

            # Then the receiver is signalled, the caller fails, and the status says cancelled
            assert response.json() == {"id": request.id, "cancelled": True, "state": "cancelled"}
            await async_wait_until(lambda: pending.cancelled, 5, 0.01, "receiver signalled")
            with pytest.raises(CancelledAfterPickup):
                await asyncio.wait_for(call, 10)
            status = (await http.get(f"/api/requests/{request.id}", headers=read)).json()
            assert status["state"] == "cancelled"
    finally:
        await receiver.aclose()


async def test_unknown_request_ids_are_404(http: httpx.AsyncClient, admin: dict[str, str]) -> None:
    unknown = uuid.uuid4().hex
    for response in (
        await http.get(f"/api/requests/{unknown}", headers=admin),
        await http.post(f"/api/requests/{unknown}/cancel", headers=admin),
    ):
        assert response.status_code == 404, response.text
        assert response.json()["error"]["type"] == "not_found"


@pytest.mark.parametrize(
    "endpoint",
    ["", "x" * 201, "poll://bell\x07", "poll://new\nline", "poll://zero\u200bwidth"],
)
async def test_invalid_endpoint_names_are_422(
    http: httpx.AsyncClient, read: dict[str, str], endpoint: str
) -> None:
    # When an endpoint name that is not 1-200 printable characters is asked for
    for route in ("/api/endpoint", "/api/queued"):
        response = await http.get(route, params={"endpoint": endpoint}, headers=read)
        # Then it is refused with 422 and the one error shape, naming the rule, not the value
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["type"] in ("validation_error", "invalid_endpoint")
        assert error["message"]


@pytest.mark.parametrize(
    "params", [{"limit": 0}, {"limit": 501}, {"offset": -1}, {"limit": "many"}]
)
async def test_bad_paging_is_422(
    http: httpx.AsyncClient, read: dict[str, str], params: dict[str, Any]
) -> None:
    response = await http.get("/api/queued", params={"endpoint": ENDPOINT, **params}, headers=read)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["type"] == "validation_error"


@pytest.mark.parametrize("request_id", ["-starts-with-dash", "has|pipe", "x" * 129, "sp ace"])
async def test_malformed_request_ids_are_422(
    http: httpx.AsyncClient, admin: dict[str, str], request_id: str
) -> None:
    for response in (
        await http.get(f"/api/requests/{request_id}", headers=admin),
        await http.post(f"/api/requests/{request_id}/cancel", headers=admin),
    ):
        assert response.status_code == 422, response.text
        assert response.json()["error"]["type"] == "validation_error"


async def test_throughput_shows_the_enqueue_rate(
    http: httpx.AsyncClient, read: dict[str, str], sender: AsyncQueue
) -> None:
    async def series() -> dict[str, list[list[float]]]:
        body = (await http.get("/api/throughput", headers=read)).json()
        assert body["interval_s"] == 0.1 and body["window_s"] == 600
        return {s["endpoint"]: s["points"] for s in body["series"]}

    # Given an endpoint the sampler (every 0.1 s) has seen for two samples, at a rate of 0
    async with waiting_calls(sender, [Request(endpoint=ENDPOINT, method="m")]):
        await listed(http, read, depth=1)
        points = await async_wait_until(
            lambda: series_of(series, ENDPOINT), 10, 0.05, "the endpoint sampled twice"
        )
        assert all(rate == 0 for _, rate in points)

        # When more requests are enqueued
        more = [Request(endpoint=ENDPOINT, method="m") for _ in range(4)]
        async with waiting_calls(sender, more):
            # Then a later point shows a positive rate
            async def rate_seen() -> bool:
                return any(rate > 0 for _, rate in (await series()).get(ENDPOINT, []))

            await async_wait_until(rate_seen, 10, 0.05, "a positive enqueue rate")


async def series_of(read_series: Any, endpoint: str) -> list[list[float]] | None:
    return (await read_series()).get(endpoint) or None
