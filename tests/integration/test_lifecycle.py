"""Closing a node: its waiting callers fail with QueueShutdown and it leaves no connection open."""

from __future__ import annotations

import asyncio
import threading

import pytest
import redis

from prq import PrqError, QueueShutdown, Request, RequestState
from tests.queue_facades import QueueFactory, wait_for_state
from tests.queued import queue_depth
from tests.redis_servers import async_wait_until

pytestmark = pytest.mark.integration

#: Calls waiting when the node closes (the sync facade has one thread per waiting call).
WAITING_CALLS = {"async": 2_000, "sync": 200}


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
