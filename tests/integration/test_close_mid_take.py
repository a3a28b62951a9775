"""A node closed while its take is on its way: closing withdraws the take's token (unpark.lua),
which gives back what the take got, as never run, to another receiver; the take's reply, when
it comes, must then run none of it here. Before, it ran on the closing node and on the node it
was given back to: an at_most_once request ran twice (issue 40, item 2). And a take of the
withdrawn token that reaches Redis only after the withdrawal takes nothing."""

from __future__ import annotations

import asyncio

import pytest
import redis

from prq import QueueSettings, RedisSettings, Request, RequestState
from prq.bulk import BulkClient
from prq.core.keys import KeySchema
from prq.embedded import EmbeddedRedis
from prq.protocol.scripts.loading import UNPARK
from prq.protocol.scripts.redelivery import Redelivery
from prq.protocol.scripts.take import parse_unpark, unpark_call
from tests.fault.proxy import FaultProxy
from tests.queue_facades import QueueFactory
from tests.queued import take_as
from tests.redis_servers import async_wait_until

pytestmark = pytest.mark.integration

#: How late the closing node's replies come (and its commands reach Redis).
LATENCY_MS = 600


async def test_a_request_taken_by_a_node_that_closes_before_the_reply_runs_once_elsewhere(
    make_own_queue: QueueFactory,
    own_redis: EmbeddedRedis,
    own_redis_client: redis.Redis,
) -> None:
    link = FaultProxy(own_redis.port, name="slow-take")
    try:
        # Given a node serving an endpoint over a slow link, parked
        sender = make_own_queue(pickup_timeout_s=30)
        closing = make_own_queue(redis_settings=RedisSettings(url=link.url, socket_timeout_s=10))
        endpoint = "poll://closed-mid-take"
        keys = KeySchema(sender.keys.prefix).endpoint(endpoint)
        runs: list[tuple[str, str]] = []

        def handler_of(node: str):  # type: ignore[no-untyped-def]
            def handle(request: Request) -> str:
                runs.append((node, request.id))
                return node

            return handle

        make_own_queue.serve(closing, endpoint, handler_of("closing"))
        await async_wait_until(
            lambda: own_redis_client.llen(keys.parked) > 0, 10, 0.02, "the node parked"
        )
        link.latency(LATENCY_MS)

        # When an at_most_once call is taken by that node in Redis, and the node closes while
        # the take's reply is on its way
        request = Request(endpoint=endpoint, method="m")
        call = asyncio.ensure_future(sender.queue_and_wait(request))

        async def taken() -> bool:
            return (await sender.status(request.id)).state == RequestState.TAKEN

        await async_wait_until(taken, 15, 0.05, "the request taken in Redis")
        other = make_own_queue()
        make_own_queue.serve(other, endpoint, handler_of("other"))
        await closing.aclose()

        # Then the request runs once, on the other node, and its caller gets that answer
        response = await asyncio.wait_for(call, 30)
        assert response.result == "other"
        assert runs == [("other", request.id)]
    finally:
        await make_own_queue.aclose()
        link.close()


def test_a_take_of_a_withdrawn_token_that_comes_after_the_withdrawal_takes_nothing(
    redis_url: str, redis_client: redis.Redis, key_prefix: str
) -> None:
    # Given a queued request, and a take token withdrawn before its take reached Redis (sent
    # on another connection, or retried)
    endpoint = "poll://withdrawn-token"
    keys = KeySchema(key_prefix).endpoint(endpoint)
    request = Request(endpoint=endpoint, method="m")
    with BulkClient.from_url(redis_url, prefix=key_prefix) as bulk:
        assert bulk.enqueue_many([request]).accepted == 1
    redis_client.script_load(UNPARK.source)
    redelivery = Redelivery.of(QueueSettings())

    def take(token: str, park_ms: int = 0) -> list[str]:
        items = take_as(redis_client, key_prefix, endpoint, token, want=1, park_ms=park_ms)
        return [item.request_id for item in items]

    unpark = unpark_call(keys, "withdrawn", redelivery)
    assert parse_unpark(redis_client.execute_command(*unpark.args)) == 0  # type: ignore[no-untyped-call]

    # When that take comes, asking to park should it find nothing
    # Then it takes nothing and does not park, and the request is there for the next take
    assert take("withdrawn", park_ms=5_000) == []
    assert redis_client.llen(keys.parked) == 0
    assert take("another") == [request.id]
