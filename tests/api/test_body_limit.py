"""Request bodies over `max_body_bytes` are refused with 413, whether declared or streamed."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import httpx
import pytest

from api.settings import DEFAULT_MAX_BODY_BYTES
from tests.api.conftest import MakeApi

pytestmark = pytest.mark.integration


def cancel_url() -> str:
    return f"/api/requests/{uuid.uuid4().hex}/cancel"


async def chunks(total: int, size: int = 4096) -> AsyncIterator[bytes]:
    sent = 0
    while sent < total:
        chunk = b"x" * min(size, total - sent)
        sent += len(chunk)
        yield chunk


def assert_too_large(response: httpx.Response) -> None:
    assert response.status_code == 413, response.text
    assert response.json()["error"]["type"] == "payload_too_large"


async def test_a_declared_body_over_the_limit_is_413(
    http: httpx.AsyncClient, admin: dict[str, str]
) -> None:
    # When a body one byte over the default limit is sent with its Content-Length
    response = await http.post(
        cancel_url(), content=b"x" * (DEFAULT_MAX_BODY_BYTES + 1), headers=admin
    )
    # Then it is refused before the route runs
    assert_too_large(response)


async def test_a_streamed_body_over_the_limit_is_413(
    http: httpx.AsyncClient, admin: dict[str, str]
) -> None:
    # When a body without a Content-Length (chunked) runs past the limit
    response = await http.post(
        cancel_url(), content=chunks(DEFAULT_MAX_BODY_BYTES + 4096), headers=admin
    )
    # Then it is refused once the limit is passed
    assert_too_large(response)


async def test_bodies_within_the_limit_reach_the_route(
    make_api: MakeApi, admin: dict[str, str]
) -> None:
    # Given a service with a 1 KiB limit
    api = make_api(max_body_bytes=1024)
    async with httpx.AsyncClient(base_url=api.url, timeout=15) as http:
        # When bodies of exactly the limit arrive, declared and streamed
        declared = await http.post(cancel_url(), content=b"x" * 1024, headers=admin)
        streamed = await http.post(cancel_url(), content=chunks(1024, 100), headers=admin)
        over = await http.post(cancel_url(), content=chunks(1025, 100), headers=admin)
    # Then the route answers them (404: the ids are made up); one byte more is refused
    assert declared.status_code == 404, declared.text
    assert streamed.status_code == 404, streamed.text
    assert_too_large(over)
