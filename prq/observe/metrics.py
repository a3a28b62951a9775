"""Prometheus metrics of prq, in the process-wide default registry (names prefixed `prq_`).

Counters and histograms count what this process's nodes did; every node in the process adds to
the same series, labelled by endpoint. The `prq_endpoint_*` series describe Redis, not this
process: a scrape handler reads them from Redis with `refresh_endpoint_gauges` (the admin
service does this on every `/metrics`), so they cost nothing between scrapes, and the admin
service's scrape gives the queue-wide picture while each worker's gives its own work.

Expose them with `prometheus_client.start_http_server(port)` in a worker process, or scrape the
admin service's `/metrics`.

Series:
    prq_enqueued_total{endpoint}            requests this process enqueued (new, not replays)
    prq_taken_total{endpoint}               requests this process's receivers took
    prq_responded_total{endpoint}           responses this process's receivers stored
    prq_failed_total{endpoint,error}        calls that ended without a result: a prq error by
                                            class name, or RemoteError when the service raised
    prq_handler_errors_total{endpoint,error}  handler runs on this process's receivers that
                                            raised (error: the exception's class name) or
                                            returned no JSON (SerializationError)
    prq_cancelled_total{endpoint}           requests cancelled through this process's cancel()
    prq_dead_lettered_total{endpoint}       requests moved to the dead-letter list
    prq_redelivered_total{endpoint}         at_least_once requests of silent receivers that
                                            this process's calls or takes handed out again
                                            (or dead-lettered, their attempts used up)
    prq_heartbeats_missed_total{endpoint,side}  a side declared lost: side="receiver" (seen by
                                            the sender) or "sender" (seen by the receiver)
    prq_data_loss_events_total              data-loss declarations (Redis lost or rolled back)
    prq_redis_retries_total                 Redis round trips retried after a connection failure
    prq_pickup_wait_seconds{endpoint}       enqueue to pickup (0 for a hand-off to a waiting
                                            receiver); sender's clock vs receiver's clock
    prq_round_trip_seconds{endpoint}        queue_and_wait from call to response
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

import functools
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from prq.core.errors import PrqError, ReceiverLost

if TYPE_CHECKING:
    from prq.core.models import Response
    from prq.ops.admin import EndpointInfo, Inspector, RedisMemory

__all__ = [
    "CANCELLED",
    "DATA_LOSS_EVENTS",
    "DEAD_LETTERED",
    "ENDPOINTS",
    "ENQUEUED",
    "FAILED",
    "HANDLER_ERRORS",
    "HEARTBEATS_MISSED",
    "PICKUP_WAIT",
    "REDELIVERED",
    "REDIS",
    "REDIS_RETRIES",
    "RESPONDED",
    "ROUND_TRIP",
    "TAKEN",
    "EndpointSeries",
    "call_ended",
    "refresh_endpoint_gauges",
    "refresh_redis_gauges",
    "series",
    "taken",
]

#: Latency buckets, seconds: sub-millisecond round trips up to calls that run for minutes.
LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 120.0, 300.0,
)  # fmt: skip

ENQUEUED = Counter("prq_enqueued", "Requests enqueued by this process.", ["endpoint"])
TAKEN = Counter("prq_taken", "Requests taken by this process's receivers.", ["endpoint"])
RESPONDED = Counter("prq_responded", "Responses stored by this process's receivers.", ["endpoint"])
FAILED = Counter(
    "prq_failed",
    "Calls that ended without a result, by error type (RemoteError: the service raised).",
    ["endpoint", "error"],
)
HANDLER_ERRORS = Counter(
    "prq_handler_errors",
    "Handler runs on this process's receivers that raised or returned no JSON, by error type.",
    ["endpoint", "error"],
)
CANCELLED = Counter(
    "prq_cancelled", "Requests cancelled through this process's cancel().", ["endpoint"]
)
DEAD_LETTERED = Counter(
    "prq_dead_lettered", "Requests moved to the dead-letter list.", ["endpoint"]
)
REDELIVERED = Counter(
    "prq_redelivered",
    "at_least_once requests of silent receivers handed out again or dead-lettered.",
    ["endpoint"],
)
HEARTBEATS_MISSED = Counter(
    "prq_heartbeats_missed",
    "Sides declared lost for missing heartbeats (side: the one that went silent).",
    ["endpoint", "side"],
)
DATA_LOSS_EVENTS = Counter(
    "prq_data_loss_events", "Times a node of this process declared that Redis lost data."
)
REDIS_RETRIES = Counter(
    "prq_redis_retries", "Redis round trips retried after a connection-class failure."
)
PICKUP_WAIT = Histogram(
    "prq_pickup_wait_seconds",
    "Time from enqueue to pickup (0 for a hand-off to a waiting receiver).",
    ["endpoint"],
    buckets=LATENCY_BUCKETS,
)
ROUND_TRIP = Histogram(
    "prq_round_trip_seconds",
    "queue_and_wait duration, from the call to its response.",
    ["endpoint"],
    buckets=LATENCY_BUCKETS,
)


@dataclass(frozen=True, slots=True)
class EndpointSeries:
    """The series a call or a take of one endpoint updates, labelled once (`series`): a
    `labels()` lookup costs more than the update itself, on every call."""

    enqueued: Any
    taken: Any
    responded: Any
    round_trip: Any
    pickup_wait: Any


#: Endpoints whose labelled series are kept ready (more are labelled again when used).
SERIES_CACHED = 1024


@functools.lru_cache(maxsize=SERIES_CACHED)
def series(endpoint: str) -> EndpointSeries:
    """The labelled series of `endpoint` (see EndpointSeries)."""
    return EndpointSeries(
        ENQUEUED.labels(endpoint),
        TAKEN.labels(endpoint),
        RESPONDED.labels(endpoint),
        ROUND_TRIP.labels(endpoint),
        PICKUP_WAIT.labels(endpoint),
    )


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


def call_ended(
    endpoint: str, started: float, response: Response | None, error: BaseException | None
) -> None:
    """Record one queue_and_wait: its round trip, or why it failed (`started`: perf_counter)."""
    if response is not None:
        series(endpoint).round_trip.observe(time.perf_counter() - started)
        if response.error is not None:
            FAILED.labels(endpoint, "RemoteError").inc()
    elif isinstance(error, PrqError):
        FAILED.labels(endpoint, type(error).__name__).inc()
        if isinstance(error, ReceiverLost):
            HEARTBEATS_MISSED.labels(endpoint, "receiver").inc()


def taken(endpoint: str, created_ms: Sequence[int]) -> None:
    """A receiver took requests enqueued at `created_ms` (0: handed off, no wait): counted,
    and each one's wait for pickup observed (one clock reading for a take's batch)."""
    if not created_ms:
        return
    endpoint_series = series(endpoint)
    endpoint_series.taken.inc(len(created_ms))
    now_ms = time.time() * 1000.0
    observe = endpoint_series.pickup_wait.observe
    for created in created_ms:
        observe(max(0.0, now_ms - created) / 1000.0 if created else 0.0)


async def refresh_endpoint_gauges(inspector: Inspector) -> None:
    """Read every endpoint from Redis once (a few pipelined round trips) for the next scrape;
    endpoints no node reports any more drop out."""
    ENDPOINTS.update(await inspector.endpoints())


async def refresh_redis_gauges(inspector: Inspector) -> None:
    """Read each Redis server's memory and evictions (INFO) for the next scrape."""
    REDIS.update(await inspector.redis_memory())
