"""Retrying with the same request id: safe after a failure before pickup, never a second run
after a success while its record is kept; sent again after that, it is a new request that runs
(also when the endpoint's enqueue counter expired meanwhile and hands out the same sequence
number again)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis

from prq import PickupTimeout, Request
from prq.core.models import Delivery
from tests.queue_facades import AnyQueue, QueueFactory, SyncQueueAdapter
from tests.redis_servers import async_wait_until

pytestmark = pytest.mark.integration

#: Shrunk TTLs: an answered request is kept 1 s; an enqueue counter nobody refreshes expires 2 s
#: after its last refresh.
SHORT_LIVED: dict[str, Any] = {
    "response_ttl_s": 1.0,
    "list_ttl_s": 2.0,
    "data_loss_check_interval_s": 0.2,
}


def events(queue: AnyQueue) -> int:
    raw = queue.raw if isinstance(queue, SyncQueueAdapter) else queue
    return raw.stats.data_loss_events


async def test_a_pickup_timeout_can_be_retried_with_the_same_id(make_queue: QueueFactory) -> None:
    # Given a call that timed out before pickup (no receiver yet)
    sender = make_queue()
    request = Request(endpoint="poll://late", method="m", params=1)
    with pytest.raises(PickupTimeout):
        await asyncio.wait_for(sender.queue_and_wait(request, pickup_timeout_s=0.3), 10)

    # When a receiver comes up and the caller retries with the same request
    runs: list[str] = []

    def handler(req: Request) -> object:
        runs.append(req.id)
        return "ran"

    receiver = make_queue()
    make_queue.serve(receiver, "poll://late", handler)
    response = await asyncio.wait_for(sender.queue_and_wait(request, pickup_timeout_s=5), 10)

    # Then it runs, once
    assert response.result == "ran"
    assert runs == [request.id]
    # And a further retry of the finished request returns the stored response without a run
    again = await asyncio.wait_for(sender.queue_and_wait(request, pickup_timeout_s=5), 10)
    assert again.result == "ran"
    assert runs == [request.id]


@pytest.mark.parametrize("delivery", ["at_most_once", "at_least_once"])
async def test_an_id_sent_again_after_its_record_expired_runs_again(
    make_queue: QueueFactory, redis_client: redis.Redis, delivery: Delivery
) -> None:
    # Given a request answered by a long-lived receiver
    sender = make_queue(**SHORT_LIVED)
    receiver = make_queue(**SHORT_LIVED)
    runs: list[str] = []

    def handler(req: Request) -> object:
        runs.append(req.id)
        return len(runs)

    make_queue.serve(receiver, "poll://rerun", handler)
    request = Request(id="job-1", endpoint="poll://rerun", method="m", delivery=delivery)
    first = await asyncio.wait_for(sender.queue_and_wait(request), 10)
    assert first.result == 1

    # When its record expired (the response TTL passed) and the same id is sent again
    record = sender.keys.endpoint("poll://rerun").request("job-1")
    await async_wait_until(lambda: not redis_client.exists(record), 10, 0.05, "record expired")
    again = await asyncio.wait_for(sender.queue_and_wait(request), 10)

    # Then it is a new request: it runs again, and nobody declares data loss
    assert again.result == 2
    assert runs == ["job-1", "job-1"]
    assert events(sender) == events(receiver) == 0


async def test_an_id_sent_again_after_its_endpoint_sat_idle_past_the_list_ttl_runs_again(
    make_queue: QueueFactory, redis_client: redis.Redis
) -> None:
    # Given a request (the endpoint's first: sequence number 1) answered by a receiver that
    # then stops serving the endpoint, but lives on
    sender = make_queue(**SHORT_LIVED)
    receiver = make_queue(**SHORT_LIVED)
    runs: list[str] = []

    def handler(req: Request) -> object:
        runs.append(req.id)
        return len(runs)

    serving = make_queue.serve(receiver, "poll://daily", handler)
    assert await asyncio.wait_for(sender.call("poll://daily", "m", request_id="job-1"), 10) == 1
    await serving.stop()

    # When the endpoint's enqueue counter expired (nobody used it for a list TTL), and the
    # receiver serves it again and the same id is sent again
    keys = sender.keys.endpoint("poll://daily")
    await async_wait_until(
        lambda: not redis_client.exists(keys.sequence, keys.request("job-1")),
        20,
        0.05,
        "counter and record expired",
    )
    make_queue.serve(receiver, "poll://daily", handler)
    again = await asyncio.wait_for(sender.call("poll://daily", "m", request_id="job-1"), 10)

    # Then it runs again, although it got the same sequence number as the first time
    assert redis_client.get(keys.sequence) == b"1"
    assert again == 2
    assert runs == ["job-1", "job-1"]
    assert events(sender) == events(receiver) == 0
