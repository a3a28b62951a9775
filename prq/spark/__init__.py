"""PySpark integration: enqueue a DataFrame's rows as prq requests, or call and collect.

Importing this package never imports pyspark or pyarrow: they are imported inside the functions
that run on the driver or in Spark's Python workers (install them with `pip install prq[spark]`).

Every row becomes one detached request (see prq.bulk) whose id is deterministic:
`f"{cfg.namespace}:{row[cfg.key_column]}"`, never a position, an attempt number or a random id.
Enqueue is idempotent by id, so a retried or speculative task, a replayed streaming batch or a
second action enqueues nothing twice; call-and-collect reads the responses stored under the ids,
so nothing runs twice on the service either. Rows whose key would make an invalid request id
(see REQUEST_ID_PATTERN) or whose request would be over max_body_bytes are counted (or
answered) as rejected, never sent.

- `enqueue_partitions(cfg)`: a callable for `df.foreachPartition` (fire and forget).
- `enqueue_dataframe(df, cfg)`: `mapInArrow`-based (works under Spark Connect); runs the job
  once and returns a small DataFrame of exact per-partition counts from the successful attempts
  (ENQUEUE_STATS_SCHEMA), and whether Redis lost data that may have taken some of each
  partition's accepted rows (`data_loss`; one WARNING then says so).
- `call_dataframe(df, cfg)`: `mapInArrow`-based call-and-collect; a lazy DataFrame of
  CALL_RESULT_SCHEMA and the row's key (typed), with at most `cfg.max_in_flight` unanswered
  requests per task; `result_schema=` adds the result parsed.
- `rows_to_retry(df, answers, cfg)`: the rows whose calls failed in a way worth another try
  (RETRYABLE_ERRORS), for a repairing rerun with `retry_failed=True`.
- `foreach_batch(cfg)`: a `writeStream.foreachBatch` function; replayed batches enqueue nothing.
- `register_data_source(spark)`: `df.write.format("prq").option(...).save()` and
  `df.writeStream.format("prq")` enqueue as enqueue_dataframe does (prq.spark.source).
- `call_batches(cfg, write)`: a `writeStream.foreachBatch` function that calls each micro-batch
  and hands its answers to `write(answers, batch_id)`; replayed batches run nothing twice.

Backpressure: a task whose batch leaves the endpoint holding `cfg.max_queued` queued requests
(500,000 by default, whoever queued them) sends no more until its receivers took some, and
fails with QueueFull (Spark retries it) if they take none within `cfg.queue_full_timeout_s`.
The endpoint then holds at most max_queued plus one batch per running task.

How long an id is guarded: while its record lives (queued, running, then for its answer's
lifetime, which the job asks for: `cfg.response_ttl_s`, or `queue_settings["response_ttl_s"]`;
receivers keep it up to their max_response_ttl_s, a week by default; unasked, their own
response_ttl_s), and after that by the job's ledger (prq.bulk.Ledger, named by the namespace)
for `cfg.dedup_ttl_s` (a week by default): a row a receiver took is not sent again, and a rerun
answers it "OutcomeExpired" (call) or counts it as a duplicate (enqueue); so does a task that
finds such an answer expired before it read it (it asks the ledger). A row no receiver took
is queued afresh by a rerun: it never ran.

One answer per row, its own: call-and-collect answers "DuplicateKey" for a row whose key came
before in its task, or was sent by another task or an earlier run with other params (each
request carries a fingerprint of its method and params, prq.bulk.fingerprints); a row whose
key was sent before with the same params (a retried task, a rerun) reads that answer.

Call-and-collect: each request gets `cfg.call_timeout_s` from its sending to its outcome (a
CallTimeout says it was sent and may still run); `cfg.task_timeout_s`, when set, bounds a
task's sending (rows it never sent come back NotSent).

A SparkQueueConfig is checked where it is made (on the driver, before any job): a
`queue_settings` name QueueSettings does not have, or a value or combination it refuses, raises
ValueError there instead of failing every task on the executors.

One BulkClient per Python worker process is kept in this package (keyed by url, prefix and pid)
and reused by every task that process runs. Every Redis reply is checked: a failing or full
Redis raises in the task (Spark retries it), requests are never lost silently. Nor are they when
Redis loses data after accepting them (a restart without persistence, a flush, a failover to a
replica that missed writes): each enqueue task watches for a loss while it writes (a
prq.bulk.LossWatch, one round trip before its first batch, two commands per batch) and joins a
mark its action's tasks share, so the driver tells which partitions may have lost rows, also
those that had ended before the loss; running the same enqueue again with the same namespace
queues exactly the rows that are gone (`_enqueue`, prq.bulk.watch).

Modules: _config (SparkQueueConfig, ids, counts), _encode (rows to request JSON, vectorised for
Arrow), _runtime (the per-process client, the task, the enqueuer), _enqueue, _call.

Example:
    cfg = SparkQueueConfig(url="redis://redis:6379/0", endpoint="poll://scoring",
                           method="score", namespace="daily-scoring:2026-11-21", key_column="id")
    counts = enqueue_dataframe(df, cfg)  # partition, accepted, duplicate, rejected, data_loss
    answers = call_dataframe(df, cfg).persist()      # request_id, result_json, ..., id
    retry = rows_to_retry(df, answers, cfg)          # the rows worth another try
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prq.spark._call import (
    RETRYABLE_ERRORS,
    arrow_caller,
    call_batches,
    call_dataframe,
    rows_to_retry,
)
from prq.spark._config import (
    CALL_RESULT_SCHEMA,
    ENQUEUE_STATS_SCHEMA,
    PartitionCounts,
    SparkQueueConfig,
    request_id,
)
from prq.spark._enqueue import arrow_enqueuer, enqueue_dataframe, enqueue_partitions, foreach_batch

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def register_data_source(spark: SparkSession) -> None:
    """Register the `prq` data source with `spark`, so that `df.write.format("prq")` and
    `df.writeStream.format("prq")` enqueue rows (prq.spark.source; PySpark 4)."""
    from prq.spark.source import PrqDataSource

    spark.dataSource.register(PrqDataSource)


__all__ = [
    "CALL_RESULT_SCHEMA",
    "ENQUEUE_STATS_SCHEMA",
    "RETRYABLE_ERRORS",
    "PartitionCounts",
    "SparkQueueConfig",
    "arrow_caller",
    "arrow_enqueuer",
    "call_batches",
    "call_dataframe",
    "enqueue_dataframe",
    "enqueue_partitions",
    "foreach_batch",
    "register_data_source",
    "request_id",
    "rows_to_retry",
]
