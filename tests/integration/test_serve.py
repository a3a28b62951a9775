"""serve(): errors and non-JSON results reach the caller, current_request(), async handlers;
at most `concurrency` handlers at once, and no request taken ahead of a slow handler."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import redis

import prq
from prq import RemoteError, Request
from prq.bulk import BulkClient
from prq.serve.async_held import ANSWER_BACKLOG
from tests.queue_facades import QueueFactory, SyncQueueAdapter, run_all
from tests.queued import queue_depth
from tests.redis_servers import async_wait_until

pytestmark = pytest.mark.integration

ENDPOINT = "poll://service"
#: Calls waiting at once in the take-ahead test (the sync facade spends a thread on each).
CALLS = 200


class PaymentDeclined(Exception):
    """A service's own exception type."""


async def test_a_handler_exception_reaches_the_caller_as_remote_error(
    make_queue: QueueFactory,
) -> None:
    # Given a service whose handler raises its own exception
    sender, receiver = make_queue(), make_queue()

    def handler(request: Request) -> object:
        raise PaymentDeclined(f"card {request.params} declined")

    make_queue.serve(receiver, ENDPOINT, handler)

    # When it is called
    with pytest.raises(RemoteError) as raised:
        await asyncio.wait_for(sender.call(ENDPOINT, "pay", "4242", request_id="pay-1"), 10)

    # Then the caller gets RemoteError carrying the exception's type and message
    error = raised.value
    assert (error.error.type, error.error.message) == ("PaymentDeclined", "card 4242 declined")
    assert (error.request_id, error.endpoint) == ("pay-1", ENDPOINT)
    assert error.maybe_executed and not error.retryable


async def test_a_non_json_result_reaches_the_caller_as_a_serialization_error(
    make_queue: QueueFactory,
) -> None:
    # Given a handler that returns something JSON cannot carry
    sender, receiver = make_queue(), make_queue()
    make_queue.serve(receiver, ENDPOINT, lambda request: {"when": object()})

    # When it is called
    with pytest.raises(RemoteError) as raised:
        await asyncio.wait_for(sender.call(ENDPOINT, "m"), 10)

    # Then the caller gets a RemoteError of type SerializationError (and the server goes on)
    assert raised.value.error.type == "SerializationError"


async def test_current_request_is_the_pending_request_being_handled(
    make_queue: QueueFactory,
) -> None:
    # Given a handler that reports what current_request() returns inside it
    sender, receiver = make_queue(), make_queue()

    def handler(request: Request) -> object:
        pending = prq.current_request()
        assert pending is not None
        return {
            "same_request": pending.request == request,
            "id": pending.id,
            "attempt": pending.delivery.attempt,
            "hash": pending.delivery.delivery_hash,
            "cancelled": pending.cancelled,
        }

    make_queue.serve(receiver, ENDPOINT, handler, concurrency=4)

    # When two calls are handled
    a, b = await run_all([sender.call(ENDPOINT, "m", 1), sender.call(ENDPOINT, "m", 2)], 10)

    # Then each handler saw its own PendingRequest, and nothing leaks outside a handler
    assert isinstance(a, dict) and isinstance(b, dict)
    assert a["same_request"] and b["same_request"] and a["id"] != b["id"]
    assert a["attempt"] == b["attempt"] == 1 and not a["cancelled"] and not b["cancelled"]
    assert a["hash"] != b["hash"] and len(str(a["hash"])) >= 16
    assert prq.current_request() is None


async def test_a_coroutine_handler_works(make_queue: QueueFactory) -> None:
    # Given a coroutine handler (run on the loop by AsyncQueue.serve; Queue.serve runs it too)
    sender, receiver = make_queue(), make_queue()

    async def handler(request: Request) -> object:
        await asyncio.sleep(0)  # it really is awaited
        pending = prq.current_request()
        assert pending is not None
        return {"params": request.params, "id": pending.id}

    make_queue.serve(receiver, ENDPOINT, handler, concurrency=2)

    # When it is called
    result = await asyncio.wait_for(sender.call(ENDPOINT, "m", [1, 2], request_id="co-1"), 10)

    # Then its result comes back
    assert result == {"params": [1, 2], "id": "co-1"}


async def test_a_blocked_plain_handler_does_not_stall_the_server(make_queue: QueueFactory) -> None:
    # Given a server with two slots, one of them stuck in a handler that blocks its thread
    sender, receiver = make_queue(), make_queue()
    entered, release = threading.Event(), threading.Event()

    def handler(request: Request) -> object:
        if request.method == "block":
            entered.set()
            assert release.wait(20), "never released"
        return request.method

    make_queue.serve(receiver, ENDPOINT, handler, concurrency=2)
    blocked = asyncio.create_task(sender.call(ENDPOINT, "block"))
    try:
        assert await asyncio.to_thread(entered.wait, 10)

        # When another call comes in
        quick = await asyncio.wait_for(sender.call(ENDPOINT, "quick"), 5)

        # Then it is served while the first handler still blocks
        assert quick == "quick" and not blocked.done()
    finally:
        release.set()
    assert await asyncio.wait_for(blocked, 10) == "block"


