"""What runs inside a Spark task: the per-process client, the task's identity, the enqueuer."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prq.bulk import BulkClient, BulkResult, Ledger, LossWatch, TaskAttempt, fingerprints
from prq.bulk.watch import WatchStart
from prq.core.config import QueueSettings
from prq.core.errors import QueueFull
from prq.datastreams import FileSystemStore
from prq.spark._config import InjectedTaskFailure, SparkQueueConfig
from prq.spark._encode import body_tail

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

__all__ = [
    "ArrowFunction",
    "Enqueuer",
    "FailureHook",
    "Sent",
    "client",
    "map_in_arrow",
    "task_identity",
]

#: This process's clients, by (url, prefix, pid, settings overrides, DataStream directory);
#: the pid keeps a forked process from using its parent's connection.
_CLIENTS: dict[tuple[str, str, int, str, str | None], BulkClient] = {}
_CLIENTS_LOCK = threading.Lock()
ArrowFunction = Callable[[Iterator["pa.RecordBatch"]], Iterator["pa.RecordBatch"]]


def client(cfg: SparkQueueConfig) -> BulkClient:
    """The BulkClient of this Python worker process for `cfg`'s Redis (created once)."""
    overrides = cfg.queue_settings or {}
    key = (
        cfg.url, cfg.prefix, os.getpid(), repr(sorted(overrides.items())), cfg.datastreams_dir
    )  # fmt: skip
    with _CLIENTS_LOCK:
        found = _CLIENTS.get(key)
        if found is None:
            settings = QueueSettings(**overrides)
            store = FileSystemStore(cfg.datastreams_dir) if cfg.datastreams_dir else None
            found = BulkClient.from_url(
                cfg.url, prefix=cfg.prefix, settings=settings, datastreams=store
            )
            _CLIENTS[key] = found
        return found


def task_identity() -> tuple[int, int]:
    """(partition id, attempt number) of the running task; (0, 0) outside Spark."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        return 0, 0
    return context.partitionId(), context.attemptNumber()


class FailureHook:
    """Implements `fail_first_attempt_after` (a test hook)."""

    def __init__(self, cfg: SparkQueueConfig, partition: int, attempt: int) -> None:
        armed = cfg.fail_first_attempt_after is not None and partition == 0 and attempt == 0
        self.limit = cfg.fail_first_attempt_after if armed else None
        self.seen = 0

    def rows_handed(self, n: int) -> None:
        if self.limit is not None and self.seen >= self.limit:
            raise InjectedTaskFailure(f"injected failure after {self.seen} rows")
        self.seen += n


@dataclass(slots=True)
class Sent:
    """What `Enqueuer.send` did with one chunk."""

    #: Ids sent to Redis and not sent before by this task attempt, in order.
    ids: list[str] = field(default_factory=list)
    #: Ids this task attempt had sent before (in this chunk, or in another batch): not queued
    #: again.
    repeated: list[str] = field(default_factory=list)
    #: Ids held by another request (sent before with other params, by another task or run):
    #: not queued again (among the duplicates; only when sent with fingerprints).
    conflicting: list[str] = field(default_factory=list)
    #: What Redis did with the sent ids.
    result: BulkResult = field(default_factory=BulkResult)

    @property
    def duplicates(self) -> int:
        """Ids not queued because they were known: repeats and Redis's duplicates, once each."""
        return len(self.repeated) - len(self.result.repeated_ids) + self.result.duplicates


#: What `Enqueuer.prepare` keeps for `transmit`: the chunk's Sent, its items and their
#: fingerprints (None: sent without).
Prepared = tuple[Sent, list[tuple[str, str]], list[bytes] | None]


