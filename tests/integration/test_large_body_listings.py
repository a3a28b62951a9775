"""Listings of queued requests (the Inspector) and of dead letters (the Inspector and the nodes'
`dead_letters`) with large bodies stored in Redis: sizes come from HSTRLEN, a body over
BODY_READ_MAX_BYTES or past a listing's BODY_READ_BUDGET_BYTES is not read (it is listed with
its size and `body_read=False`), so a listing moves a bounded number of bytes however large and
however many the bodies are. Counted by the server: INFO's total_net_output_bytes."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from prq.core.keys import KeySchema
from prq.embedded import EmbeddedRedis
from prq.ops.answers import QueuedItem
from prq.ops.inspector import Inspector
from prq.protocol.dead import (
    BODY_READ_BUDGET_BYTES,
    BODY_READ_MAX_BYTES,
    PREVIEW_BYTES,
    dead_letter_call,
)
from tests.queue_facades import AnyQueue, QueueFactory
from tests.stored_bodies import read_body

pytestmark = pytest.mark.integration

ENDPOINT = "poll://large-listing"
#: Bodies this large are never read by a listing (max_body_bytes is raised to allow them).
HUGE = 3 * BODY_READ_MAX_BYTES
#: Bodies each small enough to read, but more of them than a listing's budget holds.
MEDIUM = BODY_READ_MAX_BYTES - 100_000
MEDIUM_COUNT = BODY_READ_BUDGET_BYTES // MEDIUM + 3
SETTINGS: dict[str, Any] = {"max_body_bytes": 4 * HUGE, "pickup_timeout_s": 60}
#: What the listings in one measurement may send besides the bodies they read (ids, details,
#: sizes, framing, the INFO replies, and the node's own upkeep meanwhile).
OVERHEAD = 256 * 1024


def sent_bytes(client: redis.Redis) -> int:
    """Bytes the server has sent to all its clients so far."""
    return int(client.info("stats")["total_net_output_bytes"])


def stored_body(client: redis.Redis, prefix: str, request_id: str) -> bytes:
    body = read_body(client, KeySchema(prefix).endpoint(ENDPOINT).request(request_id))
    assert isinstance(body, bytes)
    return body


def dead_letter(node: AnyQueue, client: redis.Redis, request_id: str, body: bytes) -> None:
    """Dead-letter `body` under `request_id`, as prq does (the node loaded the scripts)."""
    call = dead_letter_call(node.ctx, ENDPOINT, request_id, body, "attempts_exhausted", 3)
    client.execute_command(*call.args)  # type: ignore[no-untyped-call]


async def test_listings_show_huge_bodies_by_their_size_without_reading_them(
    make_own_queue: QueueFactory,
    own_redis: EmbeddedRedis,
    own_redis_client: redis.Redis,
    key_prefix: str,
) -> None:
    # Given queued requests and dead letters, three of each with a huge body and one small
    node = make_own_queue(**SETTINGS)
    await node.start()
    small_id = await node.notify(
        ENDPOINT, "small", 1, service="svc", priority=3, producer="me", request_id="small"
    )
    huge_ids = [
        await node.notify(ENDPOINT, "huge", "x" * HUGE, request_id=f"huge-{i}") for i in range(3)
    ]
    queued_sizes = {i: len(stored_body(own_redis_client, key_prefix, i)) for i in huge_ids}
    letters = {
        "dead-small": b'{"small": true}',
        "dead-long": b"y" * (PREVIEW_BYTES + 10),
        **{f"dead-huge-{i}": b"z" * HUGE for i in range(3)},
    }
    for request_id, body in letters.items():
        dead_letter(node, own_redis_client, request_id, body)

    # When the Inspector lists the queue and the dead letters, and the node its dead letters
    before = sent_bytes(own_redis_client)
    async with Inspector.from_url(own_redis.url, prefix=key_prefix) as inspector:
        page = await inspector.queued(ENDPOINT)
        viewed = await inspector.dead_letters(ENDPOINT)
    listed = await node.dead_letters(ENDPOINT)
    moved = sent_bytes(own_redis_client) - before

    # Then Redis sent none of the huge bodies: far less than one of them
    assert moved < OVERHEAD, moved
    # And the queue shows every request: the small one as before, the huge ones by their size,
    # marked as not read
    items = {item.id: item for item in page.items}
    assert set(items) == {small_id, *huge_ids}
    small: QueuedItem = items[small_id]
    assert (small.method, small.service, small.priority, small.producer) == (
        "small",
        "svc",
        3,
        "me",
    )
    assert small.body_read and small.error is None
    for request_id in huge_ids:
        item = items[request_id]
        assert (item.body_bytes, item.body_read) == (queued_sizes[request_id], False)
        assert (item.method, item.service, item.priority, item.producer) == ("", "", None, None)
        assert item.age_s >= 0 and item.created_ms > 0
    # And both dead-letter listings show every letter with its size: the small one whole, the
    # long one cut to its first PREVIEW_BYTES, the huge ones without a preview, marked so
    for found in (viewed, listed):
        by_id = {letter.id: letter for letter in found}
        assert set(by_id) == set(letters)
        for request_id, body in letters.items():
            assert by_id[request_id].body_bytes == len(body)
        small_letter, long_letter = by_id["dead-small"], by_id["dead-long"]
        assert (small_letter.body_preview, small_letter.body_preview_cut) == (
            letters["dead-small"].decode(),
            False,
        )
        assert (long_letter.body_preview, long_letter.body_preview_cut) == (
            "y" * PREVIEW_BYTES,
            True,
        )
        for i in range(3):
            huge = by_id[f"dead-huge-{i}"]
            assert (huge.body_read, huge.body_preview, huge.body_preview_cut) == (False, "", True)


async def test_a_listing_reads_bodies_only_up_to_its_budget(
    make_own_queue: QueueFactory,
    own_redis: EmbeddedRedis,
    own_redis_client: redis.Redis,
    key_prefix: str,
) -> None:
    # Given more queued requests and dead letters than one listing's read budget holds, each
    # small enough to read on its own
    node = make_own_queue(**SETTINGS)
    await node.start()
    for i in range(MEDIUM_COUNT):
        await node.notify(ENDPOINT, "medium", "m" * MEDIUM, request_id=f"medium-{i}")
        dead_letter(node, own_redis_client, f"dead-{i}", b"d" * MEDIUM)
    can_read = BODY_READ_BUDGET_BYTES // (MEDIUM + 200)  # a request's JSON is a little longer

    # When each is listed
    before = sent_bytes(own_redis_client)
    async with Inspector.from_url(own_redis.url, prefix=key_prefix) as inspector:
        page = await inspector.queued(ENDPOINT)
    queue_moved = sent_bytes(own_redis_client) - before
    before = sent_bytes(own_redis_client)
    letters = await node.dead_letters(ENDPOINT)
    dead_moved = sent_bytes(own_redis_client) - before

    # Then each listing read bodies up to its budget and no further, in listing order, and
    # listed the rest by their size
    for moved in (queue_moved, dead_moved):
        assert moved < BODY_READ_BUDGET_BYTES + OVERHEAD, moved
    read = [item.body_read for item in page.items]
    assert len(read) == MEDIUM_COUNT and read == sorted(read, reverse=True)
    assert read.count(True) == can_read and read.count(False) == MEDIUM_COUNT - can_read
    assert all(item.method == "medium" for item in page.items if item.body_read)
    read = [letter.body_read for letter in letters]
    assert len(read) == MEDIUM_COUNT and read == sorted(read, reverse=True)
    assert read.count(True) == BODY_READ_BUDGET_BYTES // MEDIUM
    assert all(letter.body_bytes == MEDIUM for letter in letters)