async def test_a_receiver_whose_handler_is_slow_takes_nothing_ahead_of_it(
    make_queue: QueueFactory, redis_client: redis.Redis
) -> None:
    # Given a receiver with one slot, running a request whose handler blocks, and five more
    # requests of priority 0 queued behind it
    sender, receiver = make_queue(pickup_timeout_s=30), make_queue()
    endpoint = "poll://slow-no-take-ahead"
    entered, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def handler(request: Request) -> object:
        ran.append(request.method)
        if request.method == "first":
            entered.set()
            assert release.wait(20), "never released"
        return request.method

    first = asyncio.ensure_future(sender.call(endpoint, "first"))
    make_queue.serve(receiver, endpoint, handler, concurrency=1)
    assert await asyncio.to_thread(entered.wait, 10)
    lows = [
        asyncio.ensure_future(sender.queue_and_wait(Request(endpoint=endpoint, method=f"low{i}")))
        for i in range(5)
    ]
    keys = sender.keys.endpoint(endpoint)
    await async_wait_until(lambda: queue_depth(redis_client, keys) == 5, 10)

    # When a request of a higher priority comes while the handler still runs
    urgent = Request(endpoint=endpoint, method="urgent", priority=5)
    urgent_call = asyncio.ensure_future(sender.queue_and_wait(urgent))
    await async_wait_until(lambda: queue_depth(redis_client, keys) == 6, 10)
    release.set()

    # Then it runs next: the receiver held no request beyond the one it was running
    await asyncio.wait_for(asyncio.gather(first, urgent_call, *lows), 20)
    assert ran[:2] == ["first", "urgent"], ran


async def test_quick_handlers_taken_ahead_never_run_more_than_concurrency_at_once(
    make_queue: QueueFactory, facade: str, redis_client: redis.Redis
) -> None:
    # Given 200 requests waiting, and a receiver with 8 slots whose handler is quick
    sender, receiver = make_queue(pickup_timeout_s=60), make_queue()
    endpoint = "poll://quick-take-ahead"
    calls = [asyncio.ensure_future(sender.call(endpoint, "m", i)) for i in range(CALLS)]
    keys = sender.keys.endpoint(endpoint)
    await async_wait_until(lambda: queue_depth(redis_client, keys) == CALLS, 20)
    raw = receiver.raw if isinstance(receiver, SyncQueueAdapter) else receiver
    lock = threading.Lock()
    now = most = most_held = 0

    async def handler(request: Request) -> object:
        nonlocal now, most, most_held
        with lock:
            now += 1
            most = max(most, now)
            most_held = max(most_held, len(raw._held))
        await asyncio.sleep(0)
        with lock:
            now -= 1
        return request.params

    # When it serves them
    make_queue.serve(receiver, endpoint, handler, concurrency=8)

    # Then every call is answered, no more than 8 handlers ever ran at once, and the node held
    # no more than its bound (8 running, 8 taken ahead, 8 more waiting for their answers)
    assert await asyncio.wait_for(asyncio.gather(*calls), 60) == list(range(CALLS))
    assert most <= 8
    if facade == "async":
        assert most_held <= (ANSWER_BACKLOG + 1) * 8
    print(f"handlers at once: {most}, requests held at most: {most_held}")


async def test_slow_handlers_after_quick_ones_still_run_concurrency_at_once(
    make_queue: QueueFactory,
) -> None:
    # Given a receiver with 8 slots whose handler has been quick so far (a blocking receiver
    # then wakes only a few of its threads for a take's requests: prq.serve.take_turns._TakeTurns)
    sender, receiver = make_queue(pickup_timeout_s=60), make_queue()
    endpoint = "poll://quick-then-slow"
    lock = threading.Lock()
    now = most = slow_done = 0

    def handler(request: Request) -> object:  # (plain: a coroutine run in a thread is not quick)
        nonlocal now, most, slow_done
        params = request.params
        assert isinstance(params, dict)
        with lock:
            now += 1
            most = max(most, now)
        if params["sleep_s"]:
            time.sleep(float(params["sleep_s"]))  # type: ignore[arg-type]  # (the work)
        with lock:
            now -= 1
            slow_done += params["sleep_s"] > 0  # type: ignore[operator]
        return params["i"]

    make_queue.serve(receiver, endpoint, handler, concurrency=8)
    quick = [sender.call(endpoint, "m", {"i": i, "sleep_s": 0}) for i in range(60)]
    assert await asyncio.wait_for(asyncio.gather(*quick), 30) == list(range(60))

    # When 8 slow requests come at once, in one enqueue (one goes to the parked take, the other
    # 7 are queued and come in the next take, together)
    with lock:
        most = 0
    slow = [
        Request(endpoint=endpoint, method="m", params={"i": i, "sleep_s": 1.0}) for i in range(8)
    ]
    with BulkClient.from_url(make_queue.url, prefix=make_queue.prefix) as bulk:
        assert (await asyncio.to_thread(bulk.enqueue_many, slow)).accepted == 8

    # Then all 8 run at once (the threads a take's wake-up did not announce find the ones
    # waiting at their next timed look)
    await async_wait_until(lambda: slow_done == 8, 30)
    assert most == 8
