"""Heartbeats both ways: a silent receiver is lost, a silent sender cancels the request, a busy
handler is never declared dead, fast calls beat not at all, and a zombie receiver is fenced."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis

from prq import QueueShutdown, ReceiverLost, Request, Response
from tests.queue_facades import AnyQueue, QueueFactory, SyncQueueAdapter
from tests.redis_servers import async_wait_until

pytestmark = pytest.mark.integration

#: Shrunk liveness timings (production: beat 15 s after 7 s, receiver 60 s, sender 90 s).
LIVENESS: dict[str, Any] = {
    "heartbeat_interval_s": 0.2,
    "heartbeat_initial_delay_s": 0.1,
    "receiver_timeout_s": 1.0,
    "sender_timeout_s": 1.2,
    "poll_interval_s": 0.2,
}


def silence(queue: AnyQueue) -> None:
    """Stop this node's heartbeats (as if its beats no longer reached Redis)."""
    raw = queue.raw if isinstance(queue, SyncQueueAdapter) else queue
    raw._watch.liveness.due = lambda now: []  # type: ignore[method-assign]


async def test_a_silent_receiver_is_declared_lost_and_its_late_response_is_fenced(
    make_queue: QueueFactory,
) -> None:
    # Given a receiver that takes a request and then falls silent (no beats)
    sender, zombie = make_queue(**LIVENESS), make_queue(**LIVENESS)
    silence(zombie)
    request = Request(endpoint="poll://zombie", method="m")
    call = asyncio.create_task(sender.queue_and_wait(request, pickup_timeout_s=5))
    pending = await zombie.dequeue("poll://zombie", timeout_s=5)
    assert pending is not None
    started = time.monotonic()

    # When the receiver timeout passes
    with pytest.raises(ReceiverLost) as raised:
        await asyncio.wait_for(call, 10)

    # Then the caller gets ReceiverLost (retryable, may have run), within timeout + 1 s
    elapsed = time.monotonic() - started
    print(f"ReceiverLost after {elapsed:.2f} s (receiver timeout 1.0 s)")
    assert raised.value.retryable and raised.value.maybe_executed
    assert elapsed < LIVENESS["receiver_timeout_s"] + 1.0
    # And the zombie's late response is not applied
    await zombie.apply_response(Response(id=request.id, result="zombie"))
    status = await sender.status(request.id)
    assert (status.state, status.reason) == ("cancelled", "receiver_lost")


async def test_a_silent_sender_cancels_the_receivers_request(make_queue: QueueFactory) -> None:
    # Given a request picked up by a beating receiver, whose sender then goes away
    sender, receiver = make_queue(**LIVENESS), make_queue(**LIVENESS)
    silence(sender)
    request = Request(endpoint="poll://orphan", method="m")
    call = asyncio.create_task(sender.queue_and_wait(request, pickup_timeout_s=5))
    pending = await receiver.dequeue("poll://orphan", timeout_s=5)
    assert pending is not None
    started = time.monotonic()
    await sender.aclose()
    with pytest.raises(QueueShutdown):
        await asyncio.wait_for(call, 10)

    # When the sender timeout passes
    await async_wait_until(lambda: pending.cancelled, 5, 0.02, "request cancelled")

    # Then the receiver's request is cancelled with reason sender_lost, within timeout + 1 s
    elapsed = time.monotonic() - started
    print(f"sender_lost after {elapsed:.2f} s (sender timeout 1.2 s)")
    assert pending.cancel_reason == "sender_lost"
    assert elapsed < LIVENESS["sender_timeout_s"] + 1.0


async def test_a_busy_handler_is_never_declared_dead(make_queue: QueueFactory) -> None:
    # Given a handler that keeps its thread busy (CPU) for 1.5 receiver timeouts of 2 s (the
    # node's beats, every 0.2 s, compete with it for the interpreter, and on a loaded machine
    # for the CPU: timeouts of 1 s left them 0.8 s of slack for 3 s)
    timings = {**LIVENESS, "receiver_timeout_s": 2.0, "sender_timeout_s": 2.0}
    sender, receiver = make_queue(**timings), make_queue(**timings)

    def busy(request: Request) -> object:
        deadline = time.monotonic() + 1.5 * timings["receiver_timeout_s"]
        spins = 0
        while time.monotonic() < deadline:
            spins += 1
        return spins > 0

    make_queue.serve(receiver, "poll://busy", busy)
    # When a call is made, Then it completes: the node's beats go on beside the handler
    assert await asyncio.wait_for(sender.call("poll://busy", "m"), 20) is True
    assert receiver.stats.heartbeats_sent > 0


async def test_a_fast_call_sends_no_heartbeat(make_queue: QueueFactory) -> None:
    # Given default heartbeat timings (first beat after 7 s)
    sender, receiver = make_queue(), make_queue()
    make_queue.serve(receiver, "poll://fast", lambda request: request.params)
    # When fast calls run
    for i in range(20):
        assert await asyncio.wait_for(sender.call("poll://fast", "m", i), 10) == i
    # Then neither side beat (and no subscription was made per request)
    assert sender.stats.heartbeats_sent == 0
    assert receiver.stats.heartbeats_sent == 0
    assert sender.stats.subscriptions == 1
    assert receiver.stats.subscriptions == 2


async def test_a_request_handed_to_an_idle_receiver_gets_its_first_beat_in_time(
    make_queue: QueueFactory, redis_client: redis.Redis
) -> None:
    # Given an idle receiver parked for a request, whose watch loop sleeps a poll interval
    # (5 s) between turns when nothing is due: far longer than its first-beat delay (0.1 s)
    # and its callers' receiver timeout (1 s)
    sender = make_queue()  # (it judges no receiver within the test: the beat is measured)
    receiver = make_queue(**{**LIVENESS, "poll_interval_s": 5.0})
    keys = receiver.keys.endpoint("poll://first-beat")
    take = asyncio.create_task(receiver.dequeue("poll://first-beat", timeout_s=10))
    await async_wait_until(lambda: redis_client.llen(keys.parked) > 0, 5, 0.02, "parked")
    request = Request(endpoint="poll://first-beat", method="m")
    call = asyncio.create_task(sender.queue_and_wait(request, pickup_timeout_s=5))
    try:
        # When it is handed a request, and holds it
        pending = await asyncio.wait_for(take, 10)
        assert pending is not None

        # Then its first beat is written after the first-beat delay (the loop was woken for
        # the new lease), not once the loop's sleep ends (up to 5 s after the take: a caller
        # judging receivers silent after 1 s declared it lost first)
        stored = keys.request(request.id)
        await async_wait_until(
            lambda: redis_client.hget(stored, "hr") is not None, 2.5, 0.02, "the first beat"
        )
        taken, beat = redis_client.hmget(stored, "tk", "hr")  # (server time, ms)
        assert isinstance(taken, bytes) and isinstance(beat, bytes)
        assert int(beat) - int(taken) < 2500, (taken, beat)
        await receiver.apply_response(Response(id=request.id, result="ok"))
        assert (await asyncio.wait_for(call, 10)).result == "ok"
    finally:
        call.cancel()
