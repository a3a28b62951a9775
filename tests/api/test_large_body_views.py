"""The admin service's queued and dead-letter views with large bodies stored in Redis: each
request and letter is listed with its true size; small bodies show as before, a body too large to
read for a listing shows no method or preview and says so (`body_read: false`), and the answers
stay small. (The bytes Redis sends for a listing are counted in
tests/integration/test_large_body_listings.py.)"""

from __future__ import annotations

import httpx
import pytest
import redis

from prq import AsyncQueue
from prq.core.keys import KeySchema
from prq.protocol.dead import BODY_READ_MAX_BYTES, PREVIEW_BYTES, dead_letter_call
from tests.stored_bodies import read_body

pytestmark = pytest.mark.integration

ENDPOINT = "poll://large-views"
#: A body no listing reads (the test settings' max_body_bytes allows it).
HUGE = 3 * BODY_READ_MAX_BYTES
#: Most bytes a view's answer may take here (a few items, previews of PREVIEW_BYTES at most).
ANSWER_BYTES = 32 * 1024


def dead_letter(sender: AsyncQueue, client: redis.Redis, request_id: str, body: bytes) -> None:
    call = dead_letter_call(sender.ctx, ENDPOINT, request_id, body, "attempts_exhausted", 3)
    client.execute_command(*call.args)  # type: ignore[no-untyped-call]


async def test_views_list_large_bodies_by_size_and_mark_what_they_did_not_read(
    http: httpx.AsyncClient,
    read: dict[str, str],
    sender: AsyncQueue,
    redis_client: redis.Redis,
    key_prefix: str,
) -> None:
    # Given a small and a huge queued request, and a small and a huge dead letter
    assert sender.settings.max_body_bytes > HUGE
    small_id = await sender.notify(ENDPOINT, "small", 1, service="svc", request_id="small")
    huge_id = await sender.notify(ENDPOINT, "huge", "x" * HUGE, request_id="huge")
    keys = KeySchema(key_prefix).endpoint(ENDPOINT)
    sizes = {i: len(read_body(redis_client, keys.request(i)) or b"") for i in (small_id, huge_id)}
    small_letter, huge_letter = b"s" * (PREVIEW_BYTES + 1), b"h" * HUGE
    dead_letter(sender, redis_client, "dead-small", small_letter)
    dead_letter(sender, redis_client, "dead-huge", huge_letter)
    params = {"endpoint": ENDPOINT}

    # When a read token lists the queue
    queued = await http.get("/api/queued", params=params, headers=read)
    # Then both are listed with their sizes; the huge one without what only its body holds,
    # marked as not read, and the answer is small
    assert queued.status_code == 200, queued.text
    assert len(queued.content) < ANSWER_BYTES
    items = {item["id"]: item for item in queued.json()["items"]}
    assert {i: item["body_bytes"] for i, item in items.items()} == sizes
    assert (items[small_id]["method"], items[small_id]["service"]) == ("small", "svc")
    assert (items[small_id]["priority"], items[small_id]["body_read"]) == (0, True)
    huge = items[huge_id]
    assert (huge["method"], huge["priority"], huge["producer"]) == ("", None, None)
    assert huge["body_read"] is False and huge["error"] is None

    # When it lists the dead letters
    dead = await http.get("/api/dead-letters", params=params, headers=read)
    # Then both are listed with their sizes: the small one's preview cut at PREVIEW_BYTES and
    # marked cut, the huge one with no preview, marked not read; the answer is small
    assert dead.status_code == 200, dead.text
    assert len(dead.content) < ANSWER_BYTES
    letters = {letter["id"]: letter for letter in dead.json()}
    assert letters["dead-small"]["body_bytes"] == len(small_letter)
    assert letters["dead-small"]["body_preview"] == "s" * PREVIEW_BYTES
    assert letters["dead-small"]["body_preview_cut"] is True
    assert letters["dead-small"]["body_read"] is True
    assert letters["dead-huge"]["body_bytes"] == len(huge_letter)
    assert letters["dead-huge"]["body_preview"] == ""
    assert letters["dead-huge"]["body_read"] is False
