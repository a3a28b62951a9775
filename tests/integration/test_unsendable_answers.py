"""Answers that cannot be sent still end the call, on real Redis, both facades.

A handler's answer over max_body_bytes, one JSON cannot carry, or one with DataStreams the
receiver cannot store is replaced by an error answer saying why; an answer Redis does not take
within the retry budget lets the request go, so that its caller's receiver check decides. In no
case does the receiver keep holding (and beating for) a request it will never answer.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from prq import PayloadTooLarge, ReceiverLost, RedisSettings, RemoteError, Request, Response
from prq.datastreams import DataStream
from prq.embedded import EmbeddedRedis
from tests.fault.proxy import FaultProxy
from tests.queue_facades import QueueFactory
from tests.redis_servers import async_wait_until

pytestmark = pytest.mark.integration

ENDPOINT = "poll://unsendable"
#: A receiver whose answers may be at most 2,000 bytes.
SMALL: dict[str, Any] = {"max_body_bytes": 2000, "inline_limit_bytes": 1000}
#: A caller that judges its receiver silent after 1 s (beats are quick too, as settings demand).
QUICK: dict[str, Any] = {
    "receiver_timeout_s": 1.0,
    "heartbeat_interval_s": 0.3,
    "heartbeat_initial_delay_s": 0.2,
}

ANSWERS: dict[str, tuple[object, str]] = {
    "too-large": ("x" * 5000, "ResponseTooLarge"),
    "not-json": ("\ud800", "SerializationError"),  # (a lone surrogate has no UTF-8 form)
    "streams-without-store": (
        Response(id="replaced", result=1, streams={"f": DataStream.from_bytes(b"data")}),
        "ConfigurationError",
    ),
}


@pytest.mark.parametrize("answer", list(ANSWERS))
async def test_a_served_answer_that_cannot_be_sent_ends_the_call_with_an_error(
    make_queue: QueueFactory, answer: str
) -> None:
    # Given a service whose handler returns an answer its receiver cannot send
    result, expected = ANSWERS[answer]
    sender, receiver = make_queue(), make_queue(**SMALL)
    make_queue.serve(receiver, ENDPOINT, lambda request: result)

    # When it is called (with no timeout of its own)
    with pytest.raises(RemoteError) as raised:
        await asyncio.wait_for(sender.call(ENDPOINT, "m"), 10)

    # Then the caller gets an error saying why, not retryable, and the receiver holds nothing
    assert raised.value.error.type == expected
    assert "answer cannot be sent" in raised.value.error.message
    assert not raised.value.retryable
    await async_wait_until(lambda: receiver.stats.held_requests == 0, 5, 0.02, "let go")


async def test_a_manual_answer_over_the_limit_raises_and_still_ends_the_call(
    make_queue: QueueFactory,
) -> None:
    # Given a request taken by hand
    sender, receiver = make_queue(), make_queue(**SMALL)
    call = asyncio.ensure_future(sender.call(ENDPOINT, "m", request_id="big-answer"))
    pending = await receiver.dequeue(ENDPOINT, timeout_s=10)
    assert pending is not None

    # When its answer is over max_body_bytes, Then apply_response raises PayloadTooLarge
    with pytest.raises(PayloadTooLarge):
        await receiver.apply_response(Response(id=pending.id, result="x" * 5000))

    # And the caller is answered with ResponseTooLarge: the request is not left held
    with pytest.raises(RemoteError) as raised:
        await asyncio.wait_for(call, 10)
    assert raised.value.error.type == "ResponseTooLarge"
    assert "over max_body_bytes=2000" in raised.value.error.message
    assert receiver.stats.held_requests == 0


async def test_an_answer_redis_does_not_take_lets_the_request_go(
    make_own_queue: QueueFactory, own_redis: EmbeddedRedis
) -> None:
    # Given a caller, and a receiver with a 1 s retry budget that reaches Redis through a proxy
    proxy = FaultProxy(own_redis.port)
    sender = make_own_queue(**QUICK)
    receiver = make_own_queue(
        redis_settings=RedisSettings(url=proxy.url, socket_timeout_s=0.5), retry_budget_s=1, **QUICK
    )

    def handler(request: Request) -> str:
        proxy.cut()  # the receiver loses Redis just as the handler answers
        return "ran"

    make_own_queue.serve(receiver, ENDPOINT, handler)
    call = asyncio.ensure_future(sender.call(ENDPOINT, "m"))
    try:
        # When the answer cannot be written within the receiver's retry budget
        await async_wait_until(
            lambda: not proxy.listening and receiver.stats.held_requests == 0,
            15, 0.05, "the receiver let the request go",
        )  # fmt: skip
        proxy.restore()

        # Then nothing beats for it any more: the caller's receiver check ends the call
        with pytest.raises(ReceiverLost) as raised:
            await asyncio.wait_for(call, 15)
        assert raised.value.maybe_executed
    finally:
        proxy.close()
