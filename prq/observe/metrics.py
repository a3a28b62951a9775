"""Prometheus metrics of prq, in the process-wide default registry (names prefixed `prq_`).

Counters and histograms count what this process's nodes did; every node in the process adds to
the same series, labelled by endpoint. The series read from Redis at scrape, `prq_endpoint_*`
and `prq_redis_*`, describe Redis, not this process: they are the admin service's, in
prq.ops.exporter (this module, in the observe layer, must not import the ops layer's Inspector).

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
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter, Histogram

from prq.core.errors import PrqError, ReceiverLost

if TYPE_CHECKING:
    from prq.core.models import Response

__all__ = [
    "CANCELLED",
    "DATA_LOSS_EVENTS",
    "DEAD_LETTERED",
    "ENQUEUED",
    "FAILED",
    "HANDLER_ERRORS",
    "HEARTBEATS_MISSED",
    "PICKUP_WAIT",
    "REDELIVERED",
    "REDIS_RETRIES",
    "RESPONDED",
    "ROUND_TRIP",
    "TAKEN",
    "EndpointSeries",
    "call_ended",
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
