"""A take whose reply is lost: its token is kept as a spare, and the next take with it collects
what the first one took from the token's receipt (take.lua). The receipt outlives that: the
failed take's retry budget and socket timeout, the serve loop's pause and the next take's first
attempt (QueueSettings.receipt_ttl_s). Had it expired first, the request would stay taken by a
token nobody uses, and its caller would get ReceiverLost (maybe executed) for a request that
never ran."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis

from prq import QueueSettings, RedisSettings, Request
from prq.bulk import BulkClient
from prq.core.keys import KeySchema
from prq.embedded import EmbeddedRedis
from prq.protocol.scripts.loading import TAKE
from tests.fault.proxy import FaultProxy
from tests.queue_facades import QueueFactory
from tests.queued import take_as
from tests.redis_servers import async_wait_until

pytestmark = pytest.mark.integration

#: The receiver's link: a take's lost reply is given up after a socket timeout of 3 s.
SOCKET_TIMEOUT_S = 3.0
#: Short budgets, so that the take is given up 3 s after it ran: a receipt TTL worked out as
#: before (max(2 poll intervals, retry budget, hand-off window) + 1 s = 2 s) is gone by then.
TIMINGS: dict[str, Any] = {
    "retry_budget_s": 1.0,
    "handoff_confirm_s": 0.5,
    "receiver_timeout_s": 8.0,
}


async def test_a_take_whose_reply_was_lost_is_collected_by_the_next_take_of_its_token(
    make_own_queue: QueueFactory,
    own_redis: EmbeddedRedis,
    own_redis_client: redis.Redis,
    key_prefix: str,
) -> None:
    link = FaultProxy(own_redis.port, name="receipt")
    try:
        # Given a serving receiver that reaches Redis through a link of its own, parked
        settings = RedisSettings(url=link.url, socket_timeout_s=SOCKET_TIMEOUT_S)
        sender = make_own_queue(**TIMINGS)
        receiver = make_own_queue(redis_settings=settings, **TIMINGS)
        endpoint = "poll://lost-take-reply"
        keys = KeySchema(key_prefix).endpoint(endpoint)
        runs: list[str] = []

        def handler(request: Request) -> str:
            runs.append(request.id)
            return "ran"

        make_own_queue.serve(receiver, endpoint, handler)
        await async_wait_until(
            lambda: own_redis_client.llen(keys.parked) > 0, 10, 0.02, "receiver parked"
        )

        # When a request is sent and the receiver's take of it runs in Redis, but its reply
        # is lost (the take fails a socket timeout later: its token becomes a spare); only
        # the takes' replies are lost, so that a connection the receiver opens meanwhile
        # works (with every reply lost its handshake fails, and the take is never sent)
        link.drop_replies(to=TAKE.sha.encode())
        request = Request(endpoint=endpoint, method="m")
        call = asyncio.ensure_future(sender.queue_and_wait(request, pickup_timeout_s=30))
        stored = keys.request(request.id)
        await async_wait_until(
            lambda: own_redis_client.hget(stored, "st") == b"taken", 15, 0.01, "taken"
        )
        link.drop_replies(False)

        # Then the next take collects it from the receipt: it runs once and answers (not
        # ReceiverLost once the caller's receiver timeout passes)
        response = await asyncio.wait_for(call, 30)
        assert response.result == "ran"
        assert runs == [request.id]
    finally:
        await make_own_queue.aclose()
        link.close()


def test_a_take_that_collects_a_receipt_renews_it(
    redis_url: str, redis_client: redis.Redis, key_prefix: str
) -> None:
    # Given a request taken by a token, whose receipt has almost expired (the take's retries
    # and the next take of its token spend its time)
    endpoint = "poll://receipt-renewed"
    keys = KeySchema(key_prefix).endpoint(endpoint)
    request = Request(endpoint=endpoint, method="m")
    with BulkClient.from_url(redis_url, prefix=key_prefix) as bulk:
        assert bulk.enqueue_many([request]).accepted == 1
    token = "token-of-a-take-whose-reply-was-lost"
    receipt_ttl_ms = int(QueueSettings().receipt_ttl_s() * 1000)

    def take() -> list[str]:
        return [i.request_id for i in take_as(redis_client, key_prefix, endpoint, token, want=1)]

    assert take() == [request.id]
    redis_client.pexpire(keys.take_receipt(token), 500)

    # When the next take of the token collects it from the receipt
    assert take() == [request.id]

    # Then the receipt lives a whole receipt TTL from that take on
    assert redis_client.pttl(keys.take_receipt(token)) > receipt_ttl_ms - 5_000
