"""Dequeue: FIFO order, competing receivers, a pulse wakes a waiting dequeue, idle long-polls."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis

from prq import PendingRequest, Request, RequestState, Response
from tests.queue_facades import AnyQueue, QueueFactory, run_all, wait_for_state
from tests.redis_servers import async_wait_until, subscribers

pytestmark = pytest.mark.integration

#: Waiting dequeuers in the competing-receivers test, and the nodes they are spread over.
DEQUEUERS = 30
RECEIVER_NODES = 3
#: Slack on top of a long-poll: the time one more poll and the thread hop may take.
LONG_POLL_SLACK_S = 1.5


async def test_three_requests_come_out_in_fifo_order(make_queue: QueueFactory) -> None:
    # Given three calls to one endpoint, each enqueued only after the previous one is queued
    sender, receiver = make_queue(pickup_timeout_s=30), make_queue()
    endpoint = "poll://fifo"
    requests = [Request(endpoint=endpoint, method="m", params=i) for i in range(3)]
    calls = []
    for request in requests:
        calls.append(asyncio.create_task(sender.queue_and_wait(request)))
        await wait_for_state(sender, request.id, RequestState.QUEUED)

    # When a receiver dequeues three times
    taken = [await receiver.dequeue(endpoint, timeout_s=5) for _ in requests]

    # Then it gets them in the order they were enqueued
    assert [p.id if p else None for p in taken] == [r.id for r in requests]
    for pending in taken:
        assert pending is not None
        await receiver.apply_response(Response(id=pending.id, result=pending.request.params))
    responses = await asyncio.wait_for(asyncio.gather(*calls), 10)
    assert [r.result for r in responses] == [0, 1, 2]


async def test_one_request_goes_to_exactly_one_of_30_waiting_dequeuers(
    make_queue: QueueFactory, redis_client: redis.Redis
) -> None:
    # Given 30 dequeuers spread over 3 receiver nodes, all waiting before the request exists
    sender = make_queue(pickup_timeout_s=30)
    receivers = [make_queue(poll_interval_s=0.5) for _ in range(RECEIVER_NODES)]
    endpoint = "poll://contended"
    long_poll_s = 2.0
    outcomes: list[tuple[AnyQueue, PendingRequest | None, float]] = []

    async def dequeue(queue: AnyQueue) -> None:
        started = time.monotonic()
        pending = await queue.dequeue(endpoint, timeout_s=long_poll_s)
        outcomes.append((queue, pending, time.monotonic() - started))

    waiting = [
        asyncio.create_task(dequeue(receivers[i % RECEIVER_NODES])) for i in range(DEQUEUERS)
    ]
    channel = sender.keys.endpoint(endpoint).pulse_channel
    await async_wait_until(lambda: subscribers(redis_client, channel) == RECEIVER_NODES, 5)

    # When one request is sent
    request = Request(endpoint=endpoint, method="m", params="only")
    call = asyncio.create_task(sender.queue_and_wait(request))
    await asyncio.wait_for(asyncio.gather(*waiting), long_poll_s + 10)

    # Then exactly one dequeuer got it, and the other 29 returned None after their long-poll
    winners = [(q, p) for q, p, _ in outcomes if p is not None]
    assert len(outcomes) == DEQUEUERS
    assert [p.id for _, p in winners] == [request.id]
    idle = [elapsed for _, p, elapsed in outcomes if p is None]
    assert len(idle) == DEQUEUERS - 1
    assert min(idle) >= long_poll_s - 0.05
    assert max(idle) <= long_poll_s + LONG_POLL_SLACK_S + 1.0
    # And the winner's answer reaches the caller
    winner, pending = winners[0]
    await winner.apply_response(Response(id=pending.id, result="won"))
    assert (await asyncio.wait_for(call, 10)).result == "won"


async def test_a_waiting_dequeue_is_woken_by_the_enqueue_not_by_its_poll(
    make_queue: QueueFactory, redis_client: redis.Redis
) -> None:
    # Given a receiver that polls only every 5 s, already waiting in a 10 s long-poll
    poll_interval_s = 5.0
    receiver = make_queue(poll_interval_s=poll_interval_s)
    sender = make_queue()
    endpoint = "poll://prompt"
    await receiver.start()
    sent_before = receiver.stats.redis_commands
    dequeuing = asyncio.create_task(receiver.dequeue(endpoint, timeout_s=10))
    channel = receiver.keys.endpoint(endpoint).pulse_channel
    await async_wait_until(lambda: subscribers(redis_client, channel) == 1, 5)
    await async_wait_until(lambda: receiver.stats.redis_commands > sent_before, 5)  # 1st take

    # When a request is enqueued
    request = Request(endpoint=endpoint, method="m")
    started = time.monotonic()
    call = asyncio.create_task(sender.queue_and_wait(request))
    pending = await asyncio.wait_for(dequeuing, 10)
    elapsed = time.monotonic() - started

    # Then the dequeue returns it promptly (the enqueue's pulse woke it, not its next poll)
    assert pending is not None and pending.id == request.id
    assert elapsed < 1.5, f"dequeue took {elapsed:.2f} s; its poll interval is {poll_interval_s} s"
    await receiver.apply_response(Response(id=pending.id, result=1))
    assert (await asyncio.wait_for(call, 10)).result == 1


async def test_an_idle_dequeue_returns_none_after_its_long_poll(make_queue: QueueFactory) -> None:
    # Given a receiver whose default long-poll is 1 s, and an endpoint with nothing queued
    receiver = make_queue(dequeue_timeout_s=1.0)
    await receiver.start()
    endpoint = "poll://idle"

    # When it dequeues with timeout_s=0.5, then with the default
    started = time.monotonic()
    explicit = await asyncio.wait_for(receiver.dequeue(endpoint, timeout_s=0.5), 10)
    explicit_s = time.monotonic() - started
    started = time.monotonic()
    default = await asyncio.wait_for(receiver.dequeue(endpoint), 10)
    default_s = time.monotonic() - started

    # Then both return None, each after its long-poll and not much later
    assert explicit is None and default is None
    assert 0.5 - 0.05 <= explicit_s <= 0.5 + LONG_POLL_SLACK_S
    assert 1.0 - 0.05 <= default_s <= 1.0 + LONG_POLL_SLACK_S


async def test_dequeue_many_takes_what_is_queued_in_one_step(make_queue: QueueFactory) -> None:
    # Given five queued calls
    sender, receiver = make_queue(pickup_timeout_s=30), make_queue()
    endpoint = "poll://batch"
    requests = [Request(endpoint=endpoint, method="m", params=i) for i in range(5)]
    calls = []
    for request in requests:
        calls.append(asyncio.create_task(sender.queue_and_wait(request)))
        await wait_for_state(sender, request.id, RequestState.QUEUED)

    # When a receiver asks for up to 3, then up to 10
    first = await receiver.dequeue_many(endpoint, 3, timeout_s=5)
    second = await receiver.dequeue_many(endpoint, 10, timeout_s=5)

    # Then it gets 3, then the remaining 2, in order
    assert [p.id for p in first] == [r.id for r in requests[:3]]
    assert [p.id for p in second] == [r.id for r in requests[3:]]
    for pending in [*first, *second]:
        await receiver.apply_response(Response(id=pending.id, result=pending.request.params))
    results = await run_all((asyncio.wait_for(c, 10) for c in calls), 15)
    assert [r.result for r in results] == list(range(5))
