"""Dead letters through the admin service: listed with any token, replayed once and purged with
an admin token only, validated strictly, counted in the endpoint listing and in `/metrics`."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis

from prq import AsyncQueue, Request, RequestState, Response
from prq.core.keys import KeySchema
from prq.protocol.dead import dead_letter_call
from tests.api.conftest import QUEUE_SETTINGS
from tests.api.test_limits import queued_request
from tests.api.test_metrics import gauge, scrape
from tests.queue_facades import wait_for_state
from tests.queued import queue_depth
from tests.redis_servers import async_wait_until
from tests.stored_bodies import read_body, write_body

pytestmark = pytest.mark.integration

ENDPOINT = "poll://dead-api"
LIST = "/api/dead-letters"
REPLAY = "/api/dead-letters/replay"
PURGE = "/api/dead-letters/purge"


def kill(
    sender: AsyncQueue,
    redis_client: redis.Redis,
    endpoint: str = ENDPOINT,
    n: int = 1,
    reason: str = "attempts_exhausted",
) -> list[Request]:
    """Dead-letter `n` fresh requests of `endpoint` with their (valid) bytes, oldest first, as
    prq does (the script is loaded: `sender` has started)."""
    requests = [Request(endpoint=endpoint, method="m", params=i) for i in range(n)]
    for request in requests:
        body = request.model_dump_json().encode()
        call = dead_letter_call(sender.ctx, endpoint, request.id, body, reason, 3)
        redis_client.execute_command(*call.args)  # type: ignore[no-untyped-call]
    return requests


def dead_ids(redis_client: redis.Redis, key_prefix: str, endpoint: str = ENDPOINT) -> set[str]:
    """The ids Redis holds as the endpoint's dead letters (all three keys agree)."""
    ids_key, details_key, bodies_key = KeySchema(key_prefix).endpoint(endpoint).dead
    ids: list[bytes] = redis_client.zrange(ids_key, 0, -1)  # type: ignore[assignment]
    details: list[bytes] = redis_client.hkeys(details_key)  # type: ignore[assignment]
    bodies: list[bytes] = redis_client.hkeys(bodies_key)  # type: ignore[assignment]
    assert set(ids) == set(details) == set(bodies)
    return {i.decode() for i in ids}


def pending_length(redis_client: redis.Redis, key_prefix: str, endpoint: str = ENDPOINT) -> int:
    return int(queue_depth(redis_client, KeySchema(key_prefix).endpoint(endpoint)))


async def listed(http: httpx.AsyncClient, headers: dict[str, str], endpoint: str = ENDPOINT) -> Any:
    response = await http.get(LIST, params={"endpoint": endpoint}, headers=headers)
    assert response.status_code == 200, response.text
    return response.json()


async def test_a_read_token_lists_dead_letters_but_cannot_replay_or_purge_them(
    http: httpx.AsyncClient,
    read: dict[str, str],
    sender: AsyncQueue,
    redis_client: redis.Redis,
    key_prefix: str,
) -> None:
    # Given two dead letters
    first, second = kill(sender, redis_client, n=2)

    # When a read token lists them, Then they come newest first with their details
    letters = await listed(http, read)
    assert [d["id"] for d in letters] == [second.id, first.id]
    letter = letters[1]
    body = first.model_dump_json().encode()
    assert letter["endpoint"] == ENDPOINT and letter["reason"] == "attempts_exhausted"
    assert (letter["attempts"], letter["body_bytes"]) == (3, len(body))
    assert letter["body_preview"] == body.decode() and letter["dead_at_ms"] > 0

    # When it tries to replay or purge, Then it is refused with 403 and nothing changes
    params = {"endpoint": ENDPOINT}
    for url, body_json in ((REPLAY, {"id": first.id}), (PURGE, {"ids": None})):
        refused = await http.post(url, params=params, json=body_json, headers=read)
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["type"] == "forbidden"
    assert dead_ids(redis_client, key_prefix) == {first.id, second.id}
    assert pending_length(redis_client, key_prefix) == 0


async def test_no_token_can_neither_list_nor_change_dead_letters(
    http: httpx.AsyncClient, sender: AsyncQueue, redis_client: redis.Redis, key_prefix: str
) -> None:
    (request,) = kill(sender, redis_client)
    params = {"endpoint": ENDPOINT}
    assert (await http.get(LIST, params=params)).status_code == 401
    assert (await http.post(REPLAY, params=params, json={"id": request.id})).status_code == 401
    assert (await http.post(PURGE, params=params, json={"ids": None})).status_code == 401
    assert dead_ids(redis_client, key_prefix) == {request.id}


