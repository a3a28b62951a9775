"""Call and collect from Spark: each row a request, each request's outcome a result row."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prq.bulk import TAKEN_BEFORE, BulkClient, LossWatch
from prq.core.errors import PrqError
from prq.protocol.scripts.replies import RequestSnapshot
from prq.spark._config import CALL_RESULT_SCHEMA, SparkQueueConfig
from prq.spark._encode import Chunk, arrow_chunks
from prq.spark._runtime import Enqueuer, FailureHook, map_in_arrow, task_identity

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

__all__ = ["RETRYABLE_ERRORS", "arrow_caller", "call_batches", "call_dataframe", "rows_to_retry"]

#: The error types of call_dataframe's result rows worth sending again (rows_to_retry): lost,
#: expired, timed out, given up by a receiver, or never sent. A service's own errors, and
#: OutcomeExpired (it ran; its answer is no longer kept), are not among them.
RETRYABLE_ERRORS = (
    "DataLoss", "RequestExpired", "ReceiverLost", "PickupTimeout", "CallTimeout", "NotSent",
)  # fmt: skip
#: The columns of CALL_RESULT_SCHEMA.
RESULT_COLUMNS = ("request_id", "result_json", "error_type", "error_message", "maybe_executed")
#: Requests whose outcomes one read asks for (see _Caller._read_outcomes).
OUTCOME_WINDOW = 256
_FINAL = frozenset({"done", "withdrawn", "cancelled", "missing", "unknown"})
#: (request_id, result_json, error_type, error_message, maybe_executed): CALL_RESULT_SCHEMA
_Answer = tuple[str, str | None, str | None, str | None, bool]


def _answer(
    rid: str, snapshot: RequestSnapshot, endpoint: str, bulk: BulkClient, lost: bool
) -> _Answer:
    """A result row for a request in a final state: the result, or the error a waiting caller
    would get (prq.protocol.outcomes), by its class name. `lost`: Redis lost data while the task
    waited (LossWatch), so a record found missing was lost, not expired."""
    if snapshot.state in ("missing", "unknown"):
        if lost:
            return (
                rid, None, "DataLoss",
                f"Redis lost data while the task waited for request {rid} (a restart without "
                "persistence, a flush, a failover to a replica that missed writes): its record "
                "and any answer are gone; it may have run (maybe executed)",
                True,
            )  # fmt: skip
        if snapshot.reason == TAKEN_BEFORE:  # the job's ledger says a receiver took it
            return (
                rid, None, "OutcomeExpired",
                f"request {rid} was taken by a receiver (the job's ledger says so), and its "
                "answer is no longer kept (response_ttl_s); a rerun does not send it again "
                "(dedup_ttl_s), so it ran once, or may have",
                True,
            )  # fmt: skip
        return (
            rid, None, "RequestExpired",
            "nothing is stored under the id: it expired unanswered (pickup timeout plus the "
            "request TTL extra) or its response outlived the response TTL; it may have run",
            True,
        )  # fmt: skip
    try:
        response = bulk.resolve(snapshot, rid, endpoint)
    except PrqError as exc:
        return rid, None, type(exc).__name__, str(exc), exc.maybe_executed
    if response is None:  # not final: _FINAL keeps these out
        raise AssertionError(f"request {rid} is still {snapshot.state}")
    if response.error is not None:  # a receiver took it: it ran, or may have
        return rid, None, response.error.type, response.error.message, True
    return rid, json.dumps(response.result), None, None, True


def _refusals(chunk: Chunk, limit: int) -> list[_Answer]:
    """Answers for the rows of `chunk` that were never sent."""
    answers: list[_Answer] = [
        (rid, None, "InvalidRequestId", msg, False) for rid, msg in chunk.invalid
    ]
    answers += [
        (
            rid,
            None,
            "PayloadTooLarge",
            f"request {rid} is {size} bytes, over max_body_bytes={limit}; nothing was written",
            False,
        )
        for rid, size in chunk.too_large
    ]
    return answers


class _Caller:
    """One task's call-and-collect loop: a window of at most max_in_flight unanswered ids.

    Rows are sent only while the window has room; otherwise the task waits for outcomes first.
    A request unanswered `call_timeout_s` after it was sent is answered with error type
    CallTimeout (it may still run), which frees its place. Past `task_timeout_s` (from the
    task's start; None: never) nothing more is sent: rows not sent are answered NotSent, the
    requests in flight CallTimeout.
    """

    def __init__(self, cfg: SparkQueueConfig) -> None:
        self.cfg = cfg
        partition, attempt = task_identity()
        self.hook = FailureHook(cfg, partition, attempt)
        self.enqueuer = Enqueuer(cfg, partition, fingerprinted=True)
        #: Tells requests Redis lost from requests that expired (started before any is sent)
        self.watch = LossWatch()
        self.enqueuer.bulk.start_watch(cfg.endpoint, self.watch)
        #: id -> when it times out (monotonic); insertion-ordered, so oldest (and first due)
        #: first
        self.in_flight: dict[str, float] = {}
        self.backlog_ids: list[str] = []
        self.backlog_bodies: list[str] = []
        bound = cfg.task_timeout_s
        self.task_deadline = math.inf if bound is None else time.monotonic() + bound
        self.next_read = 0.0  # monotonic time of the next outcome read

    def run(self, chunks: Iterator[Chunk]) -> Iterator[list[_Answer]]:
        for chunk in chunks:
            self.hook.rows_handed(chunk.rows)
            refused = _refusals(chunk, self.enqueuer.max_body_bytes)
            if refused:
                yield refused
            self.backlog_ids += chunk.ids
            self.backlog_bodies += chunk.bodies
            while len(self.backlog_ids) + len(self.in_flight) > self.cfg.max_in_flight:
                yield self._send_what_fits() + self._collect()
            duplicates = self._send_what_fits()
            if duplicates:
                yield duplicates
        while self.backlog_ids or self.in_flight:
            yield self._send_what_fits() + self._collect()

    def _task_over(self) -> bool:
        return time.monotonic() >= self.task_deadline

    def _send_what_fits(self) -> list[_Answer]:
        """Send what the window has room for; DuplicateKey answers for the ids this task sent
        before, and for those another task or run sent with other params (each row gets one
        answer: its own, or why not; the first row with the key gets the response)."""
        room = min(self.cfg.max_in_flight - len(self.in_flight), len(self.backlog_ids))
        if room <= 0 or self._task_over():
            return []
        ids, self.backlog_ids = self.backlog_ids[:room], self.backlog_ids[room:]
        bodies, self.backlog_bodies = self.backlog_bodies[:room], self.backlog_bodies[room:]
        answers: list[_Answer] = []
        for start in range(0, len(ids), self.cfg.batch_size):
            stop = start + self.cfg.batch_size
            sent = self.enqueuer.send(ids[start:stop], bodies[start:stop])
            due = time.monotonic() + self.cfg.call_timeout_s
            gone = set(sent.result.expired_ids)
            self.in_flight.update(dict.fromkeys((i for i in sent.ids if i not in gone), due))
            repeated = "its row key came before in the task"
            answers += [
                (rid, None, "DuplicateKey", f"request {rid}: {repeated}", False)
                for rid in sent.repeated
            ]
            answers += [
                (rid, None, "DuplicateKey", self._conflict_message(rid), False)
                for rid in sent.conflicting
            ]
            answers += [
                (rid, None, "OutcomeExpired", self._gone_message(rid), True) for rid in gone
            ]
        return answers

    def _collect(self) -> list[_Answer]:
        """Wait (bounded) until some requests are final or due; return their answers. Outcomes
        are read at most once per poll interval, however quickly answers come."""
        answers: list[_Answer] = []
        while self.in_flight and not self._task_over():
            pause = self.next_read - time.monotonic()
            if pause > 0:
                time.sleep(pause)  # the poll interval between outcome reads
            self.next_read = time.monotonic() + self.cfg.poll_interval_s
            answers += self._read_outcomes()
            answers += self._time_out_due()
            if answers:
                return answers
        if self._task_over():
            answers += self._give_up()
        return answers

    def _read_outcomes(self) -> list[_Answer]:
        """Outcomes of the oldest requests, OUTCOME_WINDOW at a time, while whole windows are
        final: receivers take requests oldest first, so the younger ones are seldom done
        when an older window is not, and reading them every poll would cost Redis a script
        call per request in flight."""
        answers: list[_Answer] = []
        ids = list(self.in_flight)
        window = min(self.cfg.batch_size, OUTCOME_WINDOW)
        for start in range(0, len(ids), window):
            part = ids[start : start + window]
            final = 0
            bulk, watch, ledger = self.enqueuer.bulk, self.watch, self.enqueuer.ledger
            read = bulk.outcomes(self.cfg.endpoint, part, watch=watch, ledger=ledger)
            for rid, snapshot in read.items():
                if snapshot.state in _FINAL:
                    answers.append(_answer(rid, snapshot, self.cfg.endpoint, bulk, watch.lost))
                    del self.in_flight[rid]
                    final += 1
            if final < len(part):
                break
        return answers

    def _time_out_due(self) -> list[_Answer]:
        """CallTimeout answers for the requests sent call_timeout_s ago or more (they leave the
        window; they were sent, so they may still run)."""
        now = time.monotonic()
        due = []
        for rid, deadline in self.in_flight.items():
            if deadline > now:
                break  # sent later, due later
            due.append(rid)
        for rid in due:
            del self.in_flight[rid]
        return [(rid, None, "CallTimeout", self._sent_message(), True) for rid in due]

    def _gone_message(self, rid: str) -> str:
        return (
            f"request {rid} was taken by a receiver in an earlier run of namespace "
            f"{self.cfg.namespace!r}, and its outcome is no longer kept; it was not sent again "
            "(dedup_ttl_s), so it ran once, or may have"
        )

    def _conflict_message(self, rid: str) -> str:
        return (
            f"request {rid}: its row key was sent before with other params (by another row of "
            f"the job in another task, or by an earlier run of namespace {self.cfg.namespace!r}),"
            " and that request holds the id: its answer is not this row's, and this row was "
            "not sent"
        )

    def _sent_message(self) -> str:
        return (
            f"no outcome within call_timeout_s={self.cfg.call_timeout_s:g} of its sending: it "
            "was sent, so it may still run (maybe executed)"
        )

    def _give_up(self) -> list[_Answer]:
        """Past task_timeout_s: CallTimeout for the requests in flight, NotSent for the rows
        never sent; both are emptied."""
        in_flight = (
            f"the task ran past task_timeout_s={self.cfg.task_timeout_s:g} with no outcome: it "
            "was sent, so it may still run (maybe executed)"
        )
        unsent = (
            f"not sent: the task ran past task_timeout_s={self.cfg.task_timeout_s:g} before "
            "there was room for it in the window (max_in_flight); it never ran"
        )
        answers: list[_Answer] = [
            (rid, None, "CallTimeout", in_flight, True) for rid in self.in_flight
        ]
        answers += [(rid, None, "NotSent", unsent, False) for rid in self.backlog_ids]
        self.in_flight.clear()
        self.backlog_ids, self.backlog_bodies = [], []
        return answers


def _answers_batch(answers: list[_Answer]) -> pa.RecordBatch:
    import pyarrow as pa

    columns = list(zip(*answers, strict=True)) if answers else [()] * len(RESULT_COLUMNS)
    return pa.RecordBatch.from_pydict(
        {
            name: pa.array(list(values), pa.bool_() if name == "maybe_executed" else pa.string())
            for name, values in zip(RESULT_COLUMNS, columns, strict=True)
        }
    )


def arrow_caller(
    cfg: SparkQueueConfig,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A function for `df.mapInArrow(f, CALL_RESULT_SCHEMA)`: sends each row as a request and
    yields (request_id, result_json, error_type, error_message) once it has an outcome."""
    run_cfg = cfg.for_run()

    def call_arrow(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        caller = _Caller(run_cfg)
        chunks = arrow_chunks(run_cfg, batches, caller.enqueuer.max_body_bytes)
        for answers in caller.run(chunks):
            if answers:
                yield _answers_batch(answers)

    return call_arrow


def call_dataframe(
    df: DataFrame, cfg: SparkQueueConfig, *, result_schema: str | StructType | None = None
) -> DataFrame:
    """Call the endpoint once per row; a lazy DataFrame of CALL_RESULT_SCHEMA (request_id,
    result_json, error_type, error_message, maybe_executed: false only for a request that
    certainly did not run), then the row's key under `cfg.key_column`, with its type (read
    back from the request id: exact for string and integer keys, the kinds ids are best made
    of), to join the answers back to the rows; and with `result_schema` (a DDL string or a
    StructType), `result`: result_json parsed by it (`from_json`; null where it does not fit).

    Each task keeps at most `cfg.max_in_flight` requests unanswered and waits for outcomes
    before sending more (and backs off while Redis is full). A service error shows as
    error_type/error_message (the ServerError's type and message); a request that ended without
    a response as e.g. PickupTimeout, ReceiverLost or Cancelled; one Redis lost while the
    task waited as DataLoss; one a receiver took in an earlier run, whose outcome is no longer
    kept (or whose answer expired before the task read it: the job's ledger says a receiver
    took it), as OutcomeExpired (never sent again within `cfg.dedup_ttl_s`); one unanswered
    `cfg.call_timeout_s` after it was sent as CallTimeout (it may still run); a row never sent
    as InvalidRequestId, PayloadTooLarge, DuplicateKey (its key came before in the task, or
    another task or an earlier run sent it with other params: the answer under the id is
    another row's) or NotSent (the task ran past `cfg.task_timeout_s` first). Ids are
    deterministic, so a retried task or a second action re-reads the stored responses (kept
    for `cfg.response_ttl_s`, or the receivers' response TTL) and runs nothing twice on the
    service (see rows_to_retry for a repairing rerun); still, persist or
    write out the result once rather than running many actions on it.
    """
    from pyspark.sql import functions as F

    if cfg.key_column in RESULT_COLUMNS or (
        result_schema is not None and cfg.key_column == "result"
    ):
        raise ValueError(f"key_column {cfg.key_column!r} is a name the answers use already")
    key_type = df.schema[cfg.key_column].dataType.simpleString()
    start = len(cfg.namespace) + 2  # after "<namespace>:", 1-based
    answers = map_in_arrow(df, arrow_caller(cfg), CALL_RESULT_SCHEMA).withColumn(
        cfg.key_column, F.expr(f"CAST(substring(request_id, {start}) AS {key_type})")
    )
    if result_schema is not None:
        answers = answers.withColumn("result", F.from_json("result_json", result_schema))
    return answers


def rows_to_retry(
    df: DataFrame, results: DataFrame, cfg: SparkQueueConfig, *, maybe_executed: bool = True
) -> DataFrame:
    """The rows of `df` whose calls in `results` (call_dataframe(df, cfg), persisted or written
    out by the first run) ended with an error of RETRYABLE_ERRORS; with
    `maybe_executed=False`, only those that certainly did not run.

    A repairing rerun: `call_dataframe(rows_to_retry(df, results, cfg),
    replace(cfg, retry_failed=True))` sends exactly these rows again (same namespace, so the
    same ids) and none of the rows that have answers, even after Redis lost everything. A row
    whose result says maybe_executed may run a second time. Rows are matched by their key:
    the results' `key_column` (as call_dataframe returns it), else the key in the request id,
    compared as text.
    """
    from pyspark.sql import functions as F

    failed = results.where(F.col("error_type").isin(list(RETRYABLE_ERRORS)))
    if not maybe_executed:
        failed = failed.where(~F.col("maybe_executed"))
    if cfg.key_column in results.columns:  # as call_dataframe returns them: keys typed
        keys = failed.select(F.col(cfg.key_column).alias("_prq_key")).distinct()
        return df.join(keys, df[cfg.key_column] == keys["_prq_key"], "left_semi")
    start = len(cfg.namespace) + 2  # after "<namespace>:", 1-based
    keys = failed.select(F.expr(f"substring(request_id, {start})").alias("_prq_key")).distinct()
    matches = df[cfg.key_column].cast("string") == keys["_prq_key"]
    return df.join(keys, matches, "left_semi")


def call_batches(
    cfg: SparkQueueConfig,
    write: Callable[[DataFrame, int], object],
    *,
    result_schema: str | StructType | None = None,
) -> Callable[[DataFrame, int], None]:
    """A function for `writeStream.foreachBatch`: calls each micro-batch's rows and hands their
    answers (call_dataframe's, persisted while `write` runs, so its actions do not call twice)
    to `write(answers, batch_id)`, e.g. to append them to a table.

    Ids come from the namespace and the row key only, so a batch replayed after a restart
    (same rows from a deterministic source) runs nothing twice: its answers are read back
    (OutcomeExpired past their lifetime, `cfg.response_ttl_s`); make `write` idempotent by
    batch id (or let the sink's own exactly-once do it) so the replay writes them once.
    """

    def call_batch(batch_df: DataFrame, batch_id: int) -> None:
        answers = call_dataframe(batch_df, cfg, result_schema=result_schema).persist()
        try:
            write(answers, batch_id)
        finally:
            answers.unpersist()

    return call_batch
