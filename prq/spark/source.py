"""`df.write.format("prq")`: bulk enqueue through PySpark's Python Data Source API (PySpark 4;
this module imports pyspark).

    from prq.spark import register_data_source
    register_data_source(spark)          # or: spark.dataSource.register(PrqDataSource)
    (df.write.format("prq").mode("append")
       .option("url", "redis://redis:6379/0").option("endpoint", "poll://scoring")
       .option("method", "score").option("namespace", "daily-scoring:2026-11-21")
       .option("key_column", "id").save())

The options are SparkQueueConfig's fields, as text (numbers, "true"/"false", "none" for an
unset optional value, params_columns comma-separated, queue_settings as a JSON object); they
are checked on the driver when the write is planned. Each task enqueues its partition as
`enqueue_dataframe` does (same ids, same exactly-once, backpressure and ledger), and the write
commits once every task did: the counts of the successful attempts are logged where Spark runs
the commit (the driver's Python worker: "prq write: accepted=... duplicate=... rejected=...
data_loss_partitions=..."). Partitions whose rows Redis may have lost after they were written
(a restart without persistence, a flush: as enqueue_dataframe's `data_loss`) are counted there
too, with one WARNING saying that the same write again, with the same namespace, queues
exactly the rows that are gone. A streaming query writes each micro-batch the same way
(`df.writeStream.format("prq")`); a replayed batch enqueues nothing twice.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from prq.bulk.watch import WatchStart
from prq.spark._config import PartitionCounts, SparkQueueConfig
from prq.spark._encode import arrow_chunks
from prq.spark._enqueue import _enqueue_task, _start, judged, warn_of_loss

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

__all__ = ["PrqDataSource", "config_from_options"]

logger = logging.getLogger("prq.spark")

#: Options no write may set (the driver sets them per write).
_INTERNAL = frozenset({"run_token", "trace_headers"})
#: Options Spark itself passes to a data source (a streaming query's checkpoint): not ours.
_SPARKS = frozenset({"checkpointlocation", "path"})
_NONE = frozenset({"", "none", "null"})


def config_from_options(options: Mapping[str, str]) -> SparkQueueConfig:
    """A SparkQueueConfig from a data source's text options (names are case-insensitive, as
    Spark passes them); ValueError naming what is unknown, missing or not of its type."""
    fields = {f.name.lower(): f for f in dataclasses.fields(SparkQueueConfig)}
    values: dict[str, Any] = {}
    hints = typing.get_type_hints(SparkQueueConfig)
    for name, text in options.items():
        if name.lower() in _SPARKS:
            continue
        found = fields.get(name.lower())
        if found is None or found.name in _INTERNAL:
            raise ValueError(f"prq data source: no such option {name!r}")
        try:
            values[found.name] = _parse(hints[found.name], text)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"prq data source: option {found.name}={text!r}: {exc}") from None
    required = [f.name for f in dataclasses.fields(SparkQueueConfig) if _required(f)]
    missing = [name for name in required if name not in values]
    if missing:
        raise ValueError(f"prq data source: missing option(s) {', '.join(missing)}")
    return SparkQueueConfig(**values)


def _required(field: dataclasses.Field[Any]) -> bool:
    return field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING


def _parse(hint: Any, text: str) -> Any:
    """`text` as a value of the type `hint` names (str, int, float, bool, a tuple of str, a
    dict from JSON, a Literal of str, or any of them or None)."""
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if type(None) in options and text.strip().lower() in _NONE:
        return None
    kind = next(o for o in options if o is not type(None))
    origin = typing.get_origin(kind)
    if kind is bool:
        if text.strip().lower() not in ("true", "false"):
            raise ValueError("expected true or false")
        return text.strip().lower() == "true"
    if kind is int:
        return int(text)
    if kind is float:
        return float(text)
    if origin is tuple:
        return tuple(part.strip() for part in text.split(",") if part.strip())
    if origin is dict:
        parsed = json.loads(text)
        if not isinstance(parsed, dict):
            raise ValueError("expected a JSON object")
        return parsed
    return text  # str, and the Literal of str (delivery): the config checks it


@dataclass
class _Counts(WriterCommitMessage):
    """One task's counts, sent to the driver when it succeeded, and what starting its loss
    watch read (None: it sent nothing)."""

    counts: PartitionCounts
    started: WatchStart | None = None


def _write(cfg: SparkQueueConfig, batches: Iterator[pa.RecordBatch]) -> _Counts:
    enqueuer, hook, counts = _start(cfg)
    chunks = arrow_chunks(cfg, batches, enqueuer.max_body_bytes)
    return _Counts(_enqueue_task(chunks, enqueuer, hook, counts), enqueuer.started)


def _totals(
    cfg: SparkQueueConfig, messages: list[WriterCommitMessage | None], what: str
) -> tuple[int, int, int, int]:
    """(accepted, duplicate, rejected, partitions that may have lost rows) of the successful
    tasks; the loss, if any, told in one WARNING."""
    counts = judged([(m.counts, m.started) for m in messages if isinstance(m, _Counts)])
    warn_of_loss(cfg, what, counts)
    return (
        sum(c.accepted for c in counts),
        sum(c.duplicate for c in counts),
        sum(c.rejected for c in counts),
        sum(c.data_loss for c in counts),
    )


class _Writer(DataSourceArrowWriter):
    def __init__(self, cfg: SparkQueueConfig) -> None:
        self.cfg = cfg

    def write(self, iterator: Iterator[pa.RecordBatch]) -> _Counts:
        return _write(self.cfg, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        accepted, duplicate, rejected, lost = _totals(self.cfg, messages, "a prq write")
        logger.info(
            "prq write: endpoint=%s namespace=%s accepted=%d duplicate=%d rejected=%d "
            "data_loss_partitions=%d",
            self.cfg.endpoint, self.cfg.namespace, accepted, duplicate, rejected, lost,
        )  # fmt: skip


class _StreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, cfg: SparkQueueConfig) -> None:
        self.cfg = cfg

    def write(self, iterator: Iterator[pa.RecordBatch]) -> _Counts:
        return _write(self.cfg, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        what = f"a prq stream write (batch {batchId})"
        accepted, duplicate, rejected, lost = _totals(self.cfg, messages, what)
        logger.info(
            "prq write: endpoint=%s namespace=%s batch=%d accepted=%d duplicate=%d "
            "rejected=%d data_loss_partitions=%d",
            self.cfg.endpoint, self.cfg.namespace, batchId, accepted, duplicate, rejected, lost,
        )  # fmt: skip

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        logger.warning(
            "prq write: batch %d failed; a replay enqueues only what is missing", batchId
        )


class PrqDataSource(DataSource):
    """The `prq` data source (write only): register it with
    `spark.dataSource.register(PrqDataSource)`; see the module docstring."""

    @classmethod
    def name(cls) -> str:
        return "prq"

    def writer(self, schema: StructType, overwrite: bool) -> _Writer:
        return _Writer(self._config(schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> _StreamWriter:
        return _StreamWriter(self._config(schema))

    def _config(self, schema: StructType) -> SparkQueueConfig:
        cfg = config_from_options(self.options)
        if cfg.key_column not in schema.fieldNames():
            raise ValueError(f"prq data source: key_column {cfg.key_column!r} is not a column")
        return cfg.for_run()
