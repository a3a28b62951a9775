"""cancel(), status() and idempotent enqueue (the same request id sent twice)."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
import redis

from prq import CancelledAfterPickup, CancelledBeforePickup, Request, RequestState, Response
from tests.queue_facades import QueueFactory, run_all, wait_for_state
from tests.redis_servers import async_wait_until

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("canceller", ["sender", "another node"])
async def test_cancel_before_pickup_withdraws_the_request(
    make_queue: QueueFactory, canceller: str
) -> None:
    # Given a queued call that no receiver has picked up
    sender, receiver, other = make_queue(pickup_timeout_s=30), make_queue(), make_queue()
    endpoint = "poll://cancel-me"
    request = Request(endpoint=endpoint, method="m")
    call = asyncio.create_task(sender.queue_and_wait(request))
    await wait_for_state(sender, request.id, RequestState.QUEUED)

    # When it is cancelled (by the sender, or by a node that only knows the id)
    node = sender if canceller == "sender" else other
    cancelled_at = time.monotonic()
    assert await node.cancel(request.id) is True

    # Then the caller gets CancelledBeforePickup promptly (not after its pickup timeout)
    with pytest.raises(CancelledBeforePickup) as raised:
        await asyncio.wait_for(call, 10)
    assert time.monotonic() - cancelled_at < 2.0
    assert raised.value.request_id == request.id and not raised.value.maybe_executed
    # And the request is withdrawn: a later dequeue gets nothing
    assert await receiver.dequeue(endpoint, timeout_s=0.3) is None
    status = await other.status(request.id)
    assert (status.state, status.reason) == (RequestState.WITHDRAWN, "cancelled")
    # And cancelling again withdraws nothing more ("True if this call withdrew it")
    assert await node.cancel(request.id) is False


async def test_cancel_of_an_unknown_request_returns_false(make_queue: QueueFactory) -> None:
    # When an id is cancelled that Redis never saw
    # Then nothing is cancelled
    assert await make_queue().cancel(uuid.uuid4().hex) is False


async def test_cancel_after_pickup_signals_the_receiver_and_fails_the_caller(
    make_queue: QueueFactory,
) -> None:
    # Given a request that a receiver has picked up
    sender, receiver, other = make_queue(pickup_timeout_s=30), make_queue(), make_queue()
    endpoint = "poll://busy"
    request = Request(endpoint=endpoint, method="m")
    call = asyncio.create_task(sender.queue_and_wait(request))
    pending = await receiver.dequeue(endpoint, timeout_s=5)
    assert pending is not None and not pending.cancelled

    # When a third node cancels it (it knows only the id)
    started = time.monotonic()
    assert await other.cancel(request.id) is True

    # Then the receiver's PendingRequest is signalled, with the reason
    await async_wait_until(lambda: pending.cancelled, 5, 0.01, "receiver signalled")
    assert pending.cancel_reason == "cancelled"
    # And the caller fails with CancelledAfterPickup (maybe executed), promptly
    with pytest.raises(CancelledAfterPickup) as raised:
        await asyncio.wait_for(call, 5)
    assert raised.value.maybe_executed
    assert time.monotonic() - started < 2.0
    # And a response applied afterwards is dropped; a second cancel changes nothing
    await receiver.apply_response(Response(id=request.id, result="late"))
    assert await other.cancel(request.id) is False
    status = await other.status(request.id)
    assert (status.state, status.reason) == (RequestState.CANCELLED, "cancelled")


async def test_status_reports_queued_taken_done_and_unknown(make_queue: QueueFactory) -> None:
    # Given a sender, a receiver, and a third node that only knows request ids
    sender, receiver, observer = make_queue(pickup_timeout_s=30), make_queue(), make_queue()
    endpoint = "poll://status"
    request = Request(endpoint=endpoint, method="m")

    # When the request is queued, then taken, then answered
    call = asyncio.create_task(sender.queue_and_wait(request))
    await wait_for_state(sender, request.id, RequestState.QUEUED)
    queued = await observer.status(request.id)
    pending = await receiver.dequeue(endpoint, timeout_s=5)
    assert pending is not None
    taken = await observer.status(request.id)
    await receiver.apply_response(Response(id=request.id, result=1))
    await asyncio.wait_for(call, 10)
    done = await observer.status(request.id)
    unknown = await observer.status(uuid.uuid4().hex)

    # Then each status says so, from any node
    assert (queued.state, queued.endpoint) == (RequestState.QUEUED, endpoint)
    assert taken.state == RequestState.TAKEN and taken.attempt == 1
    assert done.state == RequestState.DONE
    assert queued.created_ms is not None and taken.taken_ms is not None and done.done_ms
    assert queued.created_ms <= taken.taken_ms <= done.done_ms
    assert unknown.state == RequestState.UNKNOWN and unknown.endpoint is None


def watchers(client: redis.Redis, key: str) -> str:
    """The nodes besides the first sender waiting on a request (enqueue.lua's field `w`)."""
    raw = client.hget(key, "w")
    return raw.decode() if isinstance(raw, bytes) else ""


async def test_the_same_request_id_is_enqueued_once_and_both_callers_get_its_response(
    make_queue: QueueFactory, redis_client: redis.Redis
) -> None:
    # Given two sender nodes calling with the same request id, the second while it is queued
    first, second, third = (make_queue(pickup_timeout_s=30) for _ in range(3))
    receiver = make_queue()
    endpoint = "poll://idempotent"
    request = Request(endpoint=endpoint, method="m", params="once")
    call_1 = asyncio.create_task(first.queue_and_wait(request))
    await wait_for_state(first, request.id, RequestState.QUEUED)
    call_2 = asyncio.create_task(second.queue_and_wait(request))
    key = first.keys.endpoint(endpoint).request(request.id)
    await async_wait_until(lambda: second.node_id in watchers(redis_client, key), 5)

    # When a receiver drains the endpoint and answers what it got
    pending = await receiver.dequeue(endpoint, timeout_s=5)
    assert pending is not None and pending.id == request.id
    assert await receiver.dequeue(endpoint, timeout_s=0.3) is None
    await receiver.apply_response(Response(id=request.id, result="ran once"))

    # Then both callers get that one response
    responses = await run_all([asyncio.wait_for(call_1, 10), asyncio.wait_for(call_2, 10)], 15)
    assert responses == [Response(id=request.id, result="ran once")] * 2

    # And a third call with the same id, after completion, returns the stored response at once
    # without anything being enqueued again
    started = time.monotonic()
    again = await asyncio.wait_for(third.queue_and_wait(request), 10)
    assert again == Response(id=request.id, result="ran once")
    assert time.monotonic() - started < 1.0
    assert await receiver.dequeue(endpoint, timeout_s=0.3) is None
