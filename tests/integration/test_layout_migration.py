"""Upgrading from the previous scheduling layout (README, "Upgrading from the previous layout"):
an endpoint whose Redis still holds the previous layout's lanes (`prq:{e}:lv`, a sorted set of
priorities, and `prq:{e}:q:<p>`, one sorted set of ids per priority) is refused, with an error
naming what to do, by senders and receivers alike, before anything is queued or taken; once
those keys are gone, the same nodes go on. The old keys are written here with raw redis-py
commands, as the previous version left them."""

from __future__ import annotations

import asyncio

import pytest
import redis

from prq import ConfigurationError, Request
from prq.bulk import BulkClient
from prq.core.keys import KeySchema
from tests.queue_facades import QueueFactory
from tests.queued import queue_depth

pytestmark = pytest.mark.integration


def write_old_layout(client: redis.Redis, prefix: str, endpoint: str) -> tuple[str, str]:
    """One request queued at priority 0 as the previous layout kept it; its two lane keys."""
    keys = KeySchema(prefix).endpoint(endpoint)
    levels, level = f"{keys.tag}:lv", f"{keys.tag}:q:0"
    client.zadd(levels, {"0": 0})
    client.zadd(level, {"old-1": 1})
    client.hset(f"{keys.tag}:q:0:vt", mapping={"g": 0, "pold": 1})
    client.hset(keys.request("old-1"), mapping={"st": "queued", "b": '{"m":"m"}', "pri": 0})
    for key in (levels, level, f"{keys.tag}:q:0:vt", keys.request("old-1")):
        client.pexpire(key, 600_000)
    return levels, level


async def test_senders_and_receivers_refuse_an_endpoint_holding_the_previous_layout(
    make_queue: QueueFactory, redis_client: redis.Redis, key_prefix: str
) -> None:
    # Given an endpoint holding a request queued by the previous layout
    endpoint = "poll://old-layout"
    levels, level = write_old_layout(redis_client, key_prefix, endpoint)
    keys = KeySchema(key_prefix).endpoint(endpoint)
    sender, receiver = make_queue(pickup_timeout_s=5), make_queue()

    # When a sender calls it, notifies it, or a receiver takes from it
    request = Request(endpoint=endpoint, method="m")
    with pytest.raises(ConfigurationError) as by_call:
        await asyncio.wait_for(sender.queue_and_wait(request), 10)
    with pytest.raises(ConfigurationError):
        await sender.notify(endpoint, "m")
    with pytest.raises(ConfigurationError) as by_take:
        await receiver.dequeue(endpoint, timeout_s=0)

    # Then each is refused with what to do, and nothing was queued in the new layout
    for raised in (by_call, by_take):
        message = str(raised.value)
        assert levels in message and f"{keys.tag}:q:*" in message
        assert "previous prq version" in message and "Drain" in message
    assert not redis_client.exists(keys.levels, keys.request(request.id))
    assert not redis_client.keys(f"{keys.level_prefix}*")
    # ... and the old request is left as it was, for the previous receivers to drain
    assert redis_client.zrange(level, 0, -1) == [b"old-1"]
    assert redis_client.hget(keys.request("old-1"), "st") == b"queued"

    # When the previous layout's lanes are gone (drained, or deleted as the message says)
    redis_client.delete(levels, level, f"{keys.tag}:q:0:vt")

    # Then the same nodes use the endpoint: a call is queued and taken
    call = asyncio.ensure_future(sender.call(endpoint, "again"))
    taken = await receiver.dequeue(endpoint, timeout_s=5)
    assert taken is not None and taken.request.method == "again"
    assert queue_depth(redis_client, keys) == 0
    call.cancel()
    await asyncio.gather(call, return_exceptions=True)


async def test_an_endpoint_without_the_previous_layout_is_not_affected_by_its_neighbour(
    make_queue: QueueFactory, redis_client: redis.Redis, key_prefix: str
) -> None:
    # Given one endpoint with the previous layout's lanes and one without
    write_old_layout(redis_client, key_prefix, "poll://old-next-door")
    sender, receiver = make_queue(pickup_timeout_s=5), make_queue()
    endpoint = "poll://new-layout"

    # When a request is sent to the other one
    call = asyncio.ensure_future(sender.call(endpoint, "m"))
    taken = await receiver.dequeue(endpoint, timeout_s=5)

    # Then it is queued and taken as usual
    assert taken is not None and taken.request.method == "m"
    call.cancel()
    await asyncio.gather(call, return_exceptions=True)


def test_bulk_senders_refuse_an_endpoint_holding_the_previous_layout(
    redis_url: str, redis_client: redis.Redis, key_prefix: str
) -> None:
    # Given an endpoint holding a request queued by the previous layout, and one without
    endpoint, clean = "poll://old-layout-bulk", "poll://new-layout-bulk"
    levels, _ = write_old_layout(redis_client, key_prefix, endpoint)
    keys = KeySchema(key_prefix).endpoint(endpoint)
    with BulkClient.from_url(redis_url, prefix=key_prefix) as bulk:
        # When a batch for it is enqueued in bulk (alone, or beside the clean endpoint)
        for batch in (
            [Request(endpoint=endpoint, method="m", id="bulk-1")],
            [Request(endpoint=clean, method="m", id="c-1"), Request(endpoint=endpoint, method="m")],
        ):
            # Then it is refused with what to do, before anything of the batch is written
            with pytest.raises(ConfigurationError, match="previous prq version") as raised:
                bulk.enqueue_many(batch)
            assert levels in str(raised.value)
        assert not redis_client.exists(keys.request("bulk-1"))
        assert not redis_client.exists(KeySchema(key_prefix).endpoint(clean).request("c-1"))
        # And once the old lanes are gone, the same client enqueues there
        redis_client.delete(levels, f"{keys.tag}:q:0", f"{keys.tag}:q:0:vt")
        assert bulk.enqueue_many([Request(endpoint=endpoint, method="m", id="bulk-1")]).accepted
