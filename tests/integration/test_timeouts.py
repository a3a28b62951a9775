"""Timeouts and loss: pickup timeout, a picked-up request outliving it, data loss in Redis."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis

from prq import DataLoss, PickupTimeout, Request, RequestState, Response
from tests.queue_facades import QueueFactory, wait_for_state
from tests.redis_servers import async_wait_until

pytestmark = pytest.mark.integration

#: A short pickup timeout, and the slack allowed on top of it (one poll and a thread hop).
PICKUP_TIMEOUT_S = 0.5
SLACK_S = 1.5


async def test_a_request_nobody_picks_up_times_out_and_is_never_handed_out(
    make_queue: QueueFactory,
) -> None:
    # Given a sender with a 0.5 s pickup timeout and no receiver on the endpoint
    sender = make_queue(pickup_timeout_s=PICKUP_TIMEOUT_S)
    receiver = make_queue()
    endpoint = "poll://nobody-home"
    request = Request(endpoint=endpoint, method="m")
    await sender.start()

    # When it waits for a response
    started = time.monotonic()
    with pytest.raises(PickupTimeout) as raised:
        await asyncio.wait_for(sender.queue_and_wait(request), 10)
    elapsed = time.monotonic() - started

    # Then it gets PickupTimeout after about the pickup timeout, marked safe to retry
    assert PICKUP_TIMEOUT_S - 0.05 <= elapsed <= PICKUP_TIMEOUT_S + SLACK_S
    error = raised.value
    assert (error.request_id, error.endpoint) == (request.id, endpoint)
    assert error.retryable and not error.maybe_executed
    status = await sender.status(request.id)
    assert (status.state, status.reason) == (RequestState.WITHDRAWN, "pickup_timeout")
    # And a receiver that comes later never gets it
    assert await asyncio.wait_for(receiver.dequeue(endpoint, timeout_s=0.3), 10) is None


async def test_a_per_call_pickup_timeout_overrides_the_queue_default(
    make_queue: QueueFactory,
) -> None:
    # Given a sender whose default pickup timeout is long
    sender = make_queue(pickup_timeout_s=60)
    await sender.start()

    # When one call passes pickup_timeout_s=0.5 and nobody serves the endpoint
    started = time.monotonic()
    with pytest.raises(PickupTimeout):
        await asyncio.wait_for(
            sender.call("poll://nobody-home", "m", pickup_timeout_s=PICKUP_TIMEOUT_S), 10
        )

    # Then that call times out after its own pickup timeout
    assert time.monotonic() - started <= PICKUP_TIMEOUT_S + SLACK_S


async def test_a_picked_up_request_waits_past_the_pickup_timeout_for_its_response(
    make_queue: QueueFactory,
) -> None:
    # Given a call with a 0.5 s pickup timeout that a receiver picks up at once
    sender = make_queue(pickup_timeout_s=PICKUP_TIMEOUT_S)
    receiver = make_queue()
    endpoint = "poll://slow-service"
    request = Request(endpoint=endpoint, method="m")
    call = asyncio.create_task(sender.queue_and_wait(request))
    pending = await asyncio.wait_for(receiver.dequeue(endpoint, timeout_s=5), 10)
    assert pending is not None and pending.id == request.id
    taken_at = time.monotonic()

    # When the service takes three times the pickup timeout to answer
    await async_wait_until(lambda: time.monotonic() - taken_at > 3 * PICKUP_TIMEOUT_S, 5)
    assert not call.done(), "the caller gave up on a request that was picked up"
    assert (await sender.status(request.id)).state == RequestState.TAKEN
    await receiver.apply_response(Response(id=request.id, result="late but fine"))

    # Then the caller gets the response
    assert (await asyncio.wait_for(call, 10)).result == "late but fine"


async def test_a_request_lost_from_redis_fails_its_caller_with_data_loss(
    make_own_queue: QueueFactory, own_redis_client: redis.Redis
) -> None:
    # Given a caller waiting on a queued request on a server of the test's own
    poll_interval_s = 0.5
    sender = make_own_queue(poll_interval_s=poll_interval_s, pickup_timeout_s=30)
    request = Request(endpoint="poll://doomed", method="m")
    call = asyncio.create_task(sender.queue_and_wait(request))
    await wait_for_state(sender, request.id, RequestState.QUEUED)

    # When Redis loses its data
    own_redis_client.flushdb()
    lost_at = time.monotonic()

    # Then the caller gets DataLoss within about one poll interval, marked retryable
    with pytest.raises(DataLoss) as raised:
        await asyncio.wait_for(call, 10)
    assert time.monotonic() - lost_at <= poll_interval_s + 1.0
    assert raised.value.retryable
