"""What a Spark job tells prq: SparkQueueConfig, the request id of a row, per-task counts."""

from __future__ import annotations

import math
import re
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from prq.bulk import BULK_PRODUCER, DEFAULT_LEDGER_TTL_S, MAX_BATCH_SIZE
from prq.core.config import check_queue_settings
from prq.core.errors import InvalidSettings
from prq.core.models import (
    DELIVERY_MODES,
    MAX_PRIORITY,
    MAX_PRODUCER_LENGTH,
    MIN_PRIORITY,
    Delivery,
)
from prq.core.names import REQUEST_ID_PATTERN, validate_endpoint
from prq.observe import tracing

__all__ = [
    "CALL_RESULT_SCHEMA",
    "DEFAULT_MAX_QUEUED",
    "DEFAULT_QUEUE_FULL_TIMEOUT_S",
    "ENQUEUE_STATS_SCHEMA",
    "InjectedTaskFailure",
    "PartitionCounts",
    "SparkQueueConfig",
    "request_id",
]

#: One row per partition: its counts, and whether Redis lost data after the partition's task
#: began writing and before the job ended, as far as the job could tell (some of its accepted
#: rows may then be gone: a rerun with the same namespace queues them again).
ENQUEUE_STATS_SCHEMA = (
    "partition int, accepted long, duplicate long, rejected long, data_loss boolean"
)
CALL_RESULT_SCHEMA = (
    "request_id string, result_json string, error_type string, error_message string, "
    "maybe_executed boolean"
)
#: How long a task keeps retrying a batch Redis refused as full before it fails, seconds.
DEFAULT_QUEUE_FULL_TIMEOUT_S = 300.0
#: The default backpressure bound (max_queued): about 200 MB of Redis for queued requests
#: with 100-byte payloads, well inside one Redis server.
DEFAULT_MAX_QUEUED = 500_000
#: Longest method name (as Request allows).
MAX_METHOD_LENGTH = 200

ID_RE = re.compile(REQUEST_ID_PATTERN)


class InjectedTaskFailure(RuntimeError):
    """Raised by the test-only `fail_first_attempt_after` hook."""