async def test_an_admin_replays_a_dead_letter_once(
    http: httpx.AsyncClient,
    admin: dict[str, str],
    read: dict[str, str],
    sender: AsyncQueue,
    redis_client: redis.Redis,
    key_prefix: str,
) -> None:
    # Given two dead letters
    replayed, kept = kill(sender, redis_client, n=2)
    params = {"endpoint": ENDPOINT}

    # When an admin replays one twice
    answers = [
        await http.post(REPLAY, params=params, json={"id": replayed.id}, headers=admin)
        for _ in range(2)
    ]

    # Then the first replays it and the second finds nothing
    assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
    assert [a.json() for a in answers] == [
        {"id": replayed.id, "outcome": "replayed"},
        {"id": replayed.id, "outcome": "missing"},
    ]
    # And the request is queued once, no longer a dead letter, and known by id again
    assert pending_length(redis_client, key_prefix) == 1
    assert dead_ids(redis_client, key_prefix) == {kept.id}
    assert [d["id"] for d in await listed(http, read)] == [kept.id]
    status = await http.get(f"/api/requests/{replayed.id}", headers=read)
    assert status.status_code == 200, status.text
    assert status.json()["state"] == "queued"
    # And a receiver takes it like any request
    taken = await sender.dequeue(ENDPOINT, timeout_s=5)
    assert taken is not None and taken.request == replayed


async def test_replaying_a_request_that_is_queued_already_adds_nothing(
    http: httpx.AsyncClient,
    admin: dict[str, str],
    sender: AsyncQueue,
    redis_client: redis.Redis,
    key_prefix: str,
) -> None:
    # Given a dead letter that was replayed, then dead-lettered again while queued (a race)
    (request,) = kill(sender, redis_client)
    params = {"endpoint": ENDPOINT}
    first = await http.post(REPLAY, params=params, json={"id": request.id}, headers=admin)
    assert first.json()["outcome"] == "replayed"
    body = request.model_dump_json().encode()
    call = dead_letter_call(sender.ctx, ENDPOINT, request.id, body, "attempts_exhausted", 1)
    redis_client.execute_command(*call.args)  # type: ignore[no-untyped-call]

    # When it is replayed, Then the answer says it is live, and it stays queued once
    again = await http.post(REPLAY, params=params, json={"id": request.id}, headers=admin)
    assert again.json() == {"id": request.id, "outcome": "live"}
    assert pending_length(redis_client, key_prefix) == 1
    assert dead_ids(redis_client, key_prefix) == set()


async def test_an_admin_purges_named_dead_letters_then_all(
    http: httpx.AsyncClient,
    admin: dict[str, str],
    sender: AsyncQueue,
    redis_client: redis.Redis,
    key_prefix: str,
) -> None:
    # Given three dead letters here, and one on another endpoint
    a, b, c = kill(sender, redis_client, n=3)
    (elsewhere,) = kill(sender, redis_client, endpoint="poll://dead-api-other")
    params = {"endpoint": ENDPOINT}

    # When an admin purges one by id, with an id that is no dead letter
    named = await http.post(PURGE, params=params, json={"ids": [b.id, "no-such-id"]}, headers=admin)
    # Then one is dropped
    assert named.status_code == 200, named.text
    assert named.json() == {"purged": 1}
    assert dead_ids(redis_client, key_prefix) == {a.id, c.id}

    # When an empty list is sent, Then nothing is dropped (an empty list is not "all")
    empty = await http.post(PURGE, params=params, json={"ids": []}, headers=admin)
    assert empty.json() == {"purged": 0}
    assert dead_ids(redis_client, key_prefix) == {a.id, c.id}

    # When all are purged, Then the endpoint has none left, and the other endpoint keeps its own
    everything = await http.post(PURGE, params=params, json={"ids": None}, headers=admin)
    assert everything.json() == {"purged": 2}
    assert dead_ids(redis_client, key_prefix) == set()
    assert not any(redis_client.exists(k) for k in KeySchema(key_prefix).endpoint(ENDPOINT).dead)
    assert dead_ids(redis_client, key_prefix, "poll://dead-api-other") == {elsewhere.id}
    assert pending_length(redis_client, key_prefix) == 0


