"""Batch takes and merged answers under faults: a receiver killed holding a batch, cancels that
race answers going out together, and max_in_flight when receivers take in batches.

A receiver takes as many requests in one take as it has free slots (AsyncQueue.serve), or as
it has idle workers (Queue.serve); the answers that are ready together go to Redis as one script
call (prq.protocol.scripts.merging.merge_answers). Each request in a batch must keep every
guarantee it has alone.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import redis

from prq import CancelledAfterPickup, ReceiverLost, Request, RequestState, Response
from prq.core.keys import KeySchema
from tests.integration.test_handoff import serve_child, stop_child
from tests.queue_facades import QueueFactory, RunningCount, run_all, wait_for_state
from tests.redis_servers import async_wait_until

pytestmark = pytest.mark.integration

#: Requests in the batch a killed receiver holds (its slots).
BATCH = 4
#: The sender's receiver timeout: a dead receiver's calls end about this long after it died.
RECEIVER_TIMEOUT_S = 2.0
#: Bound on how long each call may take to end once the receiver is dead.
AFTER_DEATH_BOUND_S = 20.0


@pytest.mark.parametrize("delivery", ["at_most_once", "at_least_once"])
async def test_a_receiver_killed_holding_a_batch_loses_none_of_it(
    make_queue: QueueFactory,
    facade: str,
    redis_url: str,
    redis_client: redis.Redis,
    key_prefix: str,
    delivery: str,
) -> None:
    # Given four calls queued before anyone serves their endpoint
    endpoint = f"poll://batch-killed-{delivery}"
    sender = make_queue(receiver_timeout_s=RECEIVER_TIMEOUT_S, pickup_timeout_s=60)
    requests = [
        Request(endpoint=endpoint, method="m", params={"sleep_s": 60, "i": i}, delivery=delivery)
        for i in range(BATCH)
    ]
    calls = [asyncio.ensure_future(sender.queue_and_wait(r, timeout_s=90)) for r in requests]
    for request in requests:
        await wait_for_state(sender, request.id, RequestState.QUEUED)
    keys = KeySchema(key_prefix).endpoint(endpoint)

    # When a receiver process with four slots takes them all (its first take, on AsyncQueue,
    # takes the four at once) and is killed while it holds them
    async with serve_child(redis_url, key_prefix, endpoint, facade, BATCH) as (child, _node):
        for request in requests:
            await wait_for_state(sender, request.id, RequestState.TAKEN, timeout_s=30)
        owners = {redis_client.hget(keys.request(r.id), "own") for r in requests}
        if facade == "async":
            assert len(owners) == 1, "the four were not taken in one take"
        await stop_child(child, "SIGKILL")
    died = time.monotonic()

    if delivery == "at_most_once":
        # Then every call of the batch ends with ReceiverLost (it may have run), none hangs
        for call in calls:
            with pytest.raises(ReceiverLost) as lost:
                await asyncio.wait_for(call, AFTER_DEATH_BOUND_S)
            assert lost.value.maybe_executed
    else:
        # Then every request of the batch is run again by a live receiver, and answered by it
        def live(_request: Request) -> str:
            return "live"

        make_queue.serve(make_queue(), endpoint, live, concurrency=BATCH)
        responses = await asyncio.wait_for(asyncio.gather(*calls), AFTER_DEATH_BOUND_S)
        assert [response.result for response in responses] == ["live"] * BATCH
    assert time.monotonic() - died < AFTER_DEATH_BOUND_S


async def test_cancels_racing_answers_that_go_out_together_end_each_call_one_way(
    make_queue: QueueFactory,
) -> None:
    # Given a receiver with 32 slots whose handler waits for a go, holding 32 calls
    endpoint = "poll://batch-cancel-race"
    sender, canceller = make_queue(pickup_timeout_s=30), make_queue()
    go = threading.Event()
    ran: set[str] = set()

    def handler(request: Request) -> Any:
        ran.add(request.id)
        go.wait(20)  # held until the test lets every handler answer at once
        return request.params

    make_queue.serve(make_queue(), endpoint, handler, concurrency=32)
    requests = [Request(endpoint=endpoint, method="m", params=i) for i in range(32)]
    calls = [asyncio.ensure_future(sender.queue_and_wait(r, timeout_s=30)) for r in requests]
    await async_wait_until(lambda: len(ran) == 32, 15, 0.01, "all 32 handlers running")

    # When every handler answers at once (the answers go out together), while half the calls
    # are cancelled at the same moment
    go.set()
    cancelled = await run_all((canceller.cancel(r.id) for r in requests[::2]), 15)

    # Then each call ends one way only: answered with its own result, or cancelled after pickup,
    # and its stored state says the same
    for request, call, i in zip(requests, calls, range(32), strict=True):
        try:
            response: Response = await asyncio.wait_for(call, 15)
        except CancelledAfterPickup:
            state = (await sender.status(request.id)).state
            assert state == RequestState.CANCELLED
            assert i % 2 == 0 and cancelled[i // 2] is True
        else:
            assert response.result == i
            assert (await sender.status(request.id)).state == RequestState.DONE
            if i % 2 == 0:
                assert cancelled[i // 2] is False  # its answer won the race


async def test_max_in_flight_holds_when_receivers_take_queued_work_in_batches(
    make_queue: QueueFactory,
) -> None:
    # Given 40 calls queued before any receiver, on an endpoint limited to 5 in flight
    endpoint = "poll://batch-limited"
    sender = make_queue(pickup_timeout_s=60)
    await sender.set_limits(endpoint, max_in_flight=5)
    work = RunningCount(0.02)

    requests = [Request(endpoint=endpoint, method="m", params=i) for i in range(40)]
    calls = [asyncio.ensure_future(sender.queue_and_wait(r, timeout_s=60)) for r in requests]
    for request in requests:
        await wait_for_state(sender, request.id, RequestState.QUEUED)

    # When three receivers with 8 slots each start on it (each first take could take 8)
    for _ in range(3):
        make_queue.serve(make_queue(), endpoint, work, concurrency=8)

    # Then every call is answered, and never more than 5 ran at once across the three
    responses = await asyncio.wait_for(asyncio.gather(*calls), 60)
    assert [response.result for response in responses] == list(range(40))
    assert work.most == 5


async def test_every_request_a_server_ran_is_answered_before_its_serve_returns(
    make_queue: QueueFactory,
) -> None:
    # Given 120 calls queued before anyone serves, and a server with 16 workers (slots) whose
    # answers go out together (Queue.serve: a worker leaves its answer to the one writing)
    endpoint = "poll://batch-stop"
    sender = make_queue(pickup_timeout_s=60)
    requests = [Request(endpoint=endpoint, method="m", params=i) for i in range(120)]
    calls = [asyncio.ensure_future(sender.queue_and_wait(r, timeout_s=60)) for r in requests]
    for request in requests:
        await wait_for_state(sender, request.id, RequestState.QUEUED)
    ran: list[str] = []
    lock = threading.Lock()

    def handler(request: Request) -> Any:
        with lock:
            ran.append(request.id)
        return request.params

    # When the server is stopped while it answers (after 40 ran)
    serving = make_queue.serve(make_queue(), endpoint, handler, concurrency=16)
    await async_wait_until(lambda: len(ran) >= 40, 30, 0.005, "40 requests ran")
    await serving.stop()

    # Then each request that ran is answered by the time serve returned, none twice
    with lock:
        answered = list(ran)
    assert len(answered) == len(set(answered))
    states = await run_all((sender.status(request_id) for request_id in answered), 15)
    assert {status.state for status in states} == {RequestState.DONE}
    # And the rest, still queued, are answered by the next server, each call with its own result
    make_queue.serve(make_queue(), endpoint, handler, concurrency=16)
    responses = await asyncio.wait_for(asyncio.gather(*calls), 60)
    assert [response.result for response in responses] == list(range(120))
