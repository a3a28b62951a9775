"""Bulk enqueue from Spark: foreachPartition, mapInArrow with exact counts, foreachBatch."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

from prq.spark._config import ENQUEUE_STATS_SCHEMA, PartitionCounts, SparkQueueConfig
from prq.spark._encode import Chunk, arrow_chunks, row_chunks
from prq.spark._runtime import Enqueuer, FailureHook, Sent, map_in_arrow, task_identity

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, Row, SparkSession

__all__ = ["arrow_enqueuer", "enqueue_dataframe", "enqueue_partitions", "foreach_batch"]


def _enqueue_chunks(
    enqueuer: Enqueuer, hook: FailureHook, counts: PartitionCounts, chunks: Iterator[Chunk]
) -> PartitionCounts:
    """Send every chunk, one round trip in flight while the next chunk is read and encoded."""
    with ThreadPoolExecutor(1, thread_name_prefix="prq-spark-send") as sender:
        in_flight: Future[Sent] | None = None
        for chunk in chunks:
            hook.rows_handed(chunk.rows)
            counts.rejected += len(chunk.invalid) + len(chunk.too_large)
            prepared = enqueuer.prepare(chunk.ids, chunk.bodies)
            if in_flight is not None:
                _add(counts, in_flight.result())
            in_flight = sender.submit(enqueuer.transmit, prepared)
        if in_flight is not None:
            _add(counts, in_flight.result())
    return counts


def _add(counts: PartitionCounts, sent: Sent) -> None:
    counts.accepted += sent.result.accepted
    counts.duplicate += sent.duplicates


def _start(cfg: SparkQueueConfig) -> tuple[Enqueuer, FailureHook, PartitionCounts]:
    partition, attempt = task_identity()
    return (
        Enqueuer(cfg, partition),
        FailureHook(cfg, partition, attempt),
        PartitionCounts(partition),
    )


def enqueue_partitions(cfg: SparkQueueConfig) -> Callable[[Iterator[Row]], None]:
    """A function for `df.foreachPartition`: enqueues the partition's rows (fire and forget).

    Raises in the task when Redis fails or stays full, so Spark retries it; the retry enqueues
    only what is missing.
    """
    run_cfg = cfg.for_run()

    def enqueue_partition(rows: Iterator[Row]) -> None:
        enqueuer, hook, counts = _start(run_cfg)
        _enqueue_chunks(enqueuer, hook, counts, row_chunks(run_cfg, rows, enqueuer.max_body_bytes))

    return enqueue_partition


def arrow_enqueuer(
    cfg: SparkQueueConfig,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A function for `df.mapInArrow(f, ENQUEUE_STATS_SCHEMA)`: one counts row per partition.

    The returned DataFrame is lazy: each action on it runs the enqueue again (which enqueues
    nothing new, and then counts every row as a duplicate). `enqueue_dataframe` runs it once.
    """
    run_cfg = cfg.for_run()

    def enqueue_arrow(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        enqueuer, hook, counts = _start(run_cfg)
        chunks = arrow_chunks(run_cfg, batches, enqueuer.max_body_bytes)
        _enqueue_chunks(enqueuer, hook, counts, chunks)
        yield pa.RecordBatch.from_pydict(
            {
                "partition": pa.array([counts.partition], pa.int32()),
                "accepted": pa.array([counts.accepted], pa.int64()),
                "duplicate": pa.array([counts.duplicate], pa.int64()),
                "rejected": pa.array([counts.rejected], pa.int64()),
            }
        )

    return enqueue_arrow


def enqueue_dataframe(df: DataFrame, cfg: SparkQueueConfig) -> DataFrame:
    """Enqueue every row of `df` (runs one Spark job now) and return the exact counts.

    The result is a small local DataFrame (ENQUEUE_STATS_SCHEMA, one row per partition) built
    from the successful attempts' outputs, so a failed and retried task is counted once:
    requests its failed attempt enqueued count as accepted, ids known from elsewhere (another
    run, another partition, an earlier action) as duplicates. Works under Spark Connect.
    """
    rows = map_in_arrow(df, arrow_enqueuer(cfg), ENQUEUE_STATS_SCHEMA).collect()
    counts = sorted((PartitionCounts(*r) for r in rows), key=lambda c: c.partition)
    return _counts_frame(df.sparkSession, counts)


def _counts_frame(spark: SparkSession, counts: list[PartitionCounts]) -> DataFrame:
    """The counts as a DataFrame of ENQUEUE_STATS_SCHEMA, built in the JVM from a VALUES list:
    `createDataFrame` of Python rows would run one more Spark job, with Python workers, when
    the result is read (about 0.1 s, as long as enqueuing 40,000 rows)."""
    if not counts:
        return spark.createDataFrame([], ENQUEUE_STATS_SCHEMA)
    values = ", ".join(  # integers only (int() refuses anything else): nothing to inject
        f"({int(c.partition)}, {int(c.accepted)}, {int(c.duplicate)}, {int(c.rejected)})"
        for c in counts
    )
    table = f"VALUES {values} AS counts(partition, accepted, duplicate, rejected)"
    return spark.sql(
        "SELECT CAST(partition AS INT) AS partition, CAST(accepted AS BIGINT) AS accepted, "  # noqa: S608
        "CAST(duplicate AS BIGINT) AS duplicate, CAST(rejected AS BIGINT) AS rejected "
        f"FROM {table}"
    )


def foreach_batch(cfg: SparkQueueConfig) -> Callable[[DataFrame, int], list[PartitionCounts]]:
    """A function for `writeStream.foreachBatch`: enqueues each micro-batch's rows.

    Ids come from the namespace and the row key only, so a batch replayed after a restart (same
    batch id, same rows from a deterministic source) enqueues nothing twice. Returns the
    batch's per-partition counts (Spark ignores them; handy for logging and tests).
    """

    def enqueue_batch(batch_df: DataFrame, batch_id: int) -> list[PartitionCounts]:
        rows = map_in_arrow(batch_df, arrow_enqueuer(cfg), ENQUEUE_STATS_SCHEMA).collect()
        return [PartitionCounts(*r) for r in sorted(rows, key=lambda r: int(r[0]))]

    return enqueue_batch