async def test_listing_pages_newest_first(
    http: httpx.AsyncClient, read: dict[str, str], sender: AsyncQueue, redis_client: redis.Redis
) -> None:
    requests = kill(sender, redis_client, n=5)
    newest_first = [r.id for r in reversed(requests)]
    for offset, limit in ((0, 2), (2, 2), (4, 2), (5, 1), (0, 1000)):
        response = await http.get(
            LIST, params={"endpoint": ENDPOINT, "offset": offset, "limit": limit}, headers=read
        )
        assert response.status_code == 200, response.text
        assert [d["id"] for d in response.json()] == newest_first[offset : offset + limit]
    # An endpoint without dead letters lists none
    assert await listed(http, read, "poll://dead-api-none") == []


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"endpoint": ENDPOINT, "limit": 0},
        {"endpoint": ENDPOINT, "limit": 1001},
        {"endpoint": ENDPOINT, "limit": "ten"},
        {"endpoint": ENDPOINT, "offset": -1},
        {"endpoint": ENDPOINT, "other": "x"},
        {"endpoint": ""},
        {"endpoint": "x" * 201},
        {"endpoint": "poll://bell\x07"},
        {"endpoint": "poll://zero\u200bwidth"},
    ],
)
async def test_bad_listing_parameters_are_422(
    http: httpx.AsyncClient, read: dict[str, str], params: dict[str, Any]
) -> None:
    response = await http.get(LIST, params=params, headers=read)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["type"] in ("validation_error", "invalid_endpoint")


@pytest.mark.parametrize(
    ("url", "body"),
    [
        (REPLAY, {}),
        (REPLAY, {"id": None}),
        (REPLAY, {"id": ""}),
        (REPLAY, {"id": "-starts-with-a-dash"}),
        (REPLAY, {"id": "has space"}),
        (REPLAY, {"id": "x" * 129}),
        (REPLAY, {"id": "evil\n"}),
        (REPLAY, {"id": 12345}),
        (REPLAY, {"id": ["a"]}),
        (REPLAY, {"id": "abc", "extra": 1}),
        (REPLAY, ["abc"]),
        (PURGE, {}),
        (PURGE, {"ids": "abc"}),
        (PURGE, {"ids": [5]}),
        (PURGE, {"ids": ["ok", "not ok"]}),
        (PURGE, {"ids": ["*"]}),
        (PURGE, {"ids": ["a"] * 1001}),
        (PURGE, {"ids": None, "all": True}),
        (PURGE, None),
    ],
)
async def test_invalid_bodies_are_422_and_change_nothing(
    http: httpx.AsyncClient,
    admin: dict[str, str],
    sender: AsyncQueue,
    redis_client: redis.Redis,
    key_prefix: str,
    url: str,
    body: Any,
) -> None:
    # Given a dead letter
    (request,) = kill(sender, redis_client)
    # When an admin sends an id that is no request id, or a body of the wrong shape
    response = await http.post(url, params={"endpoint": ENDPOINT}, json=body, headers=admin)
    # Then it is refused with 422, naming the field, never echoing the value
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["type"] == "validation_error" and error["message"].startswith("body")
    assert "not ok" not in error["message"] and "starts-with" not in error["message"]
    # And nothing changed
    assert dead_ids(redis_client, key_prefix) == {request.id}
    assert pending_length(redis_client, key_prefix) == 0


async def test_replay_and_purge_need_a_valid_endpoint(
    http: httpx.AsyncClient, admin: dict[str, str], sender: AsyncQueue, redis_client: redis.Redis
) -> None:
    (request,) = kill(sender, redis_client)
    for params in ({}, {"endpoint": "poll://new\nline"}, {"endpoint": ENDPOINT, "x": "1"}):
        for url, body in ((REPLAY, {"id": request.id}), (PURGE, {"ids": None})):
            response = await http.post(url, params=params, json=body, headers=admin)
            assert response.status_code == 422, (params, url, response.text)


@pytest.mark.parametrize(
    "endpoint", ['poll://<b>&"x"</b>', "poll://a*b?[c]", "poll://{tag}:x", "poll://ünï/código"]
)
async def test_hostile_but_valid_names_keep_their_dead_letters_apart(
    http: httpx.AsyncClient,
    admin: dict[str, str],
    read: dict[str, str],
    sender: AsyncQueue,
    redis_client: redis.Redis,
    key_prefix: str,
    endpoint: str,
) -> None:
    # Given a dead letter on an endpoint whose name holds markup, globs, braces or unicode, and
    # one on a plain endpoint
    (hostile,) = kill(sender, redis_client, endpoint=endpoint)
    (plain,) = kill(sender, redis_client)

    # Then each endpoint lists its own, with the name as given
    letters = await listed(http, read, endpoint)
    assert [(d["id"], d["endpoint"]) for d in letters] == [(hostile.id, endpoint)]
    assert [d["id"] for d in await listed(http, read)] == [plain.id]

    # When the hostile one is replayed, Then it is queued on its own endpoint only
    params = {"endpoint": endpoint}
    answer = await http.post(REPLAY, params=params, json={"id": hostile.id}, headers=admin)
    assert answer.json() == {"id": hostile.id, "outcome": "replayed"}
    assert pending_length(redis_client, key_prefix, endpoint) == 1
    assert pending_length(redis_client, key_prefix) == 0
    # And purging all of it leaves the plain endpoint's alone
    kill(sender, redis_client, endpoint=endpoint)
    purged = await http.post(PURGE, params=params, json={"ids": None}, headers=admin)
    assert purged.json() == {"purged": 1}
    assert dead_ids(redis_client, key_prefix, endpoint) == set()
    assert dead_ids(redis_client, key_prefix) == {plain.id}


