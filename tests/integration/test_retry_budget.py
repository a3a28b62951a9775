"""The retry budget bounds a call that Redis does not answer from below as well as from above:
it fails with QueueUnavailable no sooner than `retry_budget_s` after it was made (one more
attempt is made when the budget ends), and no later than the documented bound (budget + one
socket timeout + 1 s), also when it waited in a batch begun by an earlier call."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from prq import QueueUnavailable, RedisSettings
from prq.embedded import EmbeddedRedis
from tests.queue_facades import AnyQueue, QueueFactory
from tests.redis_servers import async_wait_until

pytestmark = pytest.mark.integration

BUDGET_S = 0.5
SOCKET_TIMEOUT_S = 0.5
#: The documented bound for giving up: budget + one socket timeout + 1 s (plus test slack).
GIVE_UP_BOUND_S = BUDGET_S + SOCKET_TIMEOUT_S + 1.0 + 1.0
#: Rounds of calls, and calls per round: each call of a round starts once the node has retried
#: since the call before it started, so it waits behind that call's retries and is sent in a
#: batch with calls asked at other times.
ROUNDS = 5
CALLS_PER_ROUND = 3


async def failure_time(sender: AnyQueue, i: int) -> float:
    """Seconds from the start of a call until it fails with QueueUnavailable."""
    started = time.monotonic()
    with pytest.raises(QueueUnavailable):
        await asyncio.wait_for(sender.call("poll://gone", "m", i), GIVE_UP_BOUND_S + 5)
    return time.monotonic() - started


def retried_since(sender: AnyQueue) -> Callable[[], bool]:
    """Whether the node has retried a round trip since now."""
    before = sender.stats.redis_retries
    return lambda: sender.stats.redis_retries > before


async def test_a_call_redis_does_not_answer_fails_after_its_whole_budget_and_not_much_later(
    make_own_queue: QueueFactory, own_redis: EmbeddedRedis
) -> None:
    # Given a started node with a short retry budget
    redis_settings = RedisSettings(url=own_redis.url, socket_timeout_s=SOCKET_TIMEOUT_S)
    sender = make_own_queue(retry_budget_s=BUDGET_S, redis_settings=redis_settings)
    await sender.start()
    # When Redis is gone (every attempt is refused at once: the retry policy alone decides
    # when a call gives up) and calls are made, in rounds, each started while the one before
    # is retrying
    own_redis.kill()
    times: list[float] = []
    for _ in range(ROUNDS):
        calls = []
        for i in range(CALLS_PER_ROUND):
            retried = retried_since(sender)
            calls.append(asyncio.ensure_future(failure_time(sender, i)))
            await async_wait_until(retried, 5, 0.005, "the node retried")
        times += await asyncio.gather(*calls)
    # Then every call failed after its whole budget, and within the documented bound
    print(f"QueueUnavailable after {min(times):.3f}..{max(times):.3f} s (budget {BUDGET_S} s)")
    assert min(times) >= BUDGET_S, sorted(times)
    assert max(times) < GIVE_UP_BOUND_S, sorted(times)
