"""PySpark integration: enqueue a DataFrame's rows as prq requests, or call and collect.

Importing this module never imports pyspark or pyarrow: they are imported inside the functions
that run on the driver or in Spark's Python workers (install them with `pip install prq[spark]`).

Every row becomes one detached request (see prq.bulk) whose id is deterministic:
`f"{cfg.namespace}:{row[cfg.key_column]}"`, never a position, an attempt number or a random id.
Enqueue is idempotent by id, so a retried or speculative task, a replayed streaming batch or a
second action enqueues nothing twice; call-and-collect reads the responses stored under the ids,
so nothing runs twice on the service either. Rows whose key would make an invalid request id
(see REQUEST_ID_PATTERN) are counted (or answered) as rejected, never sent.

- `enqueue_partitions(cfg)`: a callable for `df.foreachPartition` (fire and forget).
- `enqueue_dataframe(df, cfg)`: `mapInArrow`-based (works under Spark Connect); runs the job
  once and returns a small DataFrame of exact per-partition counts from the successful attempts
  (ENQUEUE_STATS_SCHEMA).
- `call_dataframe(df, cfg)`: `mapInArrow`-based call-and-collect; a lazy DataFrame of
  CALL_RESULT_SCHEMA with at most `cfg.max_in_flight` unanswered requests per task.
- `foreach_batch(cfg)`: a `writeStream.foreachBatch` function; replayed batches enqueue nothing.

One BulkClient per Python worker process is kept in this module (keyed by url, prefix and pid)
and reused by every task that process runs. Every Redis reply is checked: a failing or full
Redis raises in the task (Spark retries it), requests are never lost silently.

Example:
    cfg = SparkQueueConfig(url="redis://redis:6379/0", endpoint="poll://scoring",
                           method="score", namespace="daily-scoring:2026-11-21", key_column="id")
    counts = enqueue_dataframe(df, cfg)              # partition, accepted, duplicate, rejected
    answers = call_dataframe(df, cfg).persist()      # request_id, result_json, error_type, ...
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from prq.bulk import MAX_BATCH_SIZE, BulkClient, BulkResult, Rejected
from prq.config import QueueSettings
from prq.errors import PrqError, QueueFull
from prq.models import REQUEST_ID_PATTERN, Request, decode_response, validate_endpoint
from prq.scripts import RequestSnapshot

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, Row

__all__ = [
    "CALL_RESULT_SCHEMA",
    "ENQUEUE_STATS_SCHEMA",
    "PartitionCounts",
    "SparkQueueConfig",
    "arrow_caller",
    "arrow_enqueuer",
    "call_dataframe",
    "enqueue_dataframe",
    "enqueue_partitions",
    "foreach_batch",
    "request_id",
]

ENQUEUE_STATS_SCHEMA = "partition int, accepted long, duplicate long, rejected long"
CALL_RESULT_SCHEMA = (
    "request_id string, result_json string, error_type string, error_message string"
)

_ID_RE = re.compile(REQUEST_ID_PATTERN)
#: How long a task keeps retrying a batch Redis refused as full before it fails, seconds.
DEFAULT_QUEUE_FULL_TIMEOUT_S = 300.0
#: Error types for a request that ended without a response, by state and reason.
_REASON_ERRORS = {
    "pickup_timeout": "PickupTimeout",
    "receiver_lost": "ReceiverLost",
    "sender_lost": "SenderLost",
    "call_timeout": "CallTimeout",
    "data_loss": "DataLoss",
}


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
    #: How long a request may wait for a receiver (None: the queue's default).
    pickup_timeout_s: float | None = None
    #: call_dataframe: most unanswered requests per task (backpressure).
    max_in_flight: int = 1000
    #: call_dataframe: seconds between two reads of the outcomes.
    poll_interval_s: float = 0.05
    #: call_dataframe: longest a task waits for its requests' outcomes; then they are answered
    #: with error type "CallTimeout" (the requests may still run later).
    call_timeout_s: float = 3600.0
    #: How long a task retries a batch refused with QueueFull (backing off) before it fails.
    queue_full_timeout_s: float = DEFAULT_QUEUE_FULL_TIMEOUT_S
    #: QueueSettings fields for the executors' clients (e.g. {"retry_budget_s": 5}); the rest
    #: come from the executors' PRQ_* environment.
    queue_settings: dict[str, Any] | None = None
    #: Test hook: the first attempt of partition 0 raises after this many of its rows were
    #: handed over (checked between Arrow batches / row chunks). Never set it in production.
    fail_first_attempt_after: int | None = None
    #: Set by the driver per action (see `_for_run`): the batch nonce's run part.
    run_token: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        validate_endpoint(self.endpoint)
        if not 1 <= self.batch_size <= MAX_BATCH_SIZE:
            raise ValueError(f"batch_size must be within 1..{MAX_BATCH_SIZE}")
        if self.max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        if self.poll_interval_s <= 0 or self.call_timeout_s <= 0:
            raise ValueError("poll_interval_s and call_timeout_s must be positive")
        if not _ID_RE.match(f"{self.namespace}:x"):
            raise ValueError(
                f"namespace {self.namespace!r} cannot start a request id "
                f"(ids match {REQUEST_ID_PATTERN})"
            )
        if not self.method:
            raise ValueError("method must not be empty")

    def _for_run(self) -> SparkQueueConfig:
        """A copy for one action: its token tells this action's own earlier attempts (counted as
        accepted) from requests enqueued before by another action (counted as duplicates)."""
        return replace(self, run_token=uuid.uuid4().hex)


def request_id(namespace: str, key: object) -> str | None:
    """The request id of a row, or None when the key makes no valid id (null, empty, a float
    or bytes, or characters REQUEST_ID_PATTERN does not allow)."""
    if key is None or isinstance(key, bytes | float) or key == "":
        return None
    rid = f"{namespace}:{key}"
    return rid if _ID_RE.match(rid) else None


@dataclass(slots=True)
class PartitionCounts:
    """What one task did to its partition."""

    partition: int
    accepted: int = 0
    duplicate: int = 0
    rejected: int = 0


# -- the per-process client ----------------------------------------------------------------------

#: This process's clients, by (url, prefix, pid, settings overrides); the pid keeps a forked
#: process from using its parent's connection.
_CLIENTS: dict[tuple[str, str, int, str], BulkClient] = {}
_CLIENTS_LOCK = threading.Lock()
_ArrowFunction = Callable[[Iterator["pa.RecordBatch"]], Iterator["pa.RecordBatch"]]


def _client(cfg: SparkQueueConfig) -> BulkClient:
    """The BulkClient of this Python worker process for `cfg`'s Redis (created once)."""
    overrides = cfg.queue_settings or {}
    key = (cfg.url, cfg.prefix, os.getpid(), repr(sorted(overrides.items())))
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(key)
        if client is None:
            settings = QueueSettings(**overrides)
            client = BulkClient.from_url(cfg.url, prefix=cfg.prefix, settings=settings)
            _CLIENTS[key] = client
        return client