@dataclass(frozen=True)
class SparkQueueConfig:
    """Where and how rows become requests; plain data, pickled into every task."""

    #: Redis URL (the same server the receivers use).
    url: str
    #: The endpoint the requests go to, e.g. "poll://scoring".
    endpoint: str
    #: The method named in every request.
    method: str
    #: Stable per logical run (e.g. job name + run id); the first part of every request id.
    namespace: str
    #: Column with a stable row key; request id = f"{namespace}:{key}".
    key_column: str
    #: Key prefix of the queue (as the receivers' PRQ_PREFIX).
    prefix: str = "prq"
    #: Columns sent as the request's params (a JSON object); None: every column but the key.
    params_columns: tuple[str, ...] | None = None
    #: Requests per Redis round trip.
    batch_size: int = 1000
    #: Priority of every request (higher is taken first; see the README's "Scheduling").
    priority: int = 0
    #: Producer named in every request: producers take turns at one priority, so a bulk job
    #: does not hold up other producers' requests on the same endpoint.
    producer: str = BULK_PRODUCER
    #: "at_most_once" (default), or "at_least_once": a request whose receiver dies is handed
    #: out again, up to the executors' QueueSettings.max_attempts (see the README, "Delivery").
    delivery: Delivery = "at_most_once"
    #: How long a request may wait for a receiver (None: the queue's default).
    pickup_timeout_s: float | None = None
    #: How long each answer is kept once stored, seconds, for call_dataframe, a rerun or any
    #: reader by id (Request.response_ttl_s): the receivers keep it that long, up to their
    #: max_response_ttl_s (a week by default). None: `queue_settings["response_ttl_s"]` when
    #: given, else the receivers' own response_ttl_s.
    response_ttl_s: float | None = None
    #: The job's dedup window, seconds: a row whose request a receiver took is never queued
    #: again by a rerun with the same namespace within it, though its record and answer are
    #: gone (a rerun answers it "OutcomeExpired" and counts it as a duplicate; prq.bulk.Ledger:
    #: one set member per row taken, per endpoint). It runs from the job's last enqueue; a
    #: week by default. None: rows are guarded only while their records live.
    dedup_ttl_s: float | None = DEFAULT_LEDGER_TTL_S
    #: Send again the rows whose requests ended without an answer for a reason worth another
    #: try (DataLoss, ReceiverLost, a receiver shut down, attempts used up), instead of reading
    #: that outcome again; for a repairing rerun over the rows `rows_to_retry` picks. Rows
    #: with answers, and rows a receiver took whose outcome expired, are never sent again.
    retry_failed: bool = False
    #: Write each request's id → endpoint locator. Off by default: locators would be most of
    #: the enqueue's Redis work, and lookups by id alone (`Queue.status`, `Queue.cancel`, the
    #: admin service) find bulk requests without them by asking the registered endpoints.
    locators: bool = False
    #: call_dataframe: most unanswered requests per task (backpressure).
    max_in_flight: int = 1000
    #: call_dataframe: seconds between two reads of the outcomes.
    poll_interval_s: float = 0.05
    #: call_dataframe: longest one request waits for its outcome, counted from when it was
    #: sent (a row waiting for room in the window is not counted); then it is answered with
    #: error type "CallTimeout", whose message says it was sent and may still run.
    call_timeout_s: float = 3600.0
    #: call_dataframe: longest a task sends; past it nothing more is sent, rows not sent yet
    #: are answered with error type "NotSent" (never a call) and requests in flight with
    #: "CallTimeout". None: no bound, every row is sent.
    task_timeout_s: float | None = None
    #: How long a task retries a batch refused with QueueFull (backing off), or waits for the
    #: endpoint to drain below max_queued, before it fails (QueueFull; Spark retries the task).
    queue_full_timeout_s: float = DEFAULT_QUEUE_FULL_TIMEOUT_S
    #: Backpressure: once a batch leaves the endpoint holding this many queued requests (over
    #: all priorities, whoever queued them), the task sends no more until it holds fewer.
    #: None: no bound (an operator's max_pending on the endpoint still refuses what is over).
    max_queued: int | None = DEFAULT_MAX_QUEUED
    #: A directory every executor and receiver shares (as their FileSystemStore): request
    #: bodies over inline_limit_bytes are kept there, and responses kept there are read back.
    #: None: bodies stay inline up to max_body_bytes.
    datastreams_dir: str | None = None
    #: QueueSettings fields for the executors' clients (e.g. {"retry_budget_s": 5}); the rest
    #: come from the executors' PRQ_* environment. Checked here, on the driver: an unknown
    #: name or a refused value raises ValueError before any job runs.
    queue_settings: dict[str, Any] | None = None
    #: Test hook: the first attempt of partition 0 raises after this many of its rows were
    #: handed over (checked between Arrow batches / row chunks). Never set it in production.
    fail_first_attempt_after: int | None = None
    #: Set by the driver per action (see `for_run`): the batch nonce's run part.
    run_token: str = field(default="", repr=False)
    #: Set by the driver per action (see `for_run`): its trace context (W3C traceparent and
    #: tracestate, prq.observe.tracing) when the action runs in a span, carried in every row's
    #: headers.
    trace_headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        validate_endpoint(self.endpoint)
        self._check_numbers()
        if not ID_RE.match(f"{self.namespace}:x"):
            raise ValueError(
                f"namespace {self.namespace!r} cannot start a request id "
                f"(ids match {REQUEST_ID_PATTERN})"
            )
        if not 1 <= len(self.method) <= MAX_METHOD_LENGTH:
            raise ValueError(f"method must be 1-{MAX_METHOD_LENGTH} characters")
        if self.delivery not in DELIVERY_MODES:
            raise ValueError(f"delivery must be one of {', '.join(DELIVERY_MODES)}")
        if len(self.producer) > MAX_PRODUCER_LENGTH:
            raise ValueError(f"producer must be at most {MAX_PRODUCER_LENGTH} characters")
        _check_queue_settings(self.queue_settings)

    def _check_numbers(self) -> None:
        if not 1 <= self.batch_size <= MAX_BATCH_SIZE:
            raise ValueError(f"batch_size must be within 1..{MAX_BATCH_SIZE}")
        if self.max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        if self.poll_interval_s <= 0 or self.call_timeout_s <= 0:
            raise ValueError("poll_interval_s and call_timeout_s must be positive")
        if self.max_queued is not None and self.max_queued < 1:
            raise ValueError("max_queued must be at least 1 (or None: no bound)")
        if self.task_timeout_s is not None and self.task_timeout_s <= 0:
            raise ValueError("task_timeout_s must be positive (or None: no bound)")
        for name in ("response_ttl_s", "dedup_ttl_s"):
            value = getattr(self, name)
            if value is not None and not 0 < value < math.inf:
                raise ValueError(f"{name} must be positive and finite (or None)")
        if not MIN_PRIORITY <= self.priority <= MAX_PRIORITY:
            raise ValueError(f"priority must be within {MIN_PRIORITY}..{MAX_PRIORITY}")

    def asked_response_ttl_s(self) -> float | None:
        """The answer lifetime every request of the job asks for (see response_ttl_s)."""
        if self.response_ttl_s is not None:
            return self.response_ttl_s
        given = (self.queue_settings or {}).get("response_ttl_s")
        return float(given) if given is not None else None

    def for_run(self) -> SparkQueueConfig:
        """A copy for one action: its token tells this action's own earlier attempts (counted as
        accepted) from requests enqueued before by another action (counted as duplicates), and
        the driver's current trace context goes with its rows."""
        return replace(self, run_token=uuid.uuid4().hex, trace_headers=tracing.carrier())


def _check_queue_settings(overrides: dict[str, Any] | None) -> None:
    """Refuse, on the driver, what every executor would refuse: names QueueSettings does not
    have (a typo would be ignored silently) and values or combinations it does not accept. The
    driver's PRQ_* environment is not read: the executors read their own."""
    if not overrides:
        return
    try:
        check_queue_settings(overrides)
    except InvalidSettings as exc:
        reasons = "; ".join(
            f"{'.'.join(map(str, error['loc'])) or 'settings'}: {error['msg']}"
            for error in exc.errors()
        )
        raise ValueError(f"queue_settings: {reasons}") from None
    except ValueError as exc:
        raise ValueError(f"queue_settings: {exc}") from None


def request_id(namespace: str, key: object) -> str | None:
    """The request id of a row, or None when the key makes no valid id (null, empty, a float
    or bytes, or characters REQUEST_ID_PATTERN does not allow)."""
    if key is None or isinstance(key, bytes | float) or key == "":
        return None
    rid = f"{namespace}:{key}"
    return rid if ID_RE.match(rid) else None


@dataclass(slots=True)
class PartitionCounts:
    """What one task did to its partition."""

    partition: int
    accepted: int = 0
    duplicate: int = 0
    rejected: int = 0
    #: Redis lost data after the task began writing (a restart without persistence, a flush,
    #: a failover to a replica that missed writes): some rows counted as accepted may be gone.
    #: A rerun with the same namespace queues those again and counts the others as duplicates.
    data_loss: bool = False
