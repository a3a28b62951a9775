"""serve(): errors and non-JSON results reach the caller, current_request(), async handlers."""

from __future__ import annotations

import asyncio
import threading

import pytest

import prq
from prq import RemoteError, Request
from tests.queue_facades import QueueFactory, run_all

pytestmark = pytest.mark.integration

ENDPOINT = "poll://service"


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
