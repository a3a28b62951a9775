"""Pulses are hints: with every pub/sub message to a node lost, its calls still complete.

A node whose pub/sub messages are all dropped (its router sees nothing) must still get each
response and each request by polling, at a cost of about one poll interval; a receiver whose
hand-off pulse is lost finds the request in its take receipt.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import redis

from prq import Request, Response
from tests.queue_facades import AnyQueue, QueueFactory, SyncQueueAdapter
from tests.redis_servers import async_wait_until

pytestmark = pytest.mark.integration

POLL_S = 0.5
#: Generous bound per call: two poll intervals, a long-poll slice, and a margin.
PER_CALL_BOUND_S = 4 * POLL_S + 2.0
CALLS = 5


def deafen(queue: AnyQueue) -> None:
    """Drop every pub/sub message this node receives (as if pub/sub lost them all)."""
    raw = queue.raw if isinstance(queue, SyncQueueAdapter) else queue
    raw._router.dispatch = lambda channel, data: None  # type: ignore[method-assign]


def echo(request: Request) -> object:
    return request.params


@pytest.mark.parametrize("deaf", ["sender", "receiver", "both"])
async def test_calls_complete_when_every_pulse_is_lost(make_queue: QueueFactory, deaf: str) -> None:
    # Given a sender and a receiver, one or both of which never see a pub/sub message
    sender = make_queue(poll_interval_s=POLL_S)
    receiver = make_queue(poll_interval_s=POLL_S, dequeue_timeout_s=5)
    await sender.start()
    await receiver.start()
    if deaf in ("sender", "both"):
        deafen(sender)
    if deaf in ("receiver", "both"):
        deafen(receiver)
    make_queue.serve(receiver, "poll://deaf", echo)

    # When calls are made one after another
    for i in range(CALLS):
        started = time.monotonic()
        result = await asyncio.wait_for(sender.call("poll://deaf", "m", i), PER_CALL_BOUND_S)
        elapsed = time.monotonic() - started
        # Then each one completes, within a couple of poll intervals
        assert result == i
        assert elapsed < PER_CALL_BOUND_S
    print(f"deaf={deaf}: {CALLS} calls completed by polling")


async def test_a_lost_handoff_pulse_is_found_in_the_take_receipt(
    make_queue: QueueFactory, redis_client: redis.Redis
) -> None:
    # Given a receiver waiting in dequeue (so its take token is parked), deaf to pub/sub
    receiver = make_queue(poll_interval_s=POLL_S)
    sender = make_queue(poll_interval_s=POLL_S)
    await receiver.start()
    deafen(receiver)
    waiting = asyncio.ensure_future(receiver.dequeue("poll://handoff", timeout_s=10))
    parks = sender.keys.endpoint("poll://handoff").parks
    await async_wait_until(lambda: redis_client.hlen(parks) == 1, 5, 0.02, "receiver parked")

    # When a request is enqueued: it is handed to the parked token, and its pulse is lost
    call = asyncio.ensure_future(sender.call("poll://handoff", "m", "x", pickup_timeout_s=10))
    pending = await asyncio.wait_for(waiting, 4 * POLL_S + 2)

    # Then the receiver still gets it (its next take reads the receipt), and can answer it
    assert pending is not None and pending.request.params == "x"
    await receiver.apply_response(Response(id=pending.id, result="done"))
    assert await asyncio.wait_for(call, 5) == "done"
