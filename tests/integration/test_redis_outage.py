"""Redis going away: a short outage is ridden out by the retry budget; a hung Redis cannot hold
a caller past the budget (plus one socket timeout)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from prq import QueueUnavailable, RedisSettings, Request
from prq.embedded import EmbeddedRedis
from tests.queue_facades import QueueFactory

pytestmark = pytest.mark.integration

BUDGET_S = 1.0
SOCKET_TIMEOUT_S = 0.5
#: The documented bound for giving up: budget + one socket timeout + 1 s (plus test slack).
GIVE_UP_BOUND_S = BUDGET_S + SOCKET_TIMEOUT_S + 1.0 + 1.0


def echo(request: Request) -> object:
    return request.params


async def test_a_hung_redis_fails_the_call_within_the_budget(
    make_own_queue: QueueFactory, own_redis: EmbeddedRedis
) -> None:
    # Given a started node with a short retry budget and socket timeout
    redis_settings = RedisSettings(url=own_redis.url, socket_timeout_s=SOCKET_TIMEOUT_S)
    sender = make_own_queue(retry_budget_s=BUDGET_S, redis_settings=redis_settings)
    await sender.start()
    # When Redis hangs (SIGSTOP) and a call is made
    own_redis.pause()
    try:
        started = time.monotonic()
        with pytest.raises(QueueUnavailable) as raised:
            await asyncio.wait_for(sender.call("poll://hung", "m"), GIVE_UP_BOUND_S + 5)
        elapsed = time.monotonic() - started
    finally:
        own_redis.resume()
    # Then it fails with a retryable QueueUnavailable, within the bound
    print(f"QueueUnavailable after {elapsed:.2f} s (bound {GIVE_UP_BOUND_S:.1f} s)")
    assert elapsed < GIVE_UP_BOUND_S
    assert raised.value.retryable


async def test_a_short_outage_is_ridden_out(
    make_own_queue: QueueFactory, own_redis: EmbeddedRedis
) -> None:
    # Given a sender and a serving receiver with a retry budget of several seconds
    sender = make_own_queue(retry_budget_s=10)
    receiver = make_own_queue(retry_budget_s=10, dequeue_timeout_s=2)
    make_own_queue.serve(receiver, "poll://blip", echo)
    assert await asyncio.wait_for(sender.call("poll://blip", "m", "before"), 10) == "before"

    # When Redis dies, a call starts while it is down, and Redis is back half a second later
    own_redis.kill()
    restart = threading.Timer(0.5, own_redis.start)
    restart.start()
    try:
        result = await asyncio.wait_for(sender.call("poll://blip", "m", "during"), 20)
    finally:
        restart.join(10)

    # Then the call completes, and later calls work as before
    assert result == "during"
    assert await asyncio.wait_for(sender.call("poll://blip", "m", "after"), 10) == "after"
