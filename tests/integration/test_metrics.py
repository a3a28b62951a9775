"""prq's Prometheus metrics count what really happened, on both facades.

Series live in the process-wide registry, so each test uses endpoints of its own and compares
values before and after.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from prq import (
    PickupTimeout,
    QueueSettings,
    QueueUnavailable,
    ReceiverLost,
    RemoteError,
    Request,
    RequestState,
)
from prq.embedded import EmbeddedRedis
from prq.ops.exporter import refresh_endpoint_gauges
from prq.ops.inspector import Inspector
from tests.queue_facades import FAST_SETTINGS, QueueFactory, wait_for_state
from tests.redis_servers import async_wait_until

pytestmark = pytest.mark.integration


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def fresh_endpoint(tag: str) -> str:
    return f"poll://metrics-{tag}-{uuid.uuid4().hex[:8]}"


async def test_a_round_trip_is_counted_on_both_sides(make_queue: QueueFactory) -> None:
    endpoint = fresh_endpoint("ok")
    sender, receiver = make_queue(), make_queue()

    def handler(request: Request) -> object:
        if request.method == "boom":
            raise ValueError("no")
        return request.params

    make_queue.serve(receiver, endpoint, handler, concurrency=2)
    for i in range(3):
        assert await sender.call(endpoint, "echo", i) == i
    with pytest.raises(RemoteError):
        await sender.call(endpoint, "boom")
    # (the receiver counts an answer once its write returns: its caller may see it first)
    await async_wait_until(
        lambda: value("prq_responded_total", endpoint=endpoint) == 4, 10, 0.01, "4 answers"
    )

    assert value("prq_enqueued_total", endpoint=endpoint) == 4
    assert value("prq_taken_total", endpoint=endpoint) == 4
    assert value("prq_responded_total", endpoint=endpoint) == 4
    assert value("prq_round_trip_seconds_count", endpoint=endpoint) == 4
    assert value("prq_round_trip_seconds_sum", endpoint=endpoint) > 0
    assert value("prq_pickup_wait_seconds_count", endpoint=endpoint) == 4
    assert value("prq_failed_total", endpoint=endpoint, error="RemoteError") == 1


async def test_failures_are_counted_by_error_type(make_queue: QueueFactory) -> None:
    endpoint = fresh_endpoint("fail")
    sender = make_queue(
        receiver_timeout_s=1.0, heartbeat_interval_s=0.2, heartbeat_initial_delay_s=0.2
    )
    receiver = make_queue(
        receiver_timeout_s=1.0, heartbeat_interval_s=0.2, heartbeat_initial_delay_s=0.2
    )
    with pytest.raises(PickupTimeout):
        await sender.queue_and_wait(Request(endpoint=endpoint, method="m"), pickup_timeout_s=0.1)

    # A receiver that takes a request and dies: its caller declares it lost
    call = asyncio.create_task(sender.queue_and_wait(Request(endpoint=endpoint, method="m")))
    assert await receiver.dequeue(endpoint, timeout_s=5) is not None
    await receiver.aclose()
    with pytest.raises(ReceiverLost):
        await asyncio.wait_for(call, 10)

    assert value("prq_failed_total", endpoint=endpoint, error="PickupTimeout") == 1
    assert value("prq_failed_total", endpoint=endpoint, error="ReceiverLost") == 1
    assert value("prq_heartbeats_missed_total", endpoint=endpoint, side="receiver") == 1
    assert value("prq_enqueued_total", endpoint=endpoint) == 2


async def test_cancel_is_counted_once(make_queue: QueueFactory) -> None:
    endpoint = fresh_endpoint("cancel")
    sender, other = make_queue(pickup_timeout_s=30), make_queue()
    request = Request(endpoint=endpoint, method="m")
    call = asyncio.create_task(sender.queue_and_wait(request))
    await wait_for_state(sender, request.id, RequestState.QUEUED)
    # From a node that knows only the id; a second cancel changes nothing
    assert await other.cancel(request.id) is True
    assert await other.cancel(request.id) is False
    with pytest.raises(Exception, match="cancel"):
        await asyncio.wait_for(call, 10)
    assert value("prq_cancelled_total", endpoint=endpoint) == 1
    assert value("prq_failed_total", endpoint=endpoint, error="CancelledBeforePickup") == 1


async def test_data_loss_and_redis_retries_are_counted(
    make_own_queue: QueueFactory, own_redis: EmbeddedRedis, own_redis_client: redis.Redis
) -> None:
    queue = make_own_queue(data_loss_check_interval_s=0.1, retry_budget_s=1.0)
    await queue.start()
    losses, retries = value("prq_data_loss_events_total"), value("prq_redis_retries_total")

    # When Redis loses everything (after the node's first check wrote its canary), it says so
    await async_wait_until(
        lambda: own_redis_client.exists(f"{queue.keys.prefix}:canary:{{{queue.node_id}}}"),
        5,
        0.02,
        "canary written",
    )
    own_redis_client.flushall()
    await async_wait_until(
        lambda: value("prq_data_loss_events_total") >= losses + 1, 10, 0.05, "loss counted"
    )

    # When Redis is gone, the call's round trips are retried until the budget runs out
    own_redis.kill()
    with pytest.raises(QueueUnavailable):
        await queue.queue_and_wait(Request(endpoint=fresh_endpoint("gone"), method="m"))
    assert value("prq_redis_retries_total") > retries


async def test_endpoint_gauges_come_from_redis_at_scrape(
    make_queue: QueueFactory, redis_url: str, key_prefix: str, redis_client: redis.Redis
) -> None:
    endpoint = fresh_endpoint("gauge")
    sender = make_queue(pickup_timeout_s=30, data_loss_check_interval_s=0.2)
    requests = [Request(endpoint=endpoint, method="m") for _ in range(3)]
    calls = [asyncio.create_task(sender.queue_and_wait(r)) for r in requests]
    for request in requests:
        await wait_for_state(sender, request.id, RequestState.QUEUED)
    settings = QueueSettings(**{**FAST_SETTINGS, "data_loss_check_interval_s": 0.2})
    async with Inspector.from_url(redis_url, prefix=key_prefix, settings=settings) as view:

        async def scrape_shows_three() -> bool:
            await refresh_endpoint_gauges(view)
            return value("prq_endpoint_depth", endpoint=endpoint) == 3

        await async_wait_until(scrape_shows_three, 10, 0.05, "depth gauge shows 3")
        assert value("prq_endpoint_in_flight", endpoint=endpoint) == 0
        assert value("prq_endpoint_enqueued_total", endpoint=endpoint) == 3
        assert value("prq_endpoint_oldest_age_seconds", endpoint=endpoint) >= 0
        assert value("prq_endpoint_dead_letters", endpoint=endpoint) == 0

        # The exposition parses, and names every prq family with the prq_ prefix
        families = {f.name for f in text_string_to_metric_families(generate_latest().decode())}
        expected = {
            "prq_enqueued", "prq_taken", "prq_responded", "prq_failed", "prq_cancelled",
            "prq_dead_lettered", "prq_heartbeats_missed", "prq_data_loss_events",
            "prq_redis_retries", "prq_pickup_wait_seconds", "prq_round_trip_seconds",
            "prq_endpoint_depth", "prq_endpoint_in_flight", "prq_endpoint_oldest_age_seconds",
            "prq_endpoint_receivers", "prq_endpoint_enqueued", "prq_endpoint_max_in_flight",
            "prq_endpoint_max_pending", "prq_endpoint_dead_letters",
        }  # fmt: skip
        assert expected <= families

        # When no node reports the endpoint any more, its series go away at the next scrape
        for call in calls:
            call.cancel()
        await asyncio.gather(*calls, return_exceptions=True)
        await sender.aclose()
        redis_client.delete(f"{key_prefix}:endpoints")
        await refresh_endpoint_gauges(view)
        assert REGISTRY.get_sample_value("prq_endpoint_depth", {"endpoint": endpoint}) is None


async def test_limit_gauges_show_only_the_limits_that_are_set(
    make_queue: QueueFactory, redis_url: str, key_prefix: str
) -> None:
    # Given two reported endpoints, one limited in flight only, one without limits
    limited, unlimited = fresh_endpoint("limited"), fresh_endpoint("unlimited")
    node = make_queue(data_loss_check_interval_s=0.2)
    for endpoint in (limited, unlimited):
        with pytest.raises(PickupTimeout):
            await node.queue_and_wait(Request(endpoint=endpoint, method="m"), pickup_timeout_s=0.05)
    await node.set_limits(limited, max_in_flight=6)
    settings = QueueSettings(**{**FAST_SETTINGS, "data_loss_check_interval_s": 0.2})
    async with Inspector.from_url(redis_url, prefix=key_prefix, settings=settings) as view:

        def sample(name: str, endpoint: str) -> float | None:
            return REGISTRY.get_sample_value(name, {"endpoint": endpoint})

        # When the gauges are refreshed (until the node has reported both endpoints)
        async def both_scraped() -> bool:
            await refresh_endpoint_gauges(view)
            return all(sample("prq_endpoint_depth", e) is not None for e in (limited, unlimited))

        await async_wait_until(both_scraped, 10, 0.05, "both endpoints scraped")

        # Then the limit that is set has its gauge, and the limits that are not have none
        assert sample("prq_endpoint_max_in_flight", limited) == 6
        assert sample("prq_endpoint_max_pending", limited) is None
        assert sample("prq_endpoint_max_in_flight", unlimited) is None
        assert sample("prq_endpoint_max_pending", unlimited) is None

        # When the limits are replaced, Then the next refresh follows
        await node.set_limits(limited, max_pending=12)
        await refresh_endpoint_gauges(view)
        assert sample("prq_endpoint_max_in_flight", limited) is None
        assert sample("prq_endpoint_max_pending", limited) == 12
