"""An answer a caller waits for outlives the caller's next poll, however short a lifetime its
request asked for (Request.response_ttl_s), so a caller that missed the answer's pulse still
reads it: `call`, a `send` callback, and a caller that joined an id queued by someone else.
A caller whose record is gone after it had not looked for longer than that is told
RequestExpired, not DataLoss, and its node asks for no data-loss check; a record gone sooner
is still DataLoss. On real Redis, both facades; the callers' links drop every pub/sub message
(tests/fault/proxy.py).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from prq import (
    AsyncQueue,
    DataLoss,
    PrqError,
    Queue,
    RedisSettings,
    Request,
    RequestExpired,
    RequestState,
    Response,
)
from prq.bulk import BulkClient
from prq.embedded import EmbeddedRedis
from tests.fault.proxy import FaultProxy
from tests.queue_facades import AnyQueue, QueueFactory, SyncQueueAdapter, wait_for_state
from tests.redis_servers import async_wait_until

pytestmark = pytest.mark.integration

ENDPOINT = "poll://short-answer-ttl"
#: A lifetime far below the poll interval (0.5 s): without a floor the answer is gone before
#: the caller's next poll.
BRIEF_S = 0.05
#: How long the tests wait for a call's outcome (a few polls).
OUTCOME_S = 10.0


@pytest.fixture
def deaf_link(own_redis: EmbeddedRedis) -> Iterator[FaultProxy]:
    """A link to the test's Redis that drops every pub/sub message on its way to the client."""
    proxy = FaultProxy(own_redis.port)
    proxy.drop_pubsub_messages(True)
    try:
        yield proxy
    finally:
        proxy.close()


def raw(queue: AnyQueue) -> AsyncQueue | Queue:
    return queue.raw if isinstance(queue, SyncQueueAdapter) else queue


def request_key(queue: AnyQueue, request_id: str) -> str:
    return raw(queue).keys.endpoint(ENDPOINT).request(request_id)


def waited_ms(queue: AnyQueue) -> int:
    return int(queue.settings.waited_response_ttl_s() * 1000)


class Outcomes:
    """The callbacks of one send, recording every call (from any thread)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self._lock = threading.Lock()

    def on_response(self, response: Response) -> None:
        with self._lock:
            self.calls.append(("response", response))

    def on_failure(self, error: PrqError) -> None:
        with self._lock:
            self.calls.append(("failure", error))


async def test_a_call_that_missed_its_pulse_reads_an_answer_asked_to_be_kept_briefly(
    make_own_queue: QueueFactory, deaf_link: FaultProxy, own_redis_client: redis.Redis
) -> None:
    # Given a caller whose link drops every pulse, and a receiver
    caller = make_own_queue(redis_settings=RedisSettings(url=deaf_link.url))
    receiver = make_own_queue()
    make_own_queue.serve(receiver, ENDPOINT, lambda request: request.params)

    # When it calls with a request that asks its answer be kept for less than a poll interval
    request = Request(endpoint=ENDPOINT, method="m", params=7, response_ttl_s=BRIEF_S)
    response = await asyncio.wait_for(caller.queue_and_wait(request), OUTCOME_S)

    # Then the call reads the answer at its next poll (not DataLoss)...
    assert response.result == 7
    assert deaf_link.dropped_frames > 0
    # ...which was kept the time a caller that missed its pulse needs, and status still says
    # it is done
    ttl_ms = own_redis_client.pttl(request_key(caller, request.id))
    assert waited_ms(receiver) - 5_000 < ttl_ms <= waited_ms(receiver), ttl_ms
    assert (await caller.status(request.id)).state == RequestState.DONE


async def test_a_send_callback_gets_an_answer_asked_to_be_kept_briefly(
    make_own_queue: QueueFactory, deaf_link: FaultProxy
) -> None:
    # Given a sender whose link drops every pulse, and a receiver
    sender = make_own_queue(redis_settings=RedisSettings(url=deaf_link.url))
    receiver = make_own_queue()
    make_own_queue.serve(receiver, ENDPOINT, lambda request: request.params)

    # When it sends a request that asks its answer be kept for less than a poll interval
    outcomes = Outcomes()
    request = Request(endpoint=ENDPOINT, method="m", params=8, response_ttl_s=BRIEF_S)
    await sender.send(request, on_response=outcomes.on_response, on_failure=outcomes.on_failure)

    # Then its on_response callback gets the answer, and nothing else runs
    await async_wait_until(lambda: outcomes.calls, OUTCOME_S, 0.02, "a callback ran")
    assert [(kind, getattr(value, "result", value)) for kind, value in outcomes.calls] == [
        ("response", 8)
    ]


async def test_a_caller_that_joined_a_detached_request_reads_its_brief_answer(
    make_own_queue: QueueFactory, deaf_link: FaultProxy, own_redis_client: redis.Redis
) -> None:
    # Given a detached request queued by a BulkClient, asking its answer be kept briefly (with
    # nobody waiting it would be kept just that long)
    receiver = make_own_queue()
    request = Request(endpoint=ENDPOINT, method="m", params=9, response_ttl_s=BRIEF_S)
    with BulkClient.from_url(
        make_own_queue.url, prefix=make_own_queue.prefix, settings=make_own_queue.settings()
    ) as bulk:
        assert bulk.enqueue_many([request]).accepted == 1
    # And a caller whose link drops every pulse, which calls with the same id (and joins it
    # as a watcher)
    caller = make_own_queue(redis_settings=RedisSettings(url=deaf_link.url))
    joined = asyncio.create_task(caller.queue_and_wait(request))
    key = request_key(caller, request.id)

    def watched() -> bool:  # (a queued batch's record is a string until someone joins it)
        if own_redis_client.type(key) != b"hash":
            return False
        return caller.node_id.encode() in (own_redis_client.hget(key, "w") or b"").split()

    await async_wait_until(watched, OUTCOME_S, 0.02, "the caller joined as a watcher")

    # When a receiver answers it
    make_own_queue.serve(receiver, ENDPOINT, lambda request: request.params)

    # Then the caller reads the answer at its next poll (not DataLoss)
    response = await asyncio.wait_for(joined, OUTCOME_S)
    assert response.result == 9


async def test_a_detached_answer_is_kept_just_what_it_asked(
    make_own_queue: QueueFactory, own_redis_client: redis.Redis
) -> None:
    # Given a detached request that asks its answer be kept briefly, and nobody waiting for it
    receiver = make_own_queue()
    make_own_queue.serve(receiver, ENDPOINT, lambda request: request.params)
    request = Request(endpoint=ENDPOINT, method="m", params=1, response_ttl_s=1.0)
    settings = make_own_queue.settings()
    with BulkClient.from_url(make_own_queue.url, prefix=make_own_queue.prefix,
                             settings=settings) as bulk:  # fmt: skip
        assert bulk.enqueue_many([request]).accepted == 1
        # When it is answered
        await async_wait_until(
            lambda: bulk.outcomes(ENDPOINT, [request.id])[request.id].state == "done",
            OUTCOME_S,
            0.02,
            "answered",
        )
    # Then its answer is kept what it asked, not the floor of an answer someone waits for
    ttl_ms = own_redis_client.pttl(request_key(receiver, request.id))
    assert ttl_ms <= 1000 < waited_ms(receiver), ttl_ms


#: A caller and a receiver whose waited-for answers are kept 3 s (2 x 0.5 s poll + 1 s retry
#: budget + 1 s), that check for data loss only when asked to (and once for a new endpoint).
OUT_OF_TOUCH: dict[str, Any] = {
    "retry_budget_s": 1.0,
    "data_loss_check_interval_s": 3600.0,
    "pickup_timeout_s": 60.0,
}


def vouched(queue: AnyQueue) -> bool:
    """The node has checked its canary and the endpoint's counter (its first checks are in)."""
    watch = raw(queue)._watch.data_loss
    return watch.canary is not None and watch.floor(ENDPOINT, time.monotonic()) is not None