class Enqueuer:
    """Sends a task's encoded requests; idempotent by id, with the task's attempt in each batch
    nonce (prq.bulk.TaskAttempt).

    The task is the action's run token plus the partition: requests that an earlier attempt of
    the same task enqueued count as accepted on the retry, while ids enqueued by anything else
    count as duplicates. An id that comes twice within the attempt is a duplicate the second
    time: Redis tells so from the nonces, so the task keeps no id beyond the chunk it sends
    (its memory does not grow with the partition).

    `fingerprinted` (call-and-collect): each request carries the fingerprint of its body up to
    its params' end (method and params: prq.bulk.fingerprints), so an id another task or an
    earlier run sent with other params comes back in `Sent.conflicting` instead of being
    joined: the outcome stored under it is another row's.

    `watched` (the enqueue paths): a loss watch (prq.bulk.LossWatch) is started before the
    task's first batch, beside the action's job mark (one round trip; `started` keeps what it
    read), and stepped by every batch after its writes (no round trip more), so `watch.lost`
    says whether Redis lost data while the task wrote.
    """

    def __init__(
        self,
        cfg: SparkQueueConfig,
        partition: int,
        *,
        fingerprinted: bool = False,
        watched: bool = False,
    ) -> None:
        self.cfg = cfg
        #: What every body of the job ends with after its params (None: no fingerprints)
        self.tail = len(body_tail(cfg)) if fingerprinted else None
        self.bulk = client(cfg)
        self.attempt = TaskAttempt(f"{cfg.run_token or 'norun'}:{cfg.namespace}:p{partition}")
        #: The job's dedup window beyond the records' lives (SparkQueueConfig.dedup_ttl_s)
        self.ledger = (
            Ledger(cfg.namespace, cfg.dedup_ttl_s) if cfg.dedup_ttl_s is not None else None
        )
        #: Tells whether Redis lost data while the task wrote (None: not watched)
        self.watch = LossWatch() if watched else None
        #: What starting the watch read, before the first batch (None: nothing sent yet)
        self.started: WatchStart | None = None

    @property
    def max_body_bytes(self) -> int:
        return self.bulk.settings.max_body_bytes

    def send(self, ids: Sequence[str], bodies: Sequence[str]) -> Sent:
        """Enqueue one chunk (one round trip, QueueFull retried with backoff, bounded)."""
        return self.transmit(self.prepare(ids, bodies))

    def prepare(self, ids: Sequence[str], bodies: Sequence[str]) -> Prepared:
        """Set aside the ids that come twice in the chunk (Redis tells the repeats of earlier
        batches: `transmit`)."""
        sent = Sent()
        seen: set[str] = set()
        items: list[tuple[str, str]] = []
        for rid, body in zip(ids, bodies, strict=True):
            if rid in seen:
                sent.repeated.append(rid)
            else:
                seen.add(rid)
                sent.ids.append(rid)
                items.append((rid, body))
        marks = None
        if self.tail is not None:  # (the tail is ASCII: as many characters as bytes)
            cut = self.tail
            marks = fingerprints([body[: len(body) - cut].encode() for _, body in items])
        return sent, items, marks

    def transmit(self, prepared: Prepared) -> Sent:
        """Send what `prepare` kept (may run in another thread, one transmit at a time)."""
        sent, items, marks = prepared
        if items:
            sent.result = self._send_with_backoff(items, marks)
            if sent.result.repeated_ids:
                again = set(sent.result.repeated_ids)
                sent.ids = [rid for rid in sent.ids if rid not in again]
                sent.repeated += sent.result.repeated_ids
            if sent.result.conflict_ids:
                held = set(sent.result.conflict_ids)
                sent.ids = [rid for rid in sent.ids if rid not in held]
                sent.conflicting += sent.result.conflict_ids
        return sent

    def _send_with_backoff(
        self, items: list[tuple[str, str]], marks: list[bytes] | None
    ) -> BulkResult:
        deadline = time.monotonic() + self.cfg.queue_full_timeout_s
        delay = 0.05
        nonce = self.attempt.next_nonce()  # the same for every sending of this batch
        while True:
            try:
                if self.watch is not None and self.started is None:  # (a write too)
                    job = f"{self.cfg.run_token or 'norun'}:{self.cfg.namespace}"
                    self.started = self.bulk.start_watch(self.cfg.endpoint, self.watch, job=job)
                result = self.bulk.enqueue_encoded(
                    self.cfg.endpoint,
                    items,
                    pickup_timeout_s=self.cfg.pickup_timeout_s,
                    nonce=nonce,
                    attempt=self.attempt,
                    locators=self.cfg.locators,
                    priority=self.cfg.priority,
                    producer=self.cfg.producer,
                    delivery=self.cfg.delivery,
                    ledger=self.ledger,
                    retry_failed=self.cfg.retry_failed,
                    fingerprints=marks,
                    watch=self.watch,
                )
            except QueueFull:
                if time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)  # backing off while Redis is full
                delay = min(delay * 2, 2.0)
            else:
                # a batch of duplicates added nothing to wait for (one re-sent by a retried
                # attempt counts as accepted, and waits as its first sending would have)
                if result.accepted:
                    self._hold_back(result.depths.get(self.cfg.endpoint, 0))
                return result

    def _hold_back(self, depth: int) -> None:
        """Backpressure: while the endpoint holds max_queued requests or more, wait (backing
        off) for its receivers to take some; QueueFull past queue_full_timeout_s."""
        bound = self.cfg.max_queued
        if bound is None or depth < bound:
            return
        deadline = time.monotonic() + self.cfg.queue_full_timeout_s
        delay = 0.05
        while depth >= bound:
            left = deadline - time.monotonic()
            if left <= 0:
                raise QueueFull(
                    f"{self.cfg.endpoint} still holds {depth} queued requests, max_queued="
                    f"{bound}, after queue_full_timeout_s={self.cfg.queue_full_timeout_s:g}: "
                    "are its receivers running? (the task fails; Spark retries it)"
                )
            time.sleep(min(delay, left))  # waiting for the endpoint's receivers to take some
            delay = min(delay * 2, 1.0)
            depth = self.bulk.depth(self.cfg.endpoint)


def map_in_arrow(df: DataFrame, func: ArrowFunction, schema: str) -> DataFrame:
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