async def test_undecodable_bytes_show_as_text_and_replay_as_they_were(
    http: httpx.AsyncClient,
    admin: dict[str, str],
    read: dict[str, str],
    redis_url: str,
    key_prefix: str,
    sender: AsyncQueue,
    redis_client: redis.Redis,
) -> None:
    # Given a queued request whose stored bytes someone replaced with markup and invalid UTF-8
    request = Request(endpoint=ENDPOINT, method="m")
    call = asyncio.create_task(sender.queue_and_wait(request, timeout_s=30))
    await wait_for_state(sender, request.id, RequestState.QUEUED)
    keys = KeySchema(key_prefix).endpoint(ENDPOINT)
    garbage = b'<script>alert("x")</script>\xff\xfe{"endpoint": '
    write_body(redis_client, keys.request(request.id), garbage)

    # When a receiver takes it
    async with serving(redis_url, key_prefix):
        outcome = await asyncio.wait_for(call, 30)

    # Then its caller got a SerializationError, and it is listed with its reason, its size and
    # its bytes as text (markup as typed, invalid UTF-8 replaced)
    assert isinstance(outcome, Response) and outcome.error is not None
    assert outcome.error.type == "SerializationError"
    (letter,) = await listed(http, read)
    assert letter["id"] == request.id and letter["reason"].startswith("undecodable:")
    assert letter["attempts"] == 1 and letter["body_bytes"] == len(garbage)
    assert letter["body_preview"] == garbage.decode("utf-8", errors="replace")

    # When it is replayed, Then its stored bytes are queued again as they were
    answer = await http.post(
        REPLAY, params={"endpoint": ENDPOINT}, json={"id": request.id}, headers=admin
    )
    assert answer.json() == {"id": request.id, "outcome": "replayed"}
    assert read_body(redis_client, keys.request(request.id)) == garbage
    assert pending_length(redis_client, key_prefix) == 1


@contextlib.asynccontextmanager
async def serving(redis_url: str, key_prefix: str) -> AsyncIterator[None]:
    """A receiver node serving ENDPOINT while the block runs."""
    receiver = AsyncQueue.from_url(redis_url, prefix=key_prefix, settings=QUEUE_SETTINGS)
    stop = asyncio.Event()
    task = asyncio.create_task(receiver.serve(ENDPOINT, lambda r: r.params, stop=stop))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 15)
        await receiver.aclose()


async def test_the_endpoint_listing_and_metrics_count_dead_letters(
    http: httpx.AsyncClient, read: dict[str, str], sender: AsyncQueue, redis_client: redis.Redis
) -> None:
    other = "poll://dead-api-clean"
    # Given a listed endpoint with three dead letters, and one without any
    kill(sender, redis_client, n=3)
    async with queued_request(sender, ENDPOINT), queued_request(sender, other):

        async def both_listed() -> dict[str, Any] | None:
            infos = (await http.get("/api/endpoints", headers=read)).json()
            found = {i["endpoint"]: i for i in infos}
            return found if {ENDPOINT, other} <= set(found) else None

        listing = await async_wait_until(both_listed, 10, 0.05, "both endpoints listed")

        # Then the listing and the one-endpoint view count them
        assert (listing[ENDPOINT]["dead_letters"], listing[other]["dead_letters"]) == (3, 0)
        one = await http.get("/api/endpoint", params={"endpoint": ENDPOINT}, headers=read)
        assert one.json()["dead_letters"] == 3

        # And /metrics has the gauge for both
        families = await scrape(http, read)
        assert gauge(families, "prq_endpoint_dead_letters", ENDPOINT) == 3
        assert gauge(families, "prq_endpoint_dead_letters", other) == 0

        # When they are purged, Then the next scrape follows
        assert await sender.purge_dead_letters(ENDPOINT) == 3
        families = await scrape(http, read)
        assert gauge(families, "prq_endpoint_dead_letters", ENDPOINT) == 0


async def test_other_methods_are_405(http: httpx.AsyncClient, admin: dict[str, str]) -> None:
    params = {"endpoint": ENDPOINT}
    for method, url, allow in (
        ("POST", LIST, "GET"),
        ("DELETE", LIST, "GET"),
        ("GET", REPLAY, "POST"),
        ("PUT", PURGE, "POST"),
    ):
        response = await http.request(method, url, params=params, headers=admin)
        assert response.status_code == 405, (method, url, response.text)
        assert response.headers["allow"] == allow
        assert response.json()["error"]["type"] == "method_not_allowed"
