"""The queue-wide series the admin service exports, read from Redis through the Inspector: per
endpoint (`prq_endpoint_*`) and per Redis server (`prq_redis_*`). They describe Redis, not this
process: a scrape handler reads them with `refresh_endpoint_gauges` and `refresh_redis_gauges`
(the admin service does this on every `/metrics`), so they cost nothing between scrapes, and the
admin service's scrape gives the queue-wide picture while each worker's gives its own work (the
counters of prq.observe.metrics, which must not import this module).

Importing this module registers its two collectors in the process-wide default registry.

Series:
    prq_endpoint_depth{endpoint}            queued requests (from Redis, at scrape)
    prq_endpoint_priority_depth{endpoint,priority}  queued requests per priority level, for
                                            the highest levels that hold any (at scrape)
    prq_endpoint_in_flight{endpoint}        picked up, unanswered (from Redis, at scrape)
    prq_endpoint_oldest_age_seconds{endpoint}  age of the oldest queued request (at scrape)
    prq_endpoint_receivers{endpoint}        live receiver nodes (from Redis, at scrape)
    prq_endpoint_enqueued_total{endpoint}   the endpoint's enqueue counter in Redis, all nodes
    prq_endpoint_max_in_flight{endpoint}    its max_in_flight limit (only when one is set)
    prq_endpoint_max_pending{endpoint}      its max_pending limit (only when one is set)
    prq_endpoint_dead_letters{endpoint}     dead letters kept for it (from Redis, at scrape)
    prq_redis_used_memory_bytes{node}       Redis's used_memory (INFO, at scrape; per primary
                                            of a cluster)
    prq_redis_maxmemory_bytes{node}         Redis's maxmemory (0: no limit; at scrape)
    prq_redis_evicted_keys_total{node}      keys Redis evicted since it started (at scrape):
                                            with prq's noeviction, always 0
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client import REGISTRY
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from prq.ops.answers import EndpointInfo, RedisMemory
    from prq.ops.inspector import Inspector

__all__ = [
    "ENDPOINTS",
    "REDIS",
    "EndpointCollector",
    "RedisCollector",
    "refresh_endpoint_gauges",
    "refresh_redis_gauges",
]


class EndpointCollector(Collector):
    """The per-endpoint series read from Redis: the last snapshot `refresh` took.

    A custom collector rather than gauges, so that an endpoint no node reports any more simply
    drops out of the next scrape, and so that the endpoint's enqueue counter in Redis is
    exposed as a counter (`prq_endpoint_enqueued_total`, for rate()).
    """

    def __init__(self) -> None:
        self._infos: list[EndpointInfo] = []

    def update(self, infos: list[EndpointInfo]) -> None:
        self._infos = list(infos)

    def describe(self) -> Iterable[Metric]:
        return self._families([])

    def collect(self) -> Iterable[Metric]:
        return self._families(self._infos)

    @staticmethod
    def _families(infos: list[EndpointInfo]) -> list[Metric]:
        depth = GaugeMetricFamily(
            "prq_endpoint_depth", "Queued requests (read from Redis).", labels=["endpoint"]
        )
        by_priority = GaugeMetricFamily(
            "prq_endpoint_priority_depth",
            "Queued requests per priority level that holds any (read from Redis).",
            labels=["endpoint", "priority"],
        )
        in_flight = GaugeMetricFamily(
            "prq_endpoint_in_flight",
            "Requests picked up and unanswered (read from Redis).",
            labels=["endpoint"],
        )
        oldest = GaugeMetricFamily(
            "prq_endpoint_oldest_age_seconds",
            "Age of the oldest queued request (0 when none; read from Redis).",
            labels=["endpoint"],
        )
        receivers = GaugeMetricFamily(
            "prq_endpoint_receivers", "Live receiver nodes (read from Redis).", labels=["endpoint"]
        )
        enqueued = CounterMetricFamily(
            "prq_endpoint_enqueued",
            "Requests enqueued on the endpoint by any node (Redis's counter; it restarts from 0 "
            "when Redis loses its data).",
            labels=["endpoint"],
        )
        max_in_flight = GaugeMetricFamily(
            "prq_endpoint_max_in_flight",
            "The endpoint's max_in_flight limit (read from Redis; no series when unlimited).",
            labels=["endpoint"],
        )
        max_pending = GaugeMetricFamily(
            "prq_endpoint_max_pending",
            "The endpoint's max_pending limit (read from Redis; no series when unlimited).",
            labels=["endpoint"],
        )
        dead_letters = GaugeMetricFamily(
            "prq_endpoint_dead_letters",
            "Dead letters kept for the endpoint (read from Redis).",
            labels=["endpoint"],
        )
        for info in infos:
            labels = [info.endpoint]
            dead_letters.add_metric(labels, info.dead_letters)
            depth.add_metric(labels, info.depth)
            for level in info.priorities:
                by_priority.add_metric([info.endpoint, str(level.priority)], level.depth)
            in_flight.add_metric(labels, info.in_flight)
            oldest.add_metric(labels, info.oldest_age_s or 0.0)
            receivers.add_metric(labels, info.receivers)
            enqueued.add_metric(labels, info.enqueued_total)
            if info.max_in_flight is not None:
                max_in_flight.add_metric(labels, info.max_in_flight)
            if info.max_pending is not None:
                max_pending.add_metric(labels, info.max_pending)
        return [
            depth, by_priority, in_flight, oldest, receivers, enqueued, max_in_flight,
            max_pending, dead_letters,
        ]  # fmt: skip


ENDPOINTS = EndpointCollector()
REGISTRY.register(ENDPOINTS)


class RedisCollector(Collector):
    """Redis's memory and evictions, per server, as of the last `refresh_redis_gauges`: what
    an alert needs to see a Redis filling up (prq's noeviction: enqueues will fail with
    QueueFull) or, misconfigured, evicting keys (each an unnoticed lost request). A collector
    for the same reasons as EndpointCollector: a server gone from a cluster drops out."""

    def __init__(self) -> None:
        self._servers: list[RedisMemory] = []

    def update(self, servers: list[RedisMemory]) -> None:
        self._servers = list(servers)

    def describe(self) -> Iterable[Metric]:
        return self._families([])

    def collect(self) -> Iterable[Metric]:
        return self._families(self._servers)

    @staticmethod
    def _families(servers: list[RedisMemory]) -> list[Metric]:
        used = GaugeMetricFamily(
            "prq_redis_used_memory_bytes",
            "Redis's used_memory (INFO memory, read at scrape).",
            labels=["node"],
        )
        limit = GaugeMetricFamily(
            "prq_redis_maxmemory_bytes",
            "Redis's maxmemory, 0 when it has no limit (INFO memory, read at scrape).",
            labels=["node"],
        )
        evicted = CounterMetricFamily(
            "prq_redis_evicted_keys",
            "Keys Redis evicted since it started (INFO stats, read at scrape).",
            labels=["node"],
        )
        for server in servers:
            used.add_metric([server.node], server.used_memory_bytes)
            limit.add_metric([server.node], server.maxmemory_bytes)
            evicted.add_metric([server.node], server.evicted_keys)
        return [used, limit, evicted]


REDIS = RedisCollector()
REGISTRY.register(REDIS)


async def refresh_endpoint_gauges(inspector: Inspector) -> None:
    """Read every endpoint from Redis once (a few pipelined round trips) for the next scrape;
    endpoints no node reports any more drop out."""
    ENDPOINTS.update(await inspector.endpoints())


async def refresh_redis_gauges(inspector: Inspector) -> None:
    """Read each Redis server's memory and evictions (INFO) for the next scrape."""
    REDIS.update(await inspector.redis_memory())