async def test_a_caller_cut_off_longer_than_an_answer_is_kept_gets_request_expired(
    make_own_queue: QueueFactory, deaf_link: FaultProxy, own_redis_client: redis.Redis
) -> None:
    # Given a caller whose link drops every pulse (and whose socket waits out a long stall),
    # waiting for a request nobody serves yet
    caller = make_own_queue(
        redis_settings=RedisSettings(url=deaf_link.url, socket_timeout_s=30), **OUT_OF_TOUCH
    )
    receiver = make_own_queue(**OUT_OF_TOUCH)
    request = Request(endpoint=ENDPOINT, method="m", params=3, response_ttl_s=BRIEF_S)
    waiting = asyncio.create_task(caller.queue_and_wait(request))
    await wait_for_state(caller, request.id, RequestState.QUEUED)
    await async_wait_until(lambda: vouched(caller), OUTCOME_S, 0.02, "first checks in")
    canary = raw(caller).keys.canary(caller.node_id)
    canary_before = own_redis_client.get(canary)
    assert canary_before is not None

    # When its link stalls (nothing flows either way), and meanwhile the request is answered
    # and its answer expires after the 3 s an answer someone waits for is kept
    deaf_link.blackhole()
    make_own_queue.serve(receiver, ENDPOINT, lambda request: request.params)
    key = request_key(caller, request.id)
    await async_wait_until(
        lambda: own_redis_client.hget(key, "st") == b"done", OUTCOME_S, 0.02, "answered"
    )
    await async_wait_until(lambda: not own_redis_client.exists(key), OUTCOME_S, 0.05, "expired")
    deaf_link.restore()

    # Then the caller, whose read gets through only now, is told its request expired: not
    # DataLoss, and its node asked for no data-loss check (the canary was not stepped)
    with pytest.raises(RequestExpired) as raised:
        await asyncio.wait_for(waiting, OUTCOME_S)
    assert not isinstance(raised.value, DataLoss)
    assert raised.value.maybe_executed and raised.value.retryable
    assert raised.value.request_id == request.id
    assert own_redis_client.get(canary) == canary_before
    assert raw(caller).stats.data_loss_events == 0


async def test_a_record_gone_while_its_caller_keeps_looking_is_still_data_loss(
    make_own_queue: QueueFactory, own_redis_client: redis.Redis
) -> None:
    # Given a caller waiting for a request a receiver holds
    caller, receiver = make_own_queue(), make_own_queue()
    request = Request(endpoint=ENDPOINT, method="m", response_ttl_s=BRIEF_S)
    waiting = asyncio.create_task(caller.queue_and_wait(request))
    pending = await receiver.dequeue(ENDPOINT, timeout_s=OUTCOME_S)
    assert pending is not None
    await wait_for_state(caller, request.id, RequestState.TAKEN)

    # When its record vanishes while the caller polls (as Redis losing it would look)
    assert own_redis_client.delete(request_key(caller, request.id)) == 1

    # Then the caller is told DataLoss: no answer it waits for expires that soon
    with pytest.raises(DataLoss):
        await asyncio.wait_for(waiting, OUTCOME_S)
