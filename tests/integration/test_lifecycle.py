"""Closing a node: its waiting callers fail with QueueShutdown and it leaves no connection open."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import redis

from prq import PrqError, QueueShutdown, RedisSettings, Request, RequestState
from prq.embedded import EmbeddedRedis
from tests.fault.proxy import FaultProxy
from tests.queue_facades import QueueFactory, wait_for_state
from tests.queued import queue_depth
from tests.redis_servers import async_wait_until

pytestmark = pytest.mark.integration

#: Calls waiting when the node closes (the sync facade has one thread per waiting call).
WAITING_CALLS = {"async": 2_000, "sync": 200}
#: The socket timeout of the node whose background turn hangs: far longer than its close may
#: take.
HANGING_SOCKET_S = 20.0
#: How long that close may take (a second or so: the watch turn is waited for briefly).
CLOSE_BOUND_S = 5.0


def connected_clients(client: redis.Redis) -> int:
    return len(client.client_list())


@pytest.mark.parametrize("when", ["all queued", "mid-burst"])
async def test_closing_a_node_fails_its_callers_and_closes_its_connections(
    make_own_queue: QueueFactory, own_redis_client: redis.Redis, facade: str, when: str
) -> None:
    # Given a started node with many calls waiting (no receiver), either all enqueued already
    # or still being sent
    sender = make_own_queue(pickup_timeout_s=60)
    await sender.start()
    endpoint = "poll://nobody"
    pending_list = sender.keys.endpoint(endpoint)
    count = WAITING_CALLS[facade]
    calls = [asyncio.create_task(sender.call(endpoint, "m", i)) for i in range(count)]
    enqueued = count if when == "all queued" else 1
    await async_wait_until(lambda: queue_depth(own_redis_client, pending_list) >= enqueued, 20)

    # When the node closes
    await asyncio.wait_for(sender.aclose(), 10)

    # Then every waiting caller fails with QueueShutdown, promptly
    outcomes = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 10)
    kinds = {type(outcome).__name__ for outcome in outcomes}
    assert kinds == {QueueShutdown.__name__}, kinds
    # And none of the node's connections stays open on the server (only this test's client)
    await async_wait_until(lambda: connected_clients(own_redis_client) == 1, 5)
    # And a caller whose request reached Redis is told it may run (so a retry reuses the id)
    if when == "all queued":
        assert all(isinstance(o, PrqError) and o.maybe_executed for o in outcomes)


async def test_a_call_cut_short_by_closing_while_it_runs_says_it_may_have_run(
    make_queue: QueueFactory,
) -> None:
    # Given a call whose request a receiver is running
    sender, receiver = make_queue(), make_queue()
    endpoint = "poll://closed-mid-run"
    release = threading.Event()

    def handler(request: Request) -> str:
        release.wait(30)  # the handler's work: held until the test lets it go
        return "ran"

    make_queue.serve(receiver, endpoint, handler)
    request = Request(endpoint=endpoint, method="m")
    try:
        call = asyncio.create_task(sender.queue_and_wait(request))
        await wait_for_state(sender, request.id, RequestState.TAKEN)
        # When the sender's queue closes
        await asyncio.wait_for(sender.aclose(), 10)
        # Then the caller learns it may have run (retrying elsewhere with the same id is safe)
        with pytest.raises(QueueShutdown) as caught:
            await asyncio.wait_for(call, 10)
        assert caught.value.maybe_executed is True and caught.value.retryable is True
    finally:
        release.set()
    # And a call on a queue already closed sent nothing: it says so
    with pytest.raises(QueueShutdown) as refused:
        await sender.call(endpoint, "m")
    assert refused.value.maybe_executed is False


async def test_a_close_does_not_wait_for_a_background_turn_that_redis_does_not_answer(
    own_redis: EmbeddedRedis, key_prefix: str, facade: str
) -> None:
    # Given a started node that reaches Redis through a proxy, with a long socket timeout
    with FaultProxy(own_redis.port) as proxy:
        queues = QueueFactory(facade, proxy.url, key_prefix)
        try:
            settings = RedisSettings(url=proxy.url, socket_timeout_s=HANGING_SOCKET_S)
            node = queues(redis_settings=settings, data_loss_check_interval_s=0.2)
            await node.start()
            # When a turn of its background work waits on a reply that never comes (the
            # server check the watch sends with each data-loss check: its reply dropped)
            proxy.drop_replies(True, to=b"persistence")
            await async_wait_until(lambda: proxy.dropped_frames > 0, 10, 0.01, "a reply lost")

            # Then the node closes at once, not at that turn's socket timeout
            started = time.monotonic()
            await asyncio.wait_for(node.aclose(), HANGING_SOCKET_S)
            took = time.monotonic() - started
            assert took < CLOSE_BOUND_S, f"closing took {took:.2f} s"
            # And none of its connections stays open behind it
            await async_wait_until(lambda: proxy.open_connections == 0, 10, 0.02, "all closed")
        finally:
            await queues.aclose()
