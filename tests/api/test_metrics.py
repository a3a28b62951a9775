"""`/metrics`: Prometheus text that the Prometheus parser reads, with prq's series and the
per-endpoint gauges refreshed from Redis on the scrape."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from prq import AsyncQueue, Request, RequestState
from prq.embedded import EmbeddedRedis
from tests.api.conftest import MakeApi
from tests.queue_facades import wait_for_state
from tests.redis_servers import async_wait_until

pytestmark = pytest.mark.integration

ENDPOINT = "poll://metrics-1"
#: Redis's clock and the sender's (same host) may disagree by this much in an age.
CLOCK_SLACK_S = 0.05

#: Families prq exposes (the parser names counters without their `_total` suffix).
PRQ_FAMILIES = {
    "prq_enqueued",
    "prq_taken",
    "prq_responded",
    "prq_failed",
    "prq_cancelled",
    "prq_dead_lettered",
    "prq_redelivered",
    "prq_heartbeats_missed",
    "prq_data_loss_events",
    "prq_redis_retries",
    "prq_pickup_wait_seconds",
    "prq_round_trip_seconds",
    "prq_endpoint_depth",
    "prq_endpoint_priority_depth",
    "prq_endpoint_in_flight",
    "prq_endpoint_oldest_age_seconds",
    "prq_endpoint_receivers",
    "prq_endpoint_enqueued",
    "prq_endpoint_max_in_flight",
    "prq_endpoint_max_pending",
    "prq_endpoint_dead_letters",
    "prq_redis_used_memory_bytes",
    "prq_redis_maxmemory_bytes",
    "prq_redis_evicted_keys",
}


#: family name -> {(label pairs..., ("__name__", sample name)): value}
Families = dict[str, dict[tuple[tuple[str, str], ...], float]]


async def scrape(http: httpx.AsyncClient, headers: dict[str, str]) -> Families:
    response = await http.get("/metrics", headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    families: Families = {}
    for family in text_string_to_metric_families(response.text):
        families[family.name] = {
            (*sorted(s.labels.items()), ("__name__", s.name)): s.value for s in family.samples
        }
    return families


def gauge(families: Families, name: str, endpoint: str) -> float | None:
    key = (("endpoint", endpoint), ("__name__", name))
    return families.get(name, {}).get(key)


async def test_metrics_parse_and_show_the_queued_depth(
    http: httpx.AsyncClient, read: dict[str, str], sender: AsyncQueue
) -> None:
    # Given two requests queued on an endpoint by another node, at two priorities
    requests = [Request(endpoint=ENDPOINT, method="m", priority=p) for p in (3, -1)]
    before_enqueue = time.monotonic()
    calls = [asyncio.create_task(sender.queue_and_wait(r)) for r in requests]
    try:
        for request in requests:
            await wait_for_state(sender, request.id, RequestState.QUEUED)

        # When /metrics is scraped (with a read token) until the node has reported the endpoint
        async def depth_shown() -> Families | None:
            families = await scrape(http, read)
            return families if gauge(families, "prq_endpoint_depth", ENDPOINT) == 2 else None

        families = await async_wait_until(depth_shown, 10, 0.05, "depth gauge = 2")

        # Then every prq family is there, and the endpoint's gauges match Redis
        assert set(families) >= PRQ_FAMILIES
        assert gauge(families, "prq_endpoint_in_flight", ENDPOINT) == 0
        assert gauge(families, "prq_endpoint_receivers", ENDPOINT) == 0
        # ... with the depth per priority
        by_priority = {
            dict(key)["priority"]: value
            for key, value in families["prq_endpoint_priority_depth"].items()
            if dict(key)["endpoint"] == ENDPOINT
        }
        assert by_priority == {"3": 1, "-1": 1}
        # ... the oldest request's age: above 0 (it is queued) and no more than it can be
        oldest_age = gauge(families, "prq_endpoint_oldest_age_seconds", ENDPOINT)
        assert oldest_age is not None
        assert 0 < oldest_age <= time.monotonic() - before_enqueue + CLOCK_SLACK_S
        # ... and the endpoint's enqueue counter in Redis (all nodes): the two requests
        endpoint_enqueued = families["prq_endpoint_enqueued"]
        key = (("endpoint", ENDPOINT), ("__name__", "prq_endpoint_enqueued_total"))
        assert endpoint_enqueued[key] == 2
        # And this process's enqueue counter counted the two requests
        enqueued = families["prq_enqueued"]
        key = (("endpoint", ENDPOINT), ("__name__", "prq_enqueued_total"))
        assert enqueued[key] >= 2
        # And Redis's memory is there for each server (each primary of a cluster)
        used = redis_series(families, "prq_redis_used_memory_bytes", "prq_redis_used_memory_bytes")
        assert used and all(value > 0 for value in used.values()), used
    finally:
        for call in calls:
            call.cancel()
        await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 10)


def redis_series(families: Families, family: str, sample: str) -> dict[str, float]:
    """node -> value of one of the per-server Redis series."""
    return {
        dict(key)["node"]: value
        for key, value in families.get(family, {}).items()
        if dict(key)["__name__"] == sample
    }


#: Bytes per value written to fill a Redis up to its maxmemory.
FILL_VALUE_BYTES = 10_000
#: Most values written to make a full Redis evict (a bound: it evicts far sooner).
FILL_MAX_KEYS = 2_000


async def test_metrics_show_redis_memory_and_evictions(
    make_api: MakeApi,
    own_redis: EmbeddedRedis,
    own_redis_client: redis.Redis,
    read: dict[str, str],
) -> None:
    # Given the service on a Redis of the test's own, without a memory limit
    api = make_api(own_redis.url)
    node = f"127.0.0.1:{own_redis.port}"
    async with httpx.AsyncClient(base_url=api.url, timeout=15) as http:
        # When /metrics is scraped
        families = await scrape(http, read)

        # Then Redis's memory is there, for that server, with no limit and nothing evicted
        used = redis_series(families, "prq_redis_used_memory_bytes", "prq_redis_used_memory_bytes")
        assert set(used) == {node} and used[node] > 0
        limit = redis_series(families, "prq_redis_maxmemory_bytes", "prq_redis_maxmemory_bytes")
        assert limit == {node: 0}
        evicted = redis_series(families, "prq_redis_evicted_keys", "prq_redis_evicted_keys_total")
        assert evicted == {node: 0}

        # When that Redis is given a limit just above its use, told to evict, and filled past it
        used_now = int(own_redis_client.info("memory")["used_memory"])
        own_redis_client.config_set("maxmemory", used_now + 1_000_000)
        own_redis_client.config_set("maxmemory-policy", "allkeys-random")
        for n in range(FILL_MAX_KEYS):
            own_redis_client.set(f"fill:{n}", b"x" * FILL_VALUE_BYTES)
            if int(own_redis_client.info("stats")["evicted_keys"]) > 0:
                break
        families = await scrape(http, read)

        # Then the scrape shows the limit and the evictions
        limit = redis_series(families, "prq_redis_maxmemory_bytes", "prq_redis_maxmemory_bytes")
        assert limit == {node: used_now + 1_000_000}
        evicted = redis_series(families, "prq_redis_evicted_keys", "prq_redis_evicted_keys_total")
        assert evicted[node] > 0