# -- task context --------------------------------------------------------------------------------


def _task() -> tuple[int, int]:
    """(partition id, attempt number) of the running task; (0, 0) outside Spark."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        return 0, 0
    return context.partitionId(), context.attemptNumber()


class _FailureHook:
    """Implements `fail_first_attempt_after` (a test hook)."""

    def __init__(self, cfg: SparkQueueConfig, partition: int, attempt: int) -> None:
        armed = cfg.fail_first_attempt_after is not None and partition == 0 and attempt == 0
        self.limit = cfg.fail_first_attempt_after if armed else None
        self.seen = 0

    def rows_handed(self, n: int) -> None:
        if self.limit is not None and self.seen >= self.limit:
            raise InjectedTaskFailure(f"injected failure after {self.seen} rows")
        self.seen += n


# -- rows to requests ----------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        # Arrow gives maps as lists of (key, value) tuples
        return [_jsonable(v) for v in value]
    if hasattr(value, "asDict"):
        return _jsonable(value.asDict(recursive=True))
    return str(value)


def _columns(cfg: SparkQueueConfig, names: Sequence[str]) -> list[str]:
    if cfg.key_column not in names:
        raise ValueError(f"key column {cfg.key_column!r} is not among the columns {list(names)}")
    if cfg.params_columns is None:
        return [n for n in names if n != cfg.key_column]
    missing = [c for c in cfg.params_columns if c not in names]
    if missing:
        raise ValueError(f"params columns {missing} are not among the columns {list(names)}")
    return list(cfg.params_columns)


class _Chunk:
    """Requests built from some rows, plus the ids of the rows that could not be requests."""

    __slots__ = ("invalid", "requests")

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.invalid: list[tuple[str, str]] = []  # (shown id, message)


def _build(cfg: SparkQueueConfig, keys: list[Any], params: dict[str, list[Any]]) -> _Chunk:
    chunk = _Chunk()
    for i, key in enumerate(keys):
        rid = request_id(cfg.namespace, key)
        if rid is None:
            chunk.invalid.append(
                (f"{cfg.namespace}:{key}", f"row key {key!r} makes no valid request id")
            )
            continue
        body = {name: _jsonable(values[i]) for name, values in params.items()}
        chunk.requests.append(
            Request(endpoint=cfg.endpoint, method=cfg.method, params=body, id=rid)
        )
    return chunk


def _arrow_chunks(cfg: SparkQueueConfig, batches: Iterable[pa.RecordBatch]) -> Iterator[_Chunk]:
    """Requests from Arrow batches, at most `batch_size` per chunk."""
    for batch in batches:
        param_names = _columns(cfg, batch.schema.names)
        for start in range(0, batch.num_rows, cfg.batch_size):
            part = batch.slice(start, cfg.batch_size)
            keys = part.column(cfg.key_column).to_pylist()
            params = {name: part.column(name).to_pylist() for name in param_names}
            yield _build(cfg, keys, params)


def _row_chunks(cfg: SparkQueueConfig, rows: Iterable[Row]) -> Iterator[_Chunk]:
    """Requests from Rows (foreachPartition), at most `batch_size` per chunk."""
    buffered: list[dict[str, Any]] = []

    def flush() -> _Chunk:
        names = list(buffered[0])
        param_names = _columns(cfg, names)
        keys = [r[cfg.key_column] for r in buffered]
        params = {name: [r[name] for r in buffered] for name in param_names}
        return _build(cfg, keys, params)

    for row in rows:
        buffered.append(row.asDict(recursive=True))
        if len(buffered) >= cfg.batch_size:
            yield flush()
            buffered = []
    if buffered:
        yield flush()


# -- enqueue -------------------------------------------------------------------------------------


class _Enqueuer:
    """Sends a task's requests; idempotent by id, with a per-task batch nonce.

    The nonce is the action's run token plus the partition: requests that an earlier attempt of
    the same task enqueued count as accepted on the retry (the script reports them as this
    batch's own), while ids enqueued by anything else count as duplicates.
    """

    def __init__(self, cfg: SparkQueueConfig, partition: int) -> None:
        self.cfg = cfg
        self.bulk = _client(cfg)
        self.nonce = f"{cfg.run_token or 'norun'}:{cfg.namespace}:p{partition}"
        self.seen: set[str] = set()

    def send(self, requests: Sequence[Request]) -> BulkResult:
        """Enqueue `requests` (one round trip); retries QueueFull with backoff, bounded."""
        result = BulkResult()
        fresh: list[Request] = []
        for request in requests:
            if request.id in self.seen:  # the same key twice in this task
                result.duplicate_ids.append(request.id)
            else:
                self.seen.add(request.id)
                fresh.append(request)
        if fresh:
            result.add(self._send_with_backoff(fresh))
        return result

    def _send_with_backoff(self, requests: Sequence[Request]) -> BulkResult:
        deadline = time.monotonic() + self.cfg.queue_full_timeout_s
        delay = 0.05
        while True:
            try:
                return self.bulk.enqueue_many(
                    requests, pickup_timeout_s=self.cfg.pickup_timeout_s, nonce=self.nonce
                )
            except PrqError as exc:
                if not _is_full(exc) or time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)  # backing off while Redis is full
                delay = min(delay * 2, 2.0)


def _is_full(exc: PrqError) -> bool:
    return isinstance(exc, QueueFull)


def _enqueue_chunks(cfg: SparkQueueConfig, chunks: Iterator[_Chunk]) -> PartitionCounts:
    partition, attempt = _task()
    hook = _FailureHook(cfg, partition, attempt)
    enqueuer = _Enqueuer(cfg, partition)
    counts = PartitionCounts(partition)
    for chunk in chunks:
        hook.rows_handed(len(chunk.requests) + len(chunk.invalid))
        counts.rejected += len(chunk.invalid)
        result = enqueuer.send(chunk.requests)
        counts.accepted += result.accepted
        counts.duplicate += result.duplicates
        counts.rejected += len(result.rejected)
    return counts


def enqueue_partitions(cfg: SparkQueueConfig) -> Callable[[Iterator[Row]], None]:
    """A function for `df.foreachPartition`: enqueues the partition's rows (fire and forget).

    Raises in the task when Redis fails or stays full, so Spark retries it; the retry enqueues
    only what is missing.
    """
    run_cfg = cfg._for_run()

    def enqueue_partition(rows: Iterator[Row]) -> None:
        _enqueue_chunks(run_cfg, _row_chunks(run_cfg, rows))

    return enqueue_partition


def arrow_enqueuer(
    cfg: SparkQueueConfig,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A function for `df.mapInArrow(f, ENQUEUE_STATS_SCHEMA)`: one counts row per partition.

    The returned DataFrame is lazy: each action on it runs the enqueue again (which enqueues
    nothing new, and then counts every row as a duplicate). `enqueue_dataframe` runs it once.
    """
    run_cfg = cfg._for_run()

    def enqueue_arrow(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        counts = _enqueue_chunks(run_cfg, _arrow_chunks(run_cfg, batches))
        yield pa.RecordBatch.from_pydict(
            {
                "partition": pa.array([counts.partition], pa.int32()),
                "accepted": pa.array([counts.accepted], pa.int64()),
                "duplicate": pa.array([counts.duplicate], pa.int64()),
                "rejected": pa.array([counts.rejected], pa.int64()),
            }
        )

    return enqueue_arrow


def _map_in_arrow(df: DataFrame, func: _ArrowFunction, schema: str) -> DataFrame:
    """`df.mapInArrow(func, schema)`, also where pandas is not installed.

    Classic PySpark checks for pandas in mapInArrow although the Arrow path never uses it; then
    the same plan is built without that check (Spark Connect clients need pandas anyway).
    """
    import importlib.util

    if importlib.util.find_spec("pandas") is not None or not hasattr(df, "_jdf"):
        return df.mapInArrow(func, schema)
    from pyspark.sql import DataFrame as ClassicDataFrame
    from pyspark.sql.pandas.functions import vectorized_udf  # type: ignore[attr-defined]
    from pyspark.util import PythonEvalType

    udf = vectorized_udf(func, schema, PythonEvalType.SQL_MAP_ARROW_ITER_UDF)
    column = udf(*[df[name] for name in df.columns])
    jdf = df._jdf.mapInArrow(column._jc, False, None)
    return ClassicDataFrame(jdf, df.sparkSession)


def enqueue_dataframe(df: DataFrame, cfg: SparkQueueConfig) -> DataFrame:
    """Enqueue every row of `df` (runs one Spark job now) and return the exact counts.

    The result is a small local DataFrame (ENQUEUE_STATS_SCHEMA, one row per partition) built
    from the successful attempts' outputs, so a failed and retried task is counted once:
    requests its failed attempt enqueued count as accepted, ids known from elsewhere (another
    run, another partition, an earlier action) as duplicates. Works under Spark Connect.
    """
    rows = _map_in_arrow(df, arrow_enqueuer(cfg), ENQUEUE_STATS_SCHEMA).collect()
    stats = sorted((tuple(r) for r in rows), key=lambda r: r[0])
    return df.sparkSession.createDataFrame(stats, ENQUEUE_STATS_SCHEMA)


def foreach_batch(cfg: SparkQueueConfig) -> Callable[[DataFrame, int], list[PartitionCounts]]:
    """A function for `writeStream.foreachBatch`: enqueues each micro-batch's rows.

    Ids come from the namespace and the row key only, so a batch replayed after a restart (same
    batch id, same rows from a deterministic source) enqueues nothing twice. Returns the
    batch's per-partition counts (Spark ignores them; handy for logging and tests).
    """

    def enqueue_batch(batch_df: DataFrame, batch_id: int) -> list[PartitionCounts]:
        rows = _map_in_arrow(batch_df, arrow_enqueuer(cfg), ENQUEUE_STATS_SCHEMA).collect()
        return [PartitionCounts(*r) for r in sorted(rows, key=lambda r: int(r[0]))]

    return enqueue_batch


# -- call and collect ----------------------------------------------------------------------------


def _answer(rid: str, snapshot: RequestSnapshot) -> tuple[str, str | None, str | None, str | None]:
    """A result row for a request in a final state."""
    if snapshot.state == "done":
        try:
            response = decode_response(snapshot.response)
        except PrqError as exc:
            return rid, None, type(exc).__name__, str(exc)
        if response.error is not None:
            return rid, None, response.error.type, response.error.message
        return rid, json.dumps(response.result), None, None
    if snapshot.state in ("missing", "unknown"):
        return (
            rid,
            None,
            "RequestExpired",
            (
                "nothing is stored under the id: it expired unanswered (pickup timeout plus the "
                "request TTL extra) or its response outlived the response TTL"
            ),
        )
    reason = snapshot.reason or snapshot.state
    if reason in _REASON_ERRORS:
        error_type = _REASON_ERRORS[reason]
    elif reason == "cancelled":
        error_type = "CancelledBeforePickup" if snapshot.state == "withdrawn" else "Cancelled"
    else:
        error_type = "".join(part.capitalize() for part in reason.split("_")) or "Unknown"
    return rid, None, error_type, f"request {snapshot.state} ({reason})"


_FINAL = frozenset({"done", "withdrawn", "cancelled", "missing", "unknown"})
_Answer = tuple[str, str | None, str | None, str | None]


class _Caller:
    """One task's call-and-collect loop: a window of at most max_in_flight unanswered ids.

    Rows are sent only while the window has room; otherwise the task waits for outcomes first.
    Past `call_timeout_s` (counted from the task's start) nothing more is sent: what is still
    unanswered or unsent is answered with error type CallTimeout.
    """

    def __init__(self, cfg: SparkQueueConfig) -> None:
        self.cfg = cfg
        partition, attempt = _task()
        self.hook = _FailureHook(cfg, partition, attempt)
        self.enqueuer = _Enqueuer(cfg, partition)
        self.in_flight: dict[str, None] = {}  # insertion-ordered: oldest first
        self.backlog: list[Request] = []
        self.rejected: list[Rejected] = []
        self.deadline = time.monotonic() + cfg.call_timeout_s

    def run(self, chunks: Iterator[_Chunk]) -> Iterator[list[_Answer]]:
        for chunk in chunks:
            self.hook.rows_handed(len(chunk.requests) + len(chunk.invalid))
            if chunk.invalid:
                yield [(rid, None, "InvalidRequestId", msg) for rid, msg in chunk.invalid]
            self.backlog += chunk.requests
            while len(self.backlog) + len(self.in_flight) > self.cfg.max_in_flight:
                self._send_what_fits()
                yield self._collect()
            self._send_what_fits()
        while self.backlog or self.in_flight:
            self._send_what_fits()
            yield self._collect()

    def _timed_out(self) -> bool:
        return time.monotonic() >= self.deadline

    def _send_what_fits(self) -> None:
        room = min(self.cfg.max_in_flight - len(self.in_flight), len(self.backlog))
        if room <= 0 or self._timed_out():
            return
        batch, self.backlog = self.backlog[:room], self.backlog[room:]
        for start in range(0, len(batch), self.cfg.batch_size):
            part = batch[start : start + self.cfg.batch_size]
            result = self.enqueuer.send(part)
            rejected = {r.request_id for r in result.rejected}
            for request in part:
                if request.id not in rejected:
                    self.in_flight[request.id] = None
            self.rejected += result.rejected

    def _collect(self) -> list[_Answer]:
        """Wait (bounded) until some requests are final; return their answers."""
        answers: list[_Answer] = [
            (r.request_id, None, type(r.error).__name__, str(r.error)) for r in self.rejected
        ]
        self.rejected = []
        while not answers and self.in_flight:
            answers += self._read_outcomes()
            if answers:
                break
            if self._timed_out():
                return answers + self._give_up()
            time.sleep(self.cfg.poll_interval_s)  # the poll interval between outcome reads
        if self._timed_out():
            answers += self._give_up()
        return answers

    def _read_outcomes(self) -> list[_Answer]:
        answers: list[_Answer] = []
        ids = list(self.in_flight)
        for start in range(0, len(ids), self.cfg.batch_size):
            part = ids[start : start + self.cfg.batch_size]
            for rid, snapshot in self.enqueuer.bulk.outcomes(self.cfg.endpoint, part).items():
                if snapshot.state in _FINAL:
                    answers.append(_answer(rid, snapshot))
                    del self.in_flight[rid]
        return answers

    def _give_up(self) -> list[_Answer]:
        """CallTimeout answers for everything unanswered (sent or not); both are emptied."""
        message = f"no outcome within call_timeout_s={self.cfg.call_timeout_s:g}"
        unsent = " (never sent)"
        answers: list[_Answer] = [(rid, None, "CallTimeout", message) for rid in self.in_flight]
        answers += [(r.id, None, "CallTimeout", message + unsent) for r in self.backlog]
        self.in_flight.clear()
        self.backlog = []
        return answers


def _answers_batch(answers: list[_Answer]) -> pa.RecordBatch:
    import pyarrow as pa

    columns = list(zip(*answers, strict=True)) if answers else [(), (), (), ()]
    return pa.RecordBatch.from_pydict(
        {
            name: pa.array(list(values), pa.string())
            for name, values in zip(
                ("request_id", "result_json", "error_type", "error_message"), columns, strict=True
            )
        }
    )


def arrow_caller(
    cfg: SparkQueueConfig,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A function for `df.mapInArrow(f, CALL_RESULT_SCHEMA)`: sends each row as a request and
    yields (request_id, result_json, error_type, error_message) once it has an outcome."""
    run_cfg = cfg._for_run()

    def call_arrow(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        caller = _Caller(run_cfg)
        for answers in caller.run(_arrow_chunks(run_cfg, batches)):
            if answers:
                yield _answers_batch(answers)

    return call_arrow


def call_dataframe(df: DataFrame, cfg: SparkQueueConfig) -> DataFrame:
    """Call the endpoint once per row; a lazy DataFrame of CALL_RESULT_SCHEMA.

    Each task keeps at most `cfg.max_in_flight` requests unanswered and waits for outcomes
    before sending more (and backs off while Redis is full). A service error shows as
    error_type/error_message (the ServerError's type and message); a request that ended without
    a response as e.g. PickupTimeout, ReceiverLost or Cancelled. Ids are deterministic, so a
    retried task or a second action re-reads the stored responses (kept for the queue's
    response TTL) and runs nothing twice on the service; still, persist or write out the
    result once rather than running many actions on it.
    """
    return _map_in_arrow(df, arrow_caller(cfg), CALL_RESULT_SCHEMA)
