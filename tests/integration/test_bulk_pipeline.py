"""BulkClient.enqueue_many over several round trips: the next batch is encoded while the previous
one is in flight, yet the round trips go one at a time, in order, each with its own short nonce,
and the first error stops the call before any later batch is sent."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from prq import QueueSettings, Request
from prq.bulk import BatchRefused, BulkClient
from tests.queue_facades import FAST_SETTINGS
from tests.queued import queue_depth
from tests.stored_bodies import record_field

pytestmark = pytest.mark.integration


@pytest.fixture
def bulk(redis_url: str, key_prefix: str) -> Iterator[BulkClient]:
    settings = QueueSettings(**{**FAST_SETTINGS, "pickup_timeout_s": 60})
    with BulkClient.from_url(redis_url, prefix=key_prefix, settings=settings) as client:
        yield client


def test_round_trips_go_in_order_each_with_its_own_short_nonce(
    bulk: BulkClient, redis_client: redis.Redis
) -> None:
    # Given 2,500 requests sent 1,000 per round trip, one of them too large
    endpoint = "poll://pipeline"
    requests = [Request(endpoint=endpoint, method="m", params=i, id=f"p:{i}") for i in range(2500)]
    requests[1500] = Request(
        endpoint=endpoint, method="m", params="x" * (bulk.settings.max_body_bytes + 1), id="p:big"
    )
    seconds, micros = redis_client.time()
    started_us = seconds * 1_000_000 + micros
    result = bulk.enqueue_many(iter(requests))

    # Then every other request is queued once, in batch order, and the large one rejected
    assert (result.accepted, result.duplicates) == (2499, 0)
    assert [r.request_id for r in result.rejected] == ["p:big"]
    keys = bulk.keys.endpoint(endpoint)
    assert queue_depth(redis_client, keys) == 2499
    sent = [r.id for r in requests if r.id != "p:big"]
    records = [keys.request_prefix + rid for rid in sent]
    sequence = [int(record_field(redis_client, key, "sq") or 0) for key in records]
    assert sequence == sorted(sequence) and len(set(sequence)) == 2499  # (batch order, once)
    assert sequence[0] >= started_us
    # And each round trip wrote its own nonce, 11 characters long
    nonces = [record_field(redis_client, key, "bn") for key in records]
    assert [len(n or b"") for n in nonces] == [11] * 2499
    assert len({nonces[0], nonces[1000], nonces[2000]}) == 3
    assert set(nonces[:1000]) == {nonces[0]}


def test_the_first_failing_round_trip_stops_the_call(
    bulk: BulkClient, redis_client: redis.Redis
) -> None:
    # Given an endpoint with room for 1,500 queued requests, and 3,000 to send, 1,000 a trip
    endpoint = "poll://pipeline-full"
    keys = bulk.keys.endpoint(endpoint)
    redis_client.hset(keys.limits, "mp", 1500)
    read: list[int] = []

    def requests() -> Iterator[Request]:
        for i in range(3000):
            read.append(i)
            yield Request(endpoint=endpoint, method="m", params=i, id=f"f:{i}")

    # When they are sent, Then the second round trip is refused in part
    with pytest.raises(BatchRefused) as refused:
        bulk.enqueue_many(requests())
    assert refused.value.partial.accepted == 500
    assert refused.value.refused == {endpoint: 500}
    # And the third batch was read and encoded (while the second was in flight), never sent
    assert len(read) == 3000
    assert queue_depth(redis_client, keys) == 1500
    assert not any(redis_client.exists(keys.request_prefix + f"f:{i}") for i in range(2000, 3000))
    assert all(redis_client.exists(keys.request_prefix + f"f:{i}") for i in range(1500))


@pytest.mark.parametrize("fails_at", [1500, 2500])
def test_requests_that_raise_midway_leave_the_batches_before_sent(
    bulk: BulkClient, redis_client: redis.Redis, fails_at: int
) -> None:
    # Given requests whose source fails partway through a batch
    endpoint = f"poll://pipeline-broken-{fails_at}"

    def requests() -> Iterator[Request]:
        for i in range(3000):
            if i == fails_at:
                raise ValueError("the source failed")
            yield Request(endpoint=endpoint, method="m", params=i, id=f"b:{i}")

    # When they are sent, Then the error is raised, after every full batch before it was sent
    with pytest.raises(ValueError, match="the source failed"):
        bulk.enqueue_many(requests())
    sent = fails_at // 1000 * 1000
    assert queue_depth(redis_client, bulk.keys.endpoint(endpoint)) == sent
