"""Per-endpoint capacity limits (prq.protocol.limits): max_pending refuses enqueues, max_in_flight
caps what all receivers hold at once, and a dead receiver's slot frees by itself."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
import redis

from prq import (
    CancelledBeforePickup,
    EndpointLimits,
    InvalidEndpoint,
    InvalidSettings,
    QueueFull,
    Request,
    RequestState,
    Response,
)
from prq.bulk import BatchRefused, BulkClient
from tests.queue_facades import QueueFactory, RunningCount, wait_for_state
from tests.queued import queue_depth, silent_take
from tests.redis_servers import async_wait_until

pytestmark = pytest.mark.integration


async def test_limits_are_shared_replaced_and_validated(
    make_queue: QueueFactory, redis_client: redis.Redis
) -> None:
    # Given two nodes
    one, other = make_queue(), make_queue()
    endpoint = "poll://limited"
    assert await one.limits(endpoint) == EndpointLimits(endpoint=endpoint)

    # When one sets limits, Then the other reads the same
    await one.set_limits(endpoint, max_in_flight=3, max_pending=100)
    assert await other.limits(endpoint) == EndpointLimits(
        endpoint=endpoint, max_in_flight=3, max_pending=100
    )
    # And setting replaces both: an omitted limit is removed
    await other.set_limits(endpoint, max_pending=7)
    assert await one.limits(endpoint) == EndpointLimits(endpoint=endpoint, max_pending=7)
    # And clearing both leaves no key behind
    await one.set_limits(endpoint)
    assert not redis_client.exists(one.keys.endpoint(endpoint).limits)
    # And nonsense is refused before anything is written
    for bad in ({"max_pending": 0}, {"max_in_flight": -1}, {"max_pending": "many"}):
        with pytest.raises(InvalidSettings, match="invalid limits: max_"):
            await one.set_limits(endpoint, **bad)
    with pytest.raises(InvalidEndpoint):
        await one.set_limits("poll://bad\nname", max_pending=1)
    # And a malformed stored limit is reported, not guessed
    redis_client.hset(one.keys.endpoint(endpoint).limits, "mp", "lots")
    with pytest.raises(Exception, match="not a positive integer"):
        await one.limits(endpoint)


async def test_an_enqueue_beyond_max_pending_raises_queue_full_and_writes_nothing(
    make_queue: QueueFactory,
) -> None:
    # Given an endpoint limited to 2 queued requests, and no receiver
    sender = make_queue(pickup_timeout_s=30)
    endpoint = "poll://limited-pending"
    await sender.set_limits(endpoint, max_pending=2)
    waiting = [Request(endpoint=endpoint, method="m") for _ in range(2)]
    calls = [asyncio.ensure_future(sender.queue_and_wait(r)) for r in waiting]
    for request in waiting:
        await wait_for_state(sender, request.id, RequestState.QUEUED)

    # When a third request is enqueued
    third = Request(endpoint=endpoint, method="m")
    with pytest.raises(QueueFull) as refused:
        await sender.queue_and_wait(third)

    # Then it is refused at once, retryable, and nothing of it was written
    assert refused.value.retryable is True
    assert "max_pending is 2" in str(refused.value)
    assert (await sender.status(third.id)).state == RequestState.UNKNOWN
    # And once a queued request leaves, there is room again
    assert await sender.cancel(waiting[0].id) is True
    with pytest.raises(CancelledBeforePickup):
        await calls[0]
    fourth = asyncio.ensure_future(sender.queue_and_wait(third))
    await wait_for_state(sender, third.id, RequestState.QUEUED)
    for request in (waiting[1], third):
        assert await sender.cancel(request.id) is True
    for call in (calls[1], fourth):
        with pytest.raises(CancelledBeforePickup):
            await call


async def test_max_in_flight_caps_what_all_receivers_hold_at_once(
    make_queue: QueueFactory,
) -> None:
    # Given an endpoint limited to 3 requests in flight, and two receivers with 4 slots each
    endpoint = "poll://limited-flight"
    sender = make_queue()
    await sender.set_limits(endpoint, max_in_flight=3)
    work = RunningCount(0.05)

    for _ in range(2):
        make_queue.serve(make_queue(), endpoint, work, concurrency=4)

    # When 30 calls are made at once
    results = await asyncio.gather(
        *(sender.call(endpoint, "echo", i, timeout_s=30) for i in range(30))
    )

    # Then every call is answered, and never more than 3 ran at the same time, across both
    assert sorted(results) == list(range(30))
    assert work.most == 3


async def test_an_answer_wakes_a_receiver_waiting_for_the_slot_it_frees(
    make_queue: QueueFactory,
) -> None:
    # Given an endpoint limited to 1 request in flight, two receivers that poll only every 30 s,
    # one holding the slot and the other waiting for it (its take got nothing: capped)
    endpoint = "poll://limited-wake"
    quiet: dict[str, Any] = {"poll_interval_s": 30, "dequeue_timeout_s": 30}
    sender, holder, waiter = make_queue(), make_queue(**quiet), make_queue(**quiet)
    await sender.set_limits(endpoint, max_in_flight=1)
    first = await sender.notify(endpoint, "m")
    held = await holder.dequeue(endpoint, timeout_s=10)
    assert held is not None and held.id == first
    assert await waiter.dequeue(endpoint, timeout_s=0) is None  # (ready and subscribed)
    second = await sender.notify(endpoint, "m")
    sent = waiter.stats.round_trips
    waiting = asyncio.ensure_future(waiter.dequeue(endpoint, timeout_s=25))
    await async_wait_until(lambda: waiter.stats.round_trips > sent, 10)  # (its take)
    assert not waiting.done()

    # When the holder answers (its take saw the limit, so its answer looks for waiters)
    assert endpoint not in holder.ctx.unlimited
    await holder.apply_response(Response(id=first, result=1))

    # Then the waiter is woken at once and takes the second request, long before its next poll
    taken = await asyncio.wait_for(waiting, 10)
    assert taken is not None and taken.id == second
    await waiter.apply_response(Response(id=second, result=2))


async def test_answers_on_an_unlimited_endpoint_skip_the_freed_slot_check(
    make_queue: QueueFactory,
) -> None:
    # Given a receiver whose take found the endpoint unlimited
    endpoint = "poll://unlimited"
    sender, receiver = make_queue(), make_queue(poll_interval_s=0.5)
    first = await sender.notify(endpoint, "m")
    taken = await receiver.dequeue(endpoint, timeout_s=10)
    assert taken is not None
    assert endpoint in receiver.ctx.unlimited

    # When a limit is set after that take, and a second receiver waits for the slot
    await sender.set_limits(endpoint, max_in_flight=1)
    waiter = make_queue(poll_interval_s=0.5)
    second = await sender.notify(endpoint, "m")
    waiting = asyncio.ensure_future(waiter.dequeue(endpoint, timeout_s=20))

    # Then the answer (sent without the check) still frees the slot: the waiter's next poll
    # takes the request; and the receiver's next take learns of the limit
    await receiver.apply_response(Response(id=first, result=1))
    got = await asyncio.wait_for(waiting, 15)
    assert got is not None and got.id == second
    await waiter.apply_response(Response(id=second, result=2))
    assert await receiver.dequeue(endpoint, timeout_s=0) is None
    assert endpoint not in receiver.ctx.unlimited


async def test_a_dead_receivers_slot_frees_after_the_receiver_timeout(
    make_queue: QueueFactory, redis_client: redis.Redis, key_prefix: str
) -> None:
    # Given an endpoint limited to 1 request in flight, and a receiver that takes one and dies
    timings: dict[str, Any] = {"receiver_timeout_s": 1.0, "heartbeat_interval_s": 0.2,
               "heartbeat_initial_delay_s": 0.1}  # fmt: skip
    endpoint = "poll://limited-dead"
    sender, survivor = make_queue(**timings), make_queue(**timings)
    await sender.set_limits(endpoint, max_in_flight=1)
    first, second = (Request(endpoint=endpoint, method="m") for _ in range(2))
    pending = [asyncio.ensure_future(sender.queue_and_wait(r, timeout_s=30)) for r in (first,)]
    await wait_for_state(sender, first.id, RequestState.QUEUED)
    # a receiver takes it and dies holding it (no heartbeats; a queue closed gracefully would
    # give it back instead)
    held = silent_take(redis_client, key_prefix, endpoint)
    assert [i.request_id for i in held] == [first.id]
    pending.append(asyncio.ensure_future(sender.queue_and_wait(second, timeout_s=30)))
    await wait_for_state(sender, second.id, RequestState.QUEUED)

    # Then while its entry is fresh the slot stays taken: the survivor gets nothing
    assert await survivor.dequeue(endpoint, timeout_s=0.2) is None

    # And after the receiver timeout the slot is free again, and the survivor takes the second
    got: list[Any] = []

    async def took_second() -> bool:
        taken = await survivor.dequeue(endpoint, timeout_s=0.2)
        if taken is not None:
            got.append(taken)
        return bool(got)

    await async_wait_until(took_second, 10.0, 0.05, "the freed slot is used")
    assert got[0].id == second.id
    for call in pending:
        call.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


def test_a_bulk_batch_writes_what_fits_under_max_pending(
    redis_url: str, key_prefix: str, redis_client: redis.Redis
) -> None:
    # Given an endpoint that may hold 5 queued requests
    endpoint = "poll://limited-bulk"
    with BulkClient.from_url(redis_url, prefix=key_prefix) as bulk:
        redis_client.hset(bulk.keys.endpoint(endpoint).limits, "mp", 5)
        run = uuid.uuid4().hex[:6]
        batch = [Request(endpoint=endpoint, method="m", id=f"{run}:{i}") for i in range(8)]

        # When 8 are sent in one batch
        with pytest.raises(BatchRefused) as refused:
            bulk.enqueue_many(batch, nonce="batch-1")

        # Then 5 were written, 3 refused (retryable), and the error says so
        assert refused.value.partial.accepted == 5
        assert refused.value.refused == {endpoint: 3}
        assert refused.value.retryable is True
        pending = bulk.keys.endpoint(endpoint)
        assert queue_depth(redis_client, pending) == 5
        # And sent again with the same nonce once there is room, the batch counts all 8 as its own
        redis_client.hdel(bulk.keys.endpoint(endpoint).limits, "mp")
        again = bulk.enqueue_many(batch, nonce="batch-1")
        assert (again.accepted, again.duplicates) == (8, 0)
        assert queue_depth(redis_client, pending) == 8


async def test_a_malformed_stored_limit_is_no_limit(
    make_queue: QueueFactory, redis_client: redis.Redis
) -> None:
    # Given limits written straight into Redis as nonsense (not by set_limits)
    endpoint = "poll://limited-garbage"
    node = make_queue()
    redis_client.hset(node.keys.endpoint(endpoint).limits, mapping={"mif": "0", "mp": "-3"})
    make_queue.serve(make_queue(), endpoint, lambda request: request.params, concurrency=2)

    # Then they hold nothing back: calls are enqueued and answered as without limits
    results = await asyncio.gather(*(node.call(endpoint, "m", i, timeout_s=30) for i in range(5)))
    assert sorted(results) == list(range(5))
