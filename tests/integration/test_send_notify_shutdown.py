"""send() (exactly one callback, exactly once; none after a withdrawal), notify() (one-way, no
answer kept) and shutdown (held requests finish within the shutdown timeout, or are given back),
on both facades and real Redis."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
import redis

from prq import (
    CancelledAfterPickup,
    DataLoss,
    PickupTimeout,
    PrqError,
    QueueShutdown,
    ReceiverLost,
    Request,
    RequestState,
    Response,
)
from prq.core.keys import KeySchema
from tests.queue_facades import QueueFactory, wait_for_state
from tests.queued import silent_take
from tests.redis_servers import async_wait_until

pytestmark = pytest.mark.integration


class Outcomes:
    """The callbacks of one send, recording every call (from any thread)."""

    def __init__(self, raise_in_response: bool = False) -> None:
        self.calls: list[tuple[str, Any]] = []
        self._lock = threading.Lock()
        self._raise = raise_in_response

    def on_response(self, response: Response) -> None:
        with self._lock:
            self.calls.append(("response", response))
        if self._raise:
            raise RuntimeError("a callback that fails")

    def on_failure(self, error: PrqError) -> None:
        with self._lock:
            self.calls.append(("failure", error))

    def kw(self) -> dict[str, Any]:
        return {"on_response": self.on_response, "on_failure": self.on_failure}


async def test_send_runs_on_response_once_and_nothing_else(make_queue: QueueFactory) -> None:
    # Given a served endpoint, and a callback that raises
    sender, receiver = make_queue(), make_queue()
    endpoint = "poll://send-ok"
    make_queue.serve(receiver, endpoint, lambda request: request.params * 2)
    outcomes = Outcomes(raise_in_response=True)

    # When a request is sent
    handle = await sender.send(Request(endpoint=endpoint, method="m", params=21), **outcomes.kw())

    # Then on_response runs once with the answer, and the raise brings no on_failure
    await async_wait_until(lambda: handle.finished, 10, 0.01, "outcome delivered")
    assert [(kind, value.result) for kind, value in outcomes.calls] == [("response", 42)]
    assert handle.done and handle.request_id
    # And a withdraw after the outcome is too late
    assert await handle.withdraw() is False


async def test_send_runs_on_failure_once_when_nobody_picks_it_up(make_queue: QueueFactory) -> None:
    sender = make_queue()
    outcomes = Outcomes()
    request = Request(endpoint="poll://send-nobody", method="m")
    handle = await sender.send(request, pickup_timeout_s=0.3, **outcomes.kw())
    await async_wait_until(lambda: handle.finished, 10, 0.01, "outcome delivered")
    assert [kind for kind, _ in outcomes.calls] == ["failure"]
    assert isinstance(outcomes.calls[0][1], PickupTimeout)


async def test_a_send_withdrawn_before_pickup_runs_no_callback(
    make_queue: QueueFactory, redis_client: redis.Redis, key_prefix: str
) -> None:
    # Given a sent request nobody has taken
    sender = make_queue(pickup_timeout_s=30)
    outcomes = Outcomes()
    request = Request(endpoint="poll://send-withdrawn", method="m")
    handle = await sender.send(request, **outcomes.kw())
    stored = KeySchema(key_prefix).endpoint(request.endpoint).request(request.id)
    assert redis_client.hget(stored, "st") == b"queued"  # send returns once it is in Redis

    # When it is withdrawn, Then that succeeds, and neither callback ever runs
    assert await handle.withdraw() is True
    await async_wait_until(lambda: handle.finished, 10, 0.01, "send finished")
    assert outcomes.calls == []
    assert handle.done
    assert redis_client.hget(stored, "st") == b"withdrawn"


async def test_a_send_withdrawn_then_closed_runs_no_callback(make_queue: QueueFactory) -> None:
    # Given a sent request nobody has taken, withdrawn (found by the simulation: the call then
    # came to QueueShutdown, DataLoss or RequestExpired before it saw its own withdrawal, and
    # that outcome fired on_failure, though withdraw() had said neither callback runs)
    sender = make_queue(pickup_timeout_s=30, poll_interval_s=5)
    outcomes = Outcomes()
    handle = await sender.send(Request(endpoint="poll://send-withdrawn-closed", method="m"),
                               **outcomes.kw())  # fmt: skip
    assert await handle.withdraw() is True

    # When its queue closes before the call has seen the withdrawal
    await sender.aclose()

    # Then neither callback ran
    await async_wait_until(lambda: handle.finished, 10, 0.01, "send finished")
    assert outcomes.calls == []


async def test_a_withdraw_after_pickup_is_refused_and_the_answer_still_comes(
    make_queue: QueueFactory,
) -> None:
    sender, receiver = make_queue(pickup_timeout_s=30), make_queue()
    endpoint = "poll://send-late-withdraw"
    outcomes = Outcomes()
    request = Request(endpoint=endpoint, method="m", params="x")
    handle = await sender.send(request, **outcomes.kw())
    pending = await receiver.dequeue(endpoint, timeout_s=5)
    assert pending is not None

    assert await handle.withdraw() is False
    await receiver.apply_response(Response(id=request.id, result="late"))
    await async_wait_until(lambda: handle.finished, 10, 0.01, "outcome delivered")
    assert [(kind, value.result) for kind, value in outcomes.calls] == [("response", "late")]


async def test_a_send_whose_receiver_dies_fails_once_with_receiver_lost(
    make_queue: QueueFactory, redis_client: redis.Redis, key_prefix: str
) -> None:
    sender = make_queue(
        pickup_timeout_s=30, receiver_timeout_s=1, heartbeat_interval_s=0.3,
        heartbeat_initial_delay_s=0.2,
    )  # fmt: skip
    outcomes = Outcomes()
    request = Request(endpoint="poll://send-receiver-dies", method="m")
    handle = await sender.send(request, **outcomes.kw())
    assert [i.request_id for i in silent_take(redis_client, key_prefix, request.endpoint)] == [
        request.id
    ]
    await async_wait_until(lambda: handle.finished, 10, 0.02, "outcome delivered")
    assert [type(value) for _, value in outcomes.calls] == [ReceiverLost]


async def test_a_cancel_after_pickup_reaches_on_failure_once(make_queue: QueueFactory) -> None:
    sender, receiver = make_queue(pickup_timeout_s=30), make_queue()
    endpoint = "poll://send-cancelled"
    outcomes = Outcomes()
    request = Request(endpoint=endpoint, method="m")
    handle = await sender.send(request, **outcomes.kw())
    assert await receiver.dequeue(endpoint, timeout_s=5) is not None
    assert await receiver.cancel(request.id) is True
    await async_wait_until(lambda: handle.finished, 10, 0.01, "outcome delivered")
    assert [type(value) for _, value in outcomes.calls] == [CancelledAfterPickup]


async def test_pending_sends_fail_once_with_queue_shutdown_when_the_queue_closes(
    make_queue: QueueFactory,
) -> None:
    sender = make_queue(pickup_timeout_s=30)
    outcomes = [Outcomes() for _ in range(5)]
    handles = [
        await sender.send(Request(endpoint="poll://send-closing", method="m"), **o.kw())
        for o in outcomes
    ]
    await sender.aclose()
    await async_wait_until(lambda: all(h.finished for h in handles), 10, 0.01, "all delivered")
    for o in outcomes:
        assert [type(value) for _, value in o.calls] == [QueueShutdown]


async def test_a_send_whose_redis_loses_its_data_fails_once_with_data_loss(
    make_own_queue: QueueFactory, own_redis_client: redis.Redis
) -> None:
    sender = make_own_queue(pickup_timeout_s=30, data_loss_check_interval_s=0.2)
    outcomes = Outcomes()
    request = Request(endpoint="poll://send-flushed", method="m")
    handle = await sender.send(request, **outcomes.kw())
    own_redis_client.flushall()
    await async_wait_until(lambda: handle.finished, 15, 0.02, "outcome delivered")
    assert [type(value) for _, value in outcomes.calls] == [DataLoss]


async def test_notify_runs_once_and_keeps_no_answer(
    make_queue: QueueFactory, redis_client: redis.Redis, key_prefix: str
) -> None:
    # Given a served endpoint that counts what it ran
    sender, receiver = make_queue(), make_queue()
    endpoint = "poll://notify"
    ran: list[Any] = []

    def handler(request: Request) -> str:
        ran.append(request.params)
        return "ignored"

    make_queue.serve(receiver, endpoint, handler)

    # When a message is sent one-way, twice under the same id
    request_id = await sender.notify(endpoint, "ping", {"n": 1}, request_id="note-1")
    assert await sender.notify(endpoint, "ping", {"n": 1}, request_id="note-1") == request_id

    # Then it runs once, and its record says done with no answer kept
    await wait_for_state(sender, request_id, RequestState.DONE)
    assert ran == [{"n": 1}]
    stored = redis_client.hgetall(KeySchema(key_prefix).endpoint(endpoint).request(request_id))
    assert stored[b"st"] == b"done" and b"rsp" not in stored and b"snd" not in stored


async def test_closing_lets_held_requests_finish_and_takes_nothing_new(
    make_queue: QueueFactory, redis_client: redis.Redis, key_prefix: str
) -> None:
    # Given a receiver running a request whose handler waits
    sender, receiver = make_queue(pickup_timeout_s=30), make_queue(shutdown_timeout_s=20)
    endpoint = "poll://closing"
    started, release = threading.Event(), threading.Event()

    def handler(request: Request) -> Any:
        started.set()
        release.wait(20)
        return "finished"

    make_queue.serve(receiver, endpoint, handler)
    first = asyncio.ensure_future(sender.call(endpoint, "m"))
    await async_wait_until(started.is_set, 10, 0.01, "handler started")

    # When the receiver closes, and another request comes meanwhile
    closing = asyncio.ensure_future(receiver.aclose())
    second = Request(endpoint=endpoint, method="m")
    later = asyncio.ensure_future(sender.queue_and_wait(second))
    await wait_for_state(sender, second.id, RequestState.QUEUED)
    assert not closing.done()
    release.set()

    # Then the held request is answered, closing ends, and the new one was not taken
    assert await asyncio.wait_for(first, 10) == "finished"
    await asyncio.wait_for(closing, 10)
    assert (await sender.status(second.id)).state == RequestState.QUEUED
    later.cancel()


@pytest.mark.parametrize("delivery", ["at_most_once", "at_least_once"])
async def test_what_is_still_held_at_the_shutdown_timeout_is_given_back(
    make_queue: QueueFactory, delivery: str
) -> None:
    # Given a receiver whose handler outlasts its shutdown timeout (0.3 s)
    sender = make_queue(pickup_timeout_s=30)
    receiver = make_queue(shutdown_timeout_s=0.3)
    endpoint = f"poll://give-back-{delivery}"
    started, release = threading.Event(), threading.Event()

    def stuck(request: Request) -> Any:
        started.set()
        release.wait(20)
        return "too late"

    serving = make_queue.serve(receiver, endpoint, stuck)
    request = Request(endpoint=endpoint, method="m", delivery=delivery)
    call = asyncio.ensure_future(sender.queue_and_wait(request))
    await async_wait_until(started.is_set, 10, 0.01, "handler started")

    # When the receiver closes
    await asyncio.wait_for(receiver.aclose(), 10)
    release.set()
    await serving.stop()

    if delivery == "at_most_once":
        # Then the caller learns at once that the receiver shut down (no heartbeat timeout)
        with pytest.raises(ReceiverLost, match="shut down"):
            await asyncio.wait_for(call, 5)
    else:
        # Then the request is queued again, and another receiver runs it as attempt 2
        other = make_queue()
        pending = await other.dequeue(endpoint, timeout_s=5)
        assert pending is not None and pending.delivery.attempt == 2
        await other.apply_response(Response(id=request.id, result="second"))
        assert (await asyncio.wait_for(call, 5)).result == "second"
