"""prq.spark on a real local Spark (`local[2,4]`) against a real Redis and a real receiver.

Failures are injected with the config's test hook: the first attempt of partition 0 raises
once half its rows were handed over; Spark then retries the task (maxFailures 4), and the
stage's failed-task count proves the failure happened.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import threading
import time
import tracemalloc
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import redis

from prq import Queue, QueueFull, RedisSettings, RequestState
from prq.core.bodies import MARKER
from prq.core.keys import EndpointKeys, KeySchema
from prq.core.models import Request, decode_stored_request
from prq.embedded import EmbeddedRedis
from prq.ops.answers import EndpointInfo
from prq.ops.inspector import Inspector
from prq.protocol.signing import ENVELOPE_MAGIC
from prq.spark import (
    CALL_RESULT_SCHEMA,
    PartitionCounts,
    SparkQueueConfig,
    arrow_enqueuer,
    call_batches,
    call_dataframe,
    enqueue_dataframe,
    enqueue_partitions,
    foreach_batch,
    register_data_source,
    rows_to_retry,
)
from prq.spark._runtime import Enqueuer
from tests.integration.test_cli import Prq, PrqRunner
from tests.queued import level_ids, queue_depth, queued_ids
from tests.redis_servers import scan_keys, wait_until
from tests.stored_bodies import read_body, record_fields

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def stored_request(client: redis.Redis, keys: EndpointKeys, endpoint: str, rid: str) -> Request:
    """The request Redis holds for `rid`, decoded as a receiver would."""
    body = read_body(client, keys.request(rid))
    assert body is not None, rid
    return decode_stored_request(body, endpoint, rid)


def config(redis_url: str, prefix: str, endpoint: str, **overrides: Any) -> SparkQueueConfig:
    values: dict[str, Any] = {
        "url": redis_url,
        "prefix": prefix,
        "endpoint": endpoint,
        "method": "square",
        "namespace": f"job-{uuid.uuid4().hex[:6]}:run-1",
        "key_column": "key",
        "pickup_timeout_s": 300.0,
    } | overrides
    return SparkQueueConfig(**values)


def failed_tasks(spark: SparkSession, group: str) -> int:
    """Failed task attempts of the jobs run under job group `group`."""
    tracker = spark.sparkContext.statusTracker()
    failed = 0
    for job_id in tracker.getJobIdsForGroup(group):
        job = tracker.getJobInfo(job_id)
        assert job is not None
        for stage_id in job.stageIds:
            stage = tracker.getStageInfo(stage_id)
            if stage is not None:
                failed += stage.numFailedTasks
    return failed


async def admin_view(redis_url: str, key_prefix: str) -> dict[str, EndpointInfo]:
    async with Inspector.from_url(redis_url, prefix=key_prefix) as inspector:
        return {info.endpoint: info for info in await inspector.endpoints()}


def totals(counts: list[tuple[Any, ...]]) -> tuple[int, int, int]:
    return (
        sum(c[1] for c in counts),
        sum(c[2] for c in counts),
        sum(c[3] for c in counts),
    )


# -- enqueue --------------------------------------------------------------------------------------


def test_200k_rows_are_enqueued_exactly_once_when_a_task_fails_halfway(
    spark: SparkSession, redis_url: str, key_prefix: str, redis_client: redis.Redis
) -> None:
    # Given 200,000 rows in 4 partitions, whose partition 0 fails on its first attempt after
    # 25,000 of its 50,000 rows were enqueued
    endpoint = "poll://spark-bulk"
    cfg = config(redis_url, key_prefix, endpoint, fail_first_attempt_after=25_000)
    df = spark.range(0, 200_000, numPartitions=4).selectExpr("id AS key", "id * 2 AS doubled")
    group = f"enqueue-{uuid.uuid4().hex[:6]}"
    spark.sparkContext.setJobGroup(group, "200k enqueue with a failed attempt")

    # When the rows are enqueued
    counts = [tuple(r) for r in enqueue_dataframe(df, cfg).collect()]

    # Then the first attempt did fail, and was retried
    assert failed_tasks(spark, group) == 1
    # And the counts of the successful attempts say: every row accepted once, no duplicate
    assert len(counts) == 4
    assert totals(counts) == (200_000, 0, 0)
    assert all(c[1] == 50_000 for c in counts)
    # And Redis holds exactly 200,000 requests, each once
    keys = KeySchema(key_prefix).endpoint(endpoint)
    assert queue_depth(redis_client, keys) == 200_000
    assert int(redis_client.get(keys.sequence) or 0) == 200_000
    pending = queued_ids(redis_client, keys)
    assert len(set(pending)) == 200_000
    first = stored_request(redis_client, keys, endpoint, f"{cfg.namespace}:7")
    assert (first.method, first.params) == ("square", {"doubled": 14})
    # And operators see the job in the admin view (the registry lists the endpoint)
    seen = asyncio.run(admin_view(redis_url, key_prefix))
    assert (seen[endpoint].depth, seen[endpoint].enqueued_total) == (200_000, 200_000)

    # When the same rows are enqueued again by a second action (a whole-job rerun)
    again = [tuple(r) for r in enqueue_dataframe(df, cfg).collect()]

    # Then nothing more is enqueued, and every row is reported as a duplicate
    assert totals(again) == (0, 200_000, 0)
    assert queue_depth(redis_client, keys) == 200_000


def test_the_counts_come_as_a_dataframe_of_the_stats_schema_also_with_no_partition(
    spark: SparkSession, redis_url: str, key_prefix: str
) -> None:
    # Given 10 rows in 2 partitions, and a DataFrame with no partition at all
    cfg = config(redis_url, key_prefix, "poll://spark-counts")
    df = spark.range(0, 10, numPartitions=2).selectExpr("id AS key", "id * 2 AS doubled")
    empty = spark.createDataFrame(spark.sparkContext.emptyRDD(), df.schema)
    assert empty.rdd.getNumPartitions() == 0
    stats = (
        "struct<partition:int,accepted:bigint,duplicate:bigint,rejected:bigint,data_loss:boolean>"
    )

    # When each is enqueued
    counts, none = enqueue_dataframe(df, cfg), enqueue_dataframe(empty, cfg)

    # Then the counts say so, one row per partition in partition order, in the stats schema
    assert counts.schema.simpleString() == none.schema.simpleString() == stats
    assert [tuple(r) for r in counts.collect()] == [(0, 5, 0, 0, False), (1, 5, 0, 0, False)]
    assert none.collect() == []


def test_backpressure_holds_the_endpoint_near_max_queued_while_its_receiver_drains_it(
    spark: SparkSession,
    redis_url: str,
    key_prefix: str,
    redis_client: redis.Redis,
    receiver: tuple[Prq, Path],
) -> None:
    # Given 4,000 rows in 2 partitions for an endpoint whose one receiver is far slower than
    # the job, and a bound of 500 queued requests
    endpoint = "poll://spark-call"
    cfg = config(redis_url, key_prefix, endpoint, batch_size=200, max_queued=500)
    df = spark.range(0, 4_000, numPartitions=2).selectExpr("id AS key", "id AS n")
    keys = KeySchema(key_prefix).endpoint(endpoint)
    depths: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            depths.append(queue_depth(redis_client, keys))
            stop.wait(0.01)  # a sampling interval, not a synchronisation

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()

    # When the rows are enqueued
    try:
        counts = [tuple(r) for r in enqueue_dataframe(df, cfg).collect()]
    finally:
        stop.set()
        sampler.join(10)

    # Then every row was accepted once, and the endpoint held the bound all along: a task
    # sends only while fewer than 500 are queued, so at most one batch per task above it
    assert totals(counts) == (4_000, 0, 0)
    assert depths and max(depths) >= 500, "the bound was reached: backpressure was exercised"
    assert max(depths) <= 500 + 2 * 200, max(depths)


def test_a_task_finding_its_endpoint_over_max_queued_waits_then_fails_with_queue_full(
    redis_url: str, key_prefix: str, redis_client: redis.Redis
) -> None:
    # Given an endpoint nobody serves, a bound of 250 and a wait of at most 0.5 s
    endpoint = "poll://spark-backpressure"
    cfg = config(
        redis_url, key_prefix, endpoint, max_queued=250, queue_full_timeout_s=0.5
    ).for_run()
    enqueuer = Enqueuer(cfg, partition=0)
    body = '{"m":"square","p":{}}'
    for batch in range(2):
        ids = [f"{cfg.namespace}:{batch}-{i}" for i in range(100)]
        assert enqueuer.send(ids, [body] * 100).result.accepted == 100

    # When a third batch leaves it holding 300
    started = time.monotonic()
    with pytest.raises(QueueFull, match="max_queued=250"):
        enqueuer.send([f"{cfg.namespace}:2-{i}" for i in range(100)], [body] * 100)

    # Then the task waited the whole 0.5 s for receivers, then failed (Spark retries it; the
    # batch it had sent counts as accepted then, by its nonce)
    assert time.monotonic() - started >= 0.45
    assert queue_depth(redis_client, KeySchema(key_prefix).endpoint(endpoint)) == 300

    # When the job runs again (a new action) with the same rows: its batches queue nothing
    # (all duplicates), so nothing holds it back
    rerun = Enqueuer(cfg.for_run(), partition=0)
    for batch in range(3):
        ids = [f"{cfg.namespace}:{batch}-{i}" for i in range(100)]
        assert rerun.send(ids, [body] * 100).duplicates == 100


def test_rows_with_keys_that_make_no_request_id_are_rejected(
    spark: SparkSession, redis_url: str, key_prefix: str, redis_client: redis.Redis
) -> None:
    # Given rows whose keys include a space, a pipe, an empty string and a null
    endpoint = "poll://spark-keys"
    cfg = config(redis_url, key_prefix, endpoint, params_columns=("n",))
    bad = ["has space", "a|b", "", None]
    rows = [(f"k{i}", i, "ignored") for i in range(20)] + [(k, -1, "x") for k in bad]
    df = spark.createDataFrame(rows, "key string, n long, other string").repartition(2)

    # When they are enqueued through foreachPartition (fire and forget)
    df.foreachPartition(enqueue_partitions(cfg))

    # Then the 20 good rows are queued, with only the chosen params, and the others are not
    keys = KeySchema(key_prefix).endpoint(endpoint)
    assert queue_depth(redis_client, keys) == 20
    assert stored_request(redis_client, keys, endpoint, f"{cfg.namespace}:k3").params == {"n": 3}
    # And the Arrow variant reports the bad rows as rejected, the good ones as duplicates
    counts = [tuple(r) for r in enqueue_dataframe(df, cfg).collect()]
    assert totals(counts) == (0, 20, 4)


def test_a_job_queues_at_its_priority_in_its_own_producer_turns(
    spark: SparkSession, redis_url: str, key_prefix: str, redis_client: redis.Redis
) -> None:
    # Given rows enqueued by two jobs: one at the defaults, one at priority 4 as "nightly",
    # at_least_once
    endpoint = "poll://spark-priority"
    df = spark.createDataFrame([(f"k{i}", i) for i in range(30)], "key string, n long")
    plain = config(redis_url, key_prefix, endpoint)
    urgent = config(
        redis_url,
        key_prefix,
        endpoint,
        priority=4,
        producer="nightly",
        delivery="at_least_once",
        queue_settings={"max_attempts": 5},
    )
    assert totals([tuple(r) for r in enqueue_dataframe(df, plain).collect()]) == (30, 0, 0)
    df.repartition(3).foreachPartition(enqueue_partitions(urgent))

    # Then each job's requests sit at its priority and name its producer
    keys = KeySchema(key_prefix).endpoint(endpoint)
    assert len(level_ids(redis_client, keys, 0)) == 30
    assert len(level_ids(redis_client, keys, 4)) == 30
    stored = record_fields(redis_client, keys.request(f"{urgent.namespace}:k7"))
    decoded = stored_request(redis_client, keys, endpoint, f"{urgent.namespace}:k7")
    assert (decoded.priority, decoded.producer, decoded.params) == (4, "nightly", {"n": 7})
    # And the at_least_once job's requests may be handed out 5 times; the other's once
    assert (decoded.delivery, stored.get(b"ma")) == ("at_least_once", b"5")
    plain_stored = record_fields(redis_client, keys.request(f"{plain.namespace}:k7"))
    plain_request = stored_request(redis_client, keys, endpoint, f"{plain.namespace}:k7")
    # And a node that did not send them finds a job's request by id alone, and cancels it
    with Queue(RedisSettings(url=redis_url), prefix=key_prefix) as other:
        found = other.status(f"{urgent.namespace}:k7")
        assert (found.state, found.endpoint) == (RequestState.QUEUED, endpoint)
        assert other.cancel(f"{plain.namespace}:k3")
        assert other.status(f"{plain.namespace}:k3").state == RequestState.WITHDRAWN
    assert plain_request.delivery == "at_most_once"
    assert plain_stored.get(b"ma") in (None, b"0")
    # And a bad priority or producer is refused when the job is configured
    with pytest.raises(ValueError, match="priority"):
        config(redis_url, key_prefix, endpoint, priority=2**31)
    with pytest.raises(ValueError, match="producer"):
        config(redis_url, key_prefix, endpoint, producer="p" * 201)


def test_enqueue_works_where_pandas_is_not_installed(
    spark: SparkSession,
    redis_url: str,
    key_prefix: str,
    redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a driver where pandas cannot be found (classic mapInArrow insists on it)
    import pyspark.sql.pandas.functions as pandas_functions

    real_find_spec, real_udf = importlib.util.find_spec, pandas_functions.vectorized_udf  # type: ignore[attr-defined]
    built: list[object] = []

    def no_pandas(name: str, *args: Any) -> Any:
        return None if name == "pandas" else real_find_spec(name, *args)

    def counting_udf(*args: Any, **kwargs: Any) -> Any:
        built.append(args)
        return real_udf(*args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", no_pandas)
    monkeypatch.setattr(pandas_functions, "vectorized_udf", counting_udf)
    endpoint = "poll://spark-no-pandas"
    df = spark.range(0, 1_000, numPartitions=2).selectExpr("id AS key", "id AS n")

    # When the rows are enqueued with exact counts
    counts = [
        tuple(r) for r in enqueue_dataframe(df, config(redis_url, key_prefix, endpoint)).collect()
    ]

    # Then the plan was built without pandas, and every row is queued
    assert len(built) == 1
    assert totals(counts) == (1_000, 0, 0)
    assert queue_depth(redis_client, KeySchema(key_prefix).endpoint(endpoint)) == 1_000


def test_enqueue_raises_when_redis_is_away(spark: SparkSession, key_prefix: str) -> None:
    # Given a config naming a Redis nobody listens on (and a short retry budget)
    from prq.embedded import free_port

    url = f"redis://127.0.0.1:{free_port()}/0"
    cfg = config(url, key_prefix, "poll://spark-away", queue_settings={"retry_budget_s": 0.3})
    df = spark.range(0, 10, numPartitions=1).selectExpr("id AS key")
    # When the rows are enqueued, Then the job fails (after the task's retry): nothing is
    # lost silently
    with pytest.raises(Exception, match="QueueUnavailable"):
        enqueue_dataframe(df, cfg)


# -- call and collect -----------------------------------------------------------------------------


def completed_tasks(spark: SparkSession, group: str) -> int:
    """Task attempts completed so far in the jobs run under job group `group`."""
    tracker = spark.sparkContext.statusTracker()
    done = 0
    for job_id in tracker.getJobIdsForGroup(group):
        job = tracker.getJobInfo(job_id)
        for stage_id in job.stageIds if job is not None else ():
            stage = tracker.getStageInfo(stage_id)
            done += stage.numCompletedTasks if stage is not None else 0
    return done


def test_an_enqueue_across_a_flush_says_which_partitions_lost_rows_and_a_rerun_repairs_it(
    spark: SparkSession,
    own_redis: EmbeddedRedis,
    own_redis_client: redis.Redis,
    key_prefix: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given a job of 4 partitions (1,000, 2,000, 2,000 and 1,000 rows, two tasks at a time) and
    # an endpoint that holds at most 2,000 queued requests: partitions 0 and 1 write until it
    # is full and one of them ends, then the other and partition 2 wait for room (partition 3
    # waits for a task slot)
    endpoint, ledger = "poll://spark-signal", tmp_path / "ledger.txt"
    ledger.touch()
    cfg = config(own_redis.url, key_prefix, endpoint, queue_full_timeout_s=60.0)
    keys = KeySchema(key_prefix).endpoint(endpoint)
    own_redis_client.hset(keys.limits, "mp", 2_000)
    sizes = [(0, 1_000), (1_000, 3_000), (3_000, 5_000), (5_000, 6_000)]
    rows = spark.sparkContext.parallelize(sizes, len(sizes)).flatMap(
        lambda bounds: [(n, n) for n in range(*bounds)]
    )
    df = spark.createDataFrame(rows, "key long, n long")
    runner = PrqRunner(own_redis.url, key_prefix)
    group = f"signal-{uuid.uuid4().hex[:6]}"

    def watches() -> int:  # (the tasks' loss watches, not the action's job mark)
        return sum(b":lw:job." not in key for key in scan_keys(own_redis_client, f"{keys.tag}:lw"))

    def first_run() -> list[Any]:
        spark.sparkContext.setJobGroup(group, "an enqueue across a flush")
        return enqueue_dataframe(df, cfg).collect()

    try:
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(first_run)
            wait_until(
                lambda: completed_tasks(spark, group) == 1 and watches() == 3, 60, 0.02,
                "partition 0 done, partitions 1 and 2 waiting for room",
            )  # fmt: skip
            # (which partition wrote what first is up to Spark: partitions 0 and 1 race)
            held = [int(rid.rsplit(b":", 1)[1]) for rid in queued_ids(own_redis_client, keys)]
            assert len(held) == 2_000
            # When Redis is flushed (its limit goes with it: they write on)
            own_redis_client.flushall()
            # (and a worker serves the endpoint from then on: a flush takes the ledger's note
            # of what ran before it too, and that would run again)
            worker = runner.start(
                "worker", "tests.spark.ledger_handler:record", "-e", endpoint,
                "--concurrency", "16", PRQ_TEST_LEDGER=str(ledger),
            )  # fmt: skip
            worker.wait_for_line("prq worker: serving")
            first = [tuple(r) for r in running.result(timeout=120)]

        # Then every row counts as accepted, and the partitions whose rows the flush may have
        # taken say so: 0 and 1 (the one that ended before the flush is unseen by its own
        # watch), 2 (nothing yet, but its watch had started); not 3, which began after it
        assert first == [
            (0, 1000, 0, 0, True), (1, 2000, 0, 0, True), (2, 2000, 0, 0, True),
            (3, 1000, 0, 0, False),
        ]  # fmt: skip
        # And one WARNING says how many partitions, and what to do
        warned = [r for r in caplog.records if r.name == "prq.spark" and r.levelname == "WARNING"]
        assert len(warned) == 1, warned
        assert "3 of 4 partitions (0, 1, 2)" in warned[0].getMessage()
        assert "with the same namespace" in warned[0].getMessage()

        # When the job runs again, plainly, with the same namespace
        caplog.clear()
        again = [tuple(r) for r in enqueue_dataframe(df, cfg).collect()]

        # Then it queues exactly the rows the flush took, counts the others as duplicates, and
        # sees no loss
        took = [sum(start <= n < end for n in held) for start, end in sizes]
        assert again == [
            (p, took[p], end - start - took[p], 0, False) for p, (start, end) in enumerate(sizes)
        ]
        # (which of partitions 0, 1 and 2 filled the queue first is Spark's scheduling: 2 may
        # start as 0 ends and write before 1 does; 3 began after the flush)
        assert (took[0] + took[1] + took[2], took[3]) == (2_000, 0)
        assert not [r for r in caplog.records if r.levelname == "WARNING"]
        # And every row ran once
        wait_until(lambda: len(ledger_lines(ledger)) >= 6_000, 60, 0.1, "every row ran")
        wait_until(lambda: queue_depth(own_redis_client, keys) == 0, 10, 0.05, "none queued")
        runs = Counter(int(line.rsplit(":", 1)[1]) for line in ledger_lines(ledger))
        assert runs == Counter(range(6_000))
    finally:
        runner.close()


def ledger_lines(ledger: Path) -> list[str]:
    return ledger.read_text().splitlines()


def test_call_and_collect_runs_each_request_once_despite_a_failed_task(
    spark: SparkSession, redis_url: str, key_prefix: str, receiver: tuple[Prq, Path]
) -> None:
    _, ledger = receiver
    # Given 20,000 rows in 2 partitions; partition 0's first attempt fails after half its
    # rows were sent
    cfg = config(
        redis_url,
        key_prefix,
        "poll://spark-call",
        fail_first_attempt_after=5_000,
        max_in_flight=2_000,
        poll_interval_s=0.02,
    )
    df = spark.range(0, 20_000, numPartitions=2).selectExpr("id AS key", "id AS n")
    group = f"call-{uuid.uuid4().hex[:6]}"
    spark.sparkContext.setJobGroup(group, "call and collect with a failed attempt")

    # When each row is called and the responses collected
    answers = call_dataframe(df, cfg)
    rows = answers.collect()

    # Then the injected failure happened
    assert failed_tasks(spark, group) == 1
    # And every row has exactly one answer: a result, or the handler's error
    by_id = {r.request_id: r for r in rows}
    assert len(rows) == len(by_id) == 20_000
    ok = by_id[f"{cfg.namespace}:12"]
    assert json.loads(ok.result_json) == {"n": 12, "squared": 144}
    assert (ok.error_type, ok.error_message) == (None, None)
    failed = by_id[f"{cfg.namespace}:14"]
    assert (failed.result_json, failed.error_type) == (None, "ValueError")
    assert failed.error_message == "14 is a multiple of 7"
    assert sum(r.error_type is not None for r in rows) == len(range(0, 20_000, 7))
    # And the receiver ran each request exactly once
    runs = Counter(ledger_lines(ledger))
    assert len(runs) == 20_000 and set(runs.values()) == {1}

    # When a second action runs on the same uncached DataFrame
    again = answers.where("error_type IS NULL").collect()

    # Then it is answered from the stored responses: nothing runs again on the service
    assert len(again) == 20_000 - len(range(0, 20_000, 7))
    assert {r.request_id: r.result_json for r in again} == {
        r.request_id: r.result_json for r in rows if r.error_type is None
    }
    assert len(ledger_lines(ledger)) == 20_000


@pytest.mark.parametrize("key_type", ["bigint", "string"])
def test_answers_carry_the_key_with_its_type_and_a_typed_result(
    spark: SparkSession,
    redis_url: str,
    key_prefix: str,
    receiver: tuple[Prq, Path],
    key_type: str,
) -> None:
    # Given rows keyed by a column of some type
    cfg = config(redis_url, key_prefix, "poll://spark-call", poll_interval_s=0.02)
    df = spark.range(0, 50, numPartitions=2).selectExpr(
        f"CAST(id AS {key_type}) AS key", "id AS n", "concat('row-', id) AS label"
    )

    # When they are called with a result schema
    answers = call_dataframe(df, cfg, result_schema="n long, squared long")

    # Then each answer carries its row's key, typed as the rows' (so it joins back to them),
    # and its result parsed; an error has no result
    assert answers.schema["key"].dataType == df.schema["key"].dataType
    joined = df.join(answers, "key").collect()
    assert len(joined) == 50
    for row in joined:
        assert row.request_id == f"{cfg.namespace}:{row.key}"
        if row.n % 7 == 0:
            assert (row.result, row.error_type, row.maybe_executed) == (None, "ValueError", True)
        else:
            assert (row.result.n, row.result.squared) == (row.n, row.n * row.n)


@pytest.mark.parametrize(
    ("asked", "kept_s"),
    [
        ({"response_ttl_s": 3 * 3600.0}, 3 * 3600.0),  # longer than the worker's 20 minutes
        ({"queue_settings": {"response_ttl_s": 30.0}}, 30.0),  # as the job's settings say
        ({}, 20 * 60.0),  # nothing asked: the worker's own
    ],
)
def test_the_job_sets_how_long_its_answers_are_kept(
    spark: SparkSession,
    redis_url: str,
    key_prefix: str,
    redis_client: redis.Redis,
    receiver: tuple[Prq, Path],
    asked: dict[str, Any],
    kept_s: float,
) -> None:
    # Given a job that asks its answers to be kept for some time, and a worker that keeps
    # answers 20 minutes of its own (the default)
    endpoint = "poll://spark-call"
    cfg = config(redis_url, key_prefix, endpoint, poll_interval_s=0.02, **asked)
    df = spark.range(0, 40, numPartitions=2).selectExpr("id AS key", "id AS n")

    # When its rows are called
    rows = call_dataframe(df, cfg).collect()

    # Then every answer is kept as long as the job asked (each record's TTL, set when the
    # worker answered it)
    assert len(rows) == 40 and sum(r.result_json is not None for r in rows) == 40 - 6
    keys = KeySchema(key_prefix).endpoint(endpoint)
    ttls = [redis_client.pttl(keys.request(r.request_id)) for r in rows]
    low = max(0.0, kept_s * 1000 - 60_000)
    assert all(low < ttl <= kept_s * 1000 for ttl in ttls), sorted(ttls)[:3]


def test_a_rerun_after_the_answers_expired_runs_nothing_twice(
    spark: SparkSession,
    redis_url: str,
    key_prefix: str,
    redis_client: redis.Redis,
    receiver: tuple[Prq, Path],
) -> None:
    _, ledger = receiver
    # Given a job whose 300 rows ran once each on a long-lived worker, their answers kept a
    # second only, and gone since (records and all)
    endpoint = "poll://spark-call"
    cfg = config(redis_url, key_prefix, endpoint, poll_interval_s=0.02, response_ttl_s=1.0)
    df = spark.range(0, 300, numPartitions=2).selectExpr("id AS key", "id AS n")
    first = call_dataframe(df, cfg).collect()
    assert len(first) == 300 and len(ledger_lines(ledger)) == 300
    keys = KeySchema(key_prefix).endpoint(endpoint)
    records = [keys.request(r.request_id) for r in first]
    wait_until(lambda: redis_client.exists(*records) == 0, 30, 0.1, "the answers expired")

    # When the job runs again with the same namespace, calling and enqueueing
    again = call_dataframe(df, cfg).collect()
    counts = totals([tuple(r) for r in enqueue_dataframe(df, cfg).collect()])

    # Then no row runs a second time: each is answered OutcomeExpired (it ran, or may have)
    # and counted as a duplicate
    assert len(again) == 300 and {r.error_type for r in again} == {"OutcomeExpired"}
    assert all("not sent again" in r.error_message for r in again)
    assert counts == (0, 300, 0)
    assert queue_depth(redis_client, keys) == 0
    runs = Counter(ledger_lines(ledger))
    assert len(runs) == 300 and set(runs.values()) == {1}

    # And a job without a dedup window runs them again (the records were its only guard),
    # with no false alarm of data loss on the worker that ran them before
    unguarded = call_dataframe(df, replace(cfg, dedup_ttl_s=None)).collect()
    assert sum(r.result_json is not None for r in unguarded) == 300 - len(range(0, 300, 7))
    assert {r.error_type for r in unguarded} == {None, "ValueError"}
    assert set(Counter(ledger_lines(ledger)).values()) == {2}


def test_requests_redis_lost_mid_call_say_so_and_a_repairing_rerun_sends_only_them(
    spark: SparkSession, own_redis: EmbeddedRedis, key_prefix: str, tmp_path: Path
) -> None:
    # Given a worker that holds rows 390-399 once it started them (until a gate opens), and a
    # job of 400 rows waiting on them
    endpoint, ledger, gate = "poll://spark-lost", tmp_path / "ledger.txt", tmp_path / "gate"
    ledger.touch()
    runner = PrqRunner(own_redis.url, key_prefix)
    cfg = config(own_redis.url, key_prefix, endpoint, poll_interval_s=0.02)
    df = spark.range(0, 400, numPartitions=2).selectExpr("id AS key", "id AS n")
    try:
        worker = runner.start(
            "worker", "tests.spark.ledger_handler:record_gated", "-e", endpoint,
            "--concurrency", "16", PRQ_TEST_LEDGER=str(ledger), PRQ_TEST_GATE=str(gate),
            PRQ_TEST_GATE_FROM="390", PRQ_DATA_LOSS_CHECK_INTERVAL_S="0.5",
        )  # fmt: skip
        worker.wait_for_line("prq worker: serving")
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(lambda: call_dataframe(df, cfg).collect())
            wait_until(lambda: len(ledger_lines(ledger)) == 400, 60, 0.05, "every row started")

            # When Redis restarts empty while they are held, and the worker then answers them
            own_redis.restart()
            gate.touch()
            first = running.result(timeout=120)

        # Then the rows whose requests Redis lost say DataLoss, maybe executed: never expired
        by_key = {int(r.request_id.rsplit(":", 1)[1]): r for r in first}
        assert len(first) == len(by_key) == 400
        lost = {k for k, r in by_key.items() if r.error_type == "DataLoss"}
        held = {k: (by_key[k].error_type, by_key[k].error_message) for k in range(390, 400)}
        assert set(range(390, 400)) <= lost, held
        assert all(by_key[k].maybe_executed for k in lost)
        assert {r.error_type for r in first} <= {None, "ValueError", "DataLoss"}

        # When the job runs again, with the same namespace, over the rows worth another try
        results = spark.createDataFrame(first, f"{CALL_RESULT_SCHEMA}, key bigint")
        retry = rows_to_retry(df, results, cfg)
        second = call_dataframe(retry, replace(cfg, retry_failed=True)).collect()
    finally:
        runner.close()

    # Then exactly those rows were sent again, and answered
    assert sorted(int(r.request_id.rsplit(":", 1)[1]) for r in second) == sorted(lost)
    assert {r.error_type for r in second} <= {None, "ValueError"}
    # And over both runs every row ran once, but for rows the first run marked maybe executed
    runs = Counter(int(line.rsplit(":", 1)[1]) for line in ledger_lines(ledger))
    assert set(runs) == set(range(400))
    twice = {k for k, count in runs.items() if count > 1}
    assert max(runs.values()) <= 2 and twice == lost


def test_a_key_that_comes_in_two_partitions_gets_one_answer_and_one_duplicate_key(
    spark: SparkSession, redis_url: str, key_prefix: str, receiver: tuple[Prq, Path]
) -> None:
    _, ledger = receiver
    # Given 200 rows in 4 partitions whose keys 0-99 each come twice, in two partitions, with
    # other params each time (key = id % 100, n = id)
    cfg = config(redis_url, key_prefix, "poll://spark-call", poll_interval_s=0.02)
    df = spark.range(0, 200, numPartitions=4).selectExpr("id % 100 AS key", "id AS n")

    # When they are called
    rows = call_dataframe(df, cfg).collect()

    # Then every row has one answer: for each key, one row's own (the handler ran it with its
    # own n), and a DuplicateKey for the other, whose request never ran
    assert len(rows) == 200
    by_key: dict[int, list[Any]] = {}
    for row in rows:
        by_key.setdefault(row.key, []).append(row)
    assert sorted(by_key) == list(range(100))
    ran = Counter(ledger_lines(ledger))
    assert len(ran) == 100 and set(ran.values()) == {1}
    for key, answers in by_key.items():
        kinds = sorted(str(a.error_type) for a in answers)
        assert len(answers) == 2 and "DuplicateKey" in kinds, (key, kinds)
        (own,) = [a for a in answers if a.error_type != "DuplicateKey"]
        (other,) = [a for a in answers if a.error_type == "DuplicateKey"]
        if own.error_type is None:
            n = json.loads(own.result_json)["n"]
        else:
            assert own.error_type == "ValueError"
            n = int(own.error_message.split()[0])
        assert n % 100 == key
        assert "other params" in other.error_message and not other.maybe_executed
    # (the n each key's request ran with: one of its two rows', each answered once)
    assert len({json.loads(a.result_json)["n"] for a in rows if a.result_json}) == sum(
        a.result_json is not None for a in rows
    )

    # When the job runs again with the same namespace over the same rows
    again = call_dataframe(df, cfg).collect()

    # Then the rows whose requests ran read their answers back, the others are DuplicateKey
    # again, and nothing runs a second time
    assert Counter(r.error_type == "DuplicateKey" for r in again) == {True: 100, False: 100}
    assert {(r.request_id, r.result_json, r.error_type) for r in again} == {
        (r.request_id, r.result_json, r.error_type) for r in rows
    }
    # And a rerun whose rows now carry other params gets DuplicateKey for every row: the
    # answers stored under those ids are not theirs
    changed = call_dataframe(df.selectExpr("key", "n + 1000 AS n"), cfg).collect()
    assert len(changed) == 200 and {r.error_type for r in changed} == {"DuplicateKey"}
    assert len(ledger_lines(ledger)) == 100


def test_a_rerun_whose_answers_expire_while_it_waits_says_outcome_expired(
    spark: SparkSession, redis_url: str, key_prefix: str, redis_client: redis.Redis,
    tmp_path: Path,
) -> None:  # fmt: skip
    # Given a worker that holds rows from n = 1000 on until a gate opens, and a job whose 100
    # rows (n < 1000) it answered, kept 5 s
    endpoint, ledger, gate = "poll://spark-straddle", tmp_path / "ledger.txt", tmp_path / "gate"
    ledger.touch()
    runner = PrqRunner(redis_url, key_prefix)
    cfg = config(
        redis_url, key_prefix, endpoint, poll_interval_s=0.02, response_ttl_s=5.0, batch_size=10
    )
    keys = KeySchema(key_prefix).endpoint(endpoint)
    try:
        worker = runner.start(
            "worker", "tests.spark.ledger_handler:record_gated", "-e", endpoint,
            "--concurrency", "16", PRQ_TEST_LEDGER=str(ledger), PRQ_TEST_GATE=str(gate),
            PRQ_TEST_GATE_FROM="1000",
        )  # fmt: skip
        worker.wait_for_line("prq worker: serving")
        df = spark.range(0, 100, numPartitions=1).selectExpr("id AS key", "id AS n")
        first = call_dataframe(df, cfg).collect()
        assert len(first) == 100 and {r.error_type for r in first} == {None, "ValueError"}
        records = [keys.request(r.request_id) for r in first]

        # When the job runs again at once, in one task, with 10 new rows first (held by the
        # worker: the task reads no younger outcome while its oldest ones are open), and the
        # answers of the 100 expire while it waits
        rerun = spark.range(0, 110, numPartitions=1).selectExpr(
            "IF(id < 10, id + 1000, id - 10) AS key", "IF(id < 10, id + 1000, id - 10) AS n"
        )
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(lambda: call_dataframe(rerun, cfg).collect())
            wait_until(lambda: len(ledger_lines(ledger)) == 110, 60, 0.02, "the new rows started")
            # (it sends them right after the new rows, while their answers are still kept:
            # known, not gone)
            assert min(redis_client.pttl(record) for record in records) > 1_000
            wait_until(lambda: redis_client.exists(*records) == 0, 30, 0.05, "answers expired")
            gate.touch()
            again = running.result(timeout=120)
    finally:
        runner.close()

    # Then the 100, which ran in the first run, are answered OutcomeExpired (as the ledger
    # knows: not worth another try), never RequestExpired, and ran once; the new rows ran
    by_key = {r.key: r for r in again}
    assert len(again) == len(by_key) == 110
    assert {by_key[k].error_type for k in range(100)} == {"OutcomeExpired"}
    assert all(by_key[k].maybe_executed for k in range(100))
    assert all(json.loads(by_key[k].result_json)["n"] == k for k in range(1000, 1010))
    assert not rows_to_retry(
        rerun, spark.createDataFrame(again, f"{CALL_RESULT_SCHEMA}, key bigint"), cfg
    ).count()
    runs = Counter(ledger_lines(ledger))
    assert len(runs) == 110 and set(runs.values()) == {1}


#: Receiver timeout of the delivery test (and the heartbeat that keeps live receivers in it).
FAST_LOSS = {
    "receiver_timeout_s": 2.0,
    "heartbeat_interval_s": 0.3,
    "heartbeat_initial_delay_s": 0.3,
}


@pytest.mark.parametrize("delivery", ["at_most_once", "at_least_once"])
def test_call_with_at_least_once_outlives_a_receiver_killed_mid_job(
    spark: SparkSession, redis_url: str, key_prefix: str, tmp_path: Path, delivery: str
) -> None:
    # Given two workers on one endpoint; the one that gets row n=300 kills itself (SIGKILL)
    # while it holds that row and up to 15 others
    endpoint, ledger = "poll://spark-delivery", tmp_path / "ledger.txt"
    ledger.touch()
    runner = PrqRunner(redis_url, key_prefix)
    env = {f"PRQ_{name.upper()}": str(value) for name, value in FAST_LOSS.items()} | {
        "PRQ_TEST_LEDGER": str(ledger),
        "PRQ_TEST_DIE_AT": "300",
        "PRQ_TEST_DIE_MARKER": str(tmp_path / "died"),
    }
    try:
        workers = [
            runner.start(
                "worker", "tests.spark.ledger_handler:record_or_die", "-e", endpoint,
                "--concurrency", "16", **env,
            )
            for _ in range(2)
        ]  # fmt: skip
        for worker in workers:
            worker.wait_for_line("prq worker: serving")
        cfg = config(
            redis_url,
            key_prefix,
            endpoint,
            delivery=delivery,
            poll_interval_s=0.05,
            queue_settings=FAST_LOSS,
        )
        df = spark.range(0, 2_000, numPartitions=2).selectExpr("id AS key", "id AS n")

        # When every row is called and the answers collected
        rows = call_dataframe(df, cfg).collect()
    finally:
        runner.close()

    # Then one worker died, holding requests it had started
    assert (tmp_path / "died").exists()
    runs = Counter(ledger_lines(ledger))
    by_id = {r.request_id: r for r in rows}
    assert len(rows) == len(by_id) == 2_000
    lost = {rid for rid, r in by_id.items() if r.error_type == "ReceiverLost"}
    rerun = {rid for rid, n in runs.items() if n > 1}
    assert f"{cfg.namespace}:300" in lost | rerun
    if delivery == "at_most_once":
        # And at_most_once: what it held ends as ReceiverLost, and nothing runs twice
        assert lost and rerun == set()
        assert set(runs) <= set(by_id)  # (some it had taken never started)
    else:
        # And at_least_once: what it held ran again on the other worker, and every row has
        # its answer: a result, or the handler's own error (multiples of 7)
        assert lost == set()
        assert rerun and max(runs.values()) == 2
        assert {r.error_type for r in rows} == {None, "ValueError"}
        answer = by_id[f"{cfg.namespace}:300"].result_json
        assert json.loads(answer) == {"n": 300, "squared": 90_000}
        assert set(runs) == set(by_id)


#: The signing key of the signed call test (prq.protocol.signing).
SIGNING_KEY = "spark-signing-key-" + "s" * 20


def test_a_signed_job_is_answered_by_a_worker_with_the_key(
    spark: SparkSession, redis_url: str, key_prefix: str, redis_client: redis.Redis
) -> None:
    # Given a worker that requires signatures, and a job with the same key
    endpoint = "poll://spark-signed"
    runner = PrqRunner(redis_url, key_prefix)
    try:
        worker = runner.start(
            "worker", "tests.spark.ledger_handler:record", "-e", endpoint,
            PRQ_SIGNING_KEY=SIGNING_KEY, PRQ_TEST_LEDGER="/dev/null",
        )  # fmt: skip
        worker.wait_for_line("prq worker: serving")
        cfg = config(redis_url, key_prefix, endpoint,
                     queue_settings={"signing_key": SIGNING_KEY})  # fmt: skip
        df = spark.range(0, 500, numPartitions=2).selectExpr("id AS key", "id AS n")

        # When its rows are called and the answers collected
        rows = call_dataframe(df, cfg).collect()
    finally:
        runner.close()

    # Then every row was answered (the worker accepted the signed bodies, and the job the
    # signed answers), and Redis holds both in envelopes
    by_id = {r.request_id: r for r in rows}
    assert len(by_id) == 500
    assert {r.error_type for r in rows} == {None, "ValueError"}
    assert json.loads(by_id[f"{cfg.namespace}:12"].result_json) == {"n": 12, "squared": 144}
    stored = redis_client.hget(
        KeySchema(key_prefix).endpoint(endpoint).request(f"{cfg.namespace}:12"), "rsp"
    )
    assert isinstance(stored, bytes) and stored.startswith(ENVELOPE_MAGIC)


def test_large_bodies_go_beside_redis_both_ways_for_a_job(
    spark: SparkSession, redis_url: str, key_prefix: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    # Given a worker and a job sharing a DataStream directory, with a 1 KiB inline limit, and
    # rows whose request and answer bodies are over it
    endpoint = "poll://spark-large"
    shared = tmp_path / "bodies"
    limit = {"PRQ_INLINE_LIMIT_BYTES": "1024", "PRQ_DATASTREAMS_DIR": str(shared)}
    runner = PrqRunner(redis_url, key_prefix)
    try:
        worker = runner.start(
            "worker", "tests.spark.ledger_handler:echo_large", "-e", endpoint,
            PRQ_TEST_LEDGER="/dev/null", **limit,
        )  # fmt: skip
        worker.wait_for_line("prq worker: serving")
        cfg = config(redis_url, key_prefix, endpoint, datastreams_dir=str(shared),
                     queue_settings={"inline_limit_bytes": 1024})  # fmt: skip
        df = spark.range(0, 40, numPartitions=2).selectExpr(
            "id AS key", "id AS n", "repeat(cast(id AS string), 3000) AS text"
        )

        # When its rows are called and the answers collected
        rows = call_dataframe(df, cfg).collect()
    finally:
        runner.close()

    # Then every answer came back whole
    by_id = {r.request_id: r for r in rows}
    assert len(by_id) == 40
    answer = json.loads(by_id[f"{cfg.namespace}:12"].result_json)
    assert answer == {"answer": {"n": 12, "squared": 144}, "text": "12" * 6000}
    assert by_id[f"{cfg.namespace}:14"].error_type == "ValueError"
    # And Redis kept markers, not bodies: the answers' bodies stay beside Redis for the
    # response TTL, the requests' were deleted once answered
    stored = redis_client.hget(
        KeySchema(key_prefix).endpoint(endpoint).request(f"{cfg.namespace}:12"), "rsp"
    )
    assert isinstance(stored, bytes) and stored.startswith(MARKER)
    files = [name for name in os.listdir(shared) if not name.startswith(".")]
    assert len(files) == 40 - 6  # (the 6 multiples of 7 answered with a small error)


def test_call_answers_invalid_keys_and_unanswered_requests_with_errors(
    spark: SparkSession, redis_url: str, key_prefix: str
) -> None:
    # Given rows for an endpoint nobody serves, a call timeout of 1 s, and a bad key
    cfg = config(redis_url, key_prefix, "poll://spark-nobody", call_timeout_s=1.0)
    df = spark.createDataFrame([("a", 1), ("b", 2), ("bad key", 3)], "key string, n long")

    # When they are called
    rows = {r.request_id: r for r in call_dataframe(df, cfg).collect()}

    # Then the bad key is rejected, and the others end with CallTimeout: sent, maybe run
    assert len(rows) == 3
    assert rows[f"{cfg.namespace}:bad key"].error_type == "InvalidRequestId"
    assert {rows[f"{cfg.namespace}:{k}"].error_type for k in "ab"} == {"CallTimeout"}
    assert all("may still run" in rows[f"{cfg.namespace}:{k}"].error_message for k in "ab")


def test_the_call_timeout_counts_for_each_request_from_its_sending(
    spark: SparkSession, redis_url: str, key_prefix: str, redis_client: redis.Redis
) -> None:
    # Given 300 rows in one partition for an endpoint nobody serves, a window of 100, and a
    # call timeout of 0.5 s: the task outlives it several times over
    endpoint = "poll://spark-per-request"
    cfg = config(
        redis_url, key_prefix, endpoint, max_in_flight=100, batch_size=50, call_timeout_s=0.5
    )
    df = spark.range(0, 300, numPartitions=1).selectExpr("id AS key", "id AS n")

    # When they are called
    rows = call_dataframe(df, cfg).collect()

    # Then every row was sent, once its place in the window came, and timed out on its own
    # clock: each a CallTimeout that says it may still run, none reported as never sent
    assert queue_depth(redis_client, KeySchema(key_prefix).endpoint(endpoint)) == 300
    assert len(rows) == 300 and {r.error_type for r in rows} == {"CallTimeout"}
    assert all("may still run" in r.error_message for r in rows)


# -- the prq data source --------------------------------------------------------------------------


def source_options(cfg: SparkQueueConfig) -> dict[str, str]:
    return {
        "url": cfg.url, "prefix": cfg.prefix, "endpoint": cfg.endpoint, "method": cfg.method,
        "namespace": cfg.namespace, "key_column": cfg.key_column, "pickup_timeout_s": "300",
    }  # fmt: skip


def test_df_write_format_prq_enqueues_every_row_once_despite_a_failed_task(
    spark: SparkSession,
    redis_url: str,
    key_prefix: str,
    redis_client: redis.Redis,
) -> None:
    pytest.importorskip("pyspark.sql.datasource")
    # Given the data source, and 10,000 rows whose first task fails halfway
    register_data_source(spark)
    cfg = config(redis_url, key_prefix, "poll://spark-source")
    df = spark.range(0, 10_000, numPartitions=2).selectExpr("id AS key", "id AS n")
    group = f"source-{uuid.uuid4().hex[:6]}"
    spark.sparkContext.setJobGroup(group, "a data source write with a failed attempt")

    # When the rows are written to it, twice (a rerun)
    options = source_options(cfg)
    write = df.write.format("prq").mode("append")
    write.options(**options, fail_first_attempt_after="2000").save()
    df.write.format("prq").mode("append").options(**options).save()

    # Then the failure happened, and every row is queued once
    assert failed_tasks(spark, group) == 1
    keys = KeySchema(key_prefix).endpoint(cfg.endpoint)
    assert queue_depth(redis_client, keys) == 10_000
    assert len(set(queued_ids(redis_client, keys))) == 10_000
    assert int(redis_client.get(keys.sequence) or 0) == 10_000  # (none enqueued twice)
    # And what the options ask for is in the requests
    assert stored_request(redis_client, keys, cfg.endpoint, f"{cfg.namespace}:7").params == {"n": 7}


def test_the_prq_data_source_refuses_bad_options_before_any_task(
    spark: SparkSession, redis_url: str, key_prefix: str, redis_client: redis.Redis
) -> None:
    pytest.importorskip("pyspark.sql.datasource")
    register_data_source(spark)
    options = source_options(config(redis_url, key_prefix, "poll://spark-source-bad"))
    df = spark.range(0, 10).selectExpr("id AS key")
    for extra, message in [
        ({"no_such": "1"}, "no such option 'no_such'"),
        ({"batch_size": "many"}, "option batch_size='many'"),
        ({"key_column": "absent"}, "key_column 'absent' is not a column"),
        ({"queue_settings": '{"retry_budget_s": -1}'}, "queue_settings: retry_budget_s"),
    ]:
        with pytest.raises(Exception, match=re.escape(message)):
            df.write.format("prq").mode("append").options(**(options | extra)).save()
    assert not scan_keys(redis_client, f"{key_prefix}:{{poll%3A%2F%2Fspark-source-bad}}")


def test_a_stream_written_to_the_prq_data_source_enqueues_each_row_once(
    spark: SparkSession, redis_url: str, key_prefix: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    pytest.importorskip("pyspark.sql.datasource")
    register_data_source(spark)
    cfg = config(redis_url, key_prefix, "poll://spark-source-stream")
    source = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", 300)
        .option("numPartitions", 2)
        .load()
        .selectExpr("value AS key", "value AS n")
    )
    query = (
        source.writeStream.format("prq")
        .options(**source_options(cfg))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="1 hour")
        .start()
    )
    try:
        keys = KeySchema(key_prefix).endpoint(cfg.endpoint)
        commit = tmp_path / "checkpoint" / "commits" / "0"
        wait_until(commit.exists, 60, 0.05, "the first micro-batch committed")
    finally:
        query.stop()
    assert queue_depth(redis_client, keys) == 300
    assert len(set(queued_ids(redis_client, keys))) == 300


# -- streaming ------------------------------------------------------------------------------------


def replay_the_second_batch(
    spark: SparkSession,
    tmp_path: Path,
    rows_per_batch: int,
    sink: Callable[[DataFrame, int], None],
    done: list[tuple[int, Any]],
) -> None:
    """Run a streaming query from a deterministic source (rate-micro-batch, 2 partitions, keys
    and n = the row's value) through foreachBatch(sink), which appends (batch id, ...) to
    `done`: micro-batches 0 and 1, one per start (the next trigger is an hour away, so a stop
    never cuts one); then lose batch 1's commit and start again, so that it is replayed."""
    checkpoint = tmp_path / "checkpoint"
    commits = checkpoint / "commits"

    def run_one_batch() -> int:
        source = (
            spark.readStream.format("rate-micro-batch")
            .option("rowsPerBatch", rows_per_batch)
            .option("numPartitions", 2)
            .load()
            .selectExpr("value AS key", "value AS n")
        )
        runs = len(done)
        query = (
            source.writeStream.foreachBatch(sink)
            .trigger(processingTime="1 hour")
            .option("checkpointLocation", str(checkpoint))
            .start()
        )
        try:
            wait_until(lambda: len(done) > runs, 60, 0.02, "a micro-batch written")
            batch_id = int(done[-1][0])
            wait_until(lambda: (commits / str(batch_id)).exists(), 30, 0.02, "its commit")
        finally:
            query.stop()
        return batch_id

    assert [run_one_batch(), run_one_batch()] == [0, 1]
    (commits / "1").unlink()
    (commits / ".1.crc").unlink(missing_ok=True)
    assert run_one_batch() == 1


def test_a_replayed_micro_batch_enqueues_nothing_twice(
    spark: SparkSession, redis_url: str, key_prefix: str, redis_client: redis.Redis
) -> None:
    # Given the foreachBatch function, and a micro-batch of 3,000 rows
    endpoint = "poll://spark-stream"
    cfg = config(redis_url, key_prefix, endpoint)
    write = foreach_batch(cfg)
    batch = spark.range(0, 3_000, numPartitions=2).selectExpr("id AS key", "id AS n")

    # When the batch is written, then written again with the same batch id (a replay)
    first = write(batch, 7)
    replay = write(batch, 7)

    # Then the replay enqueued nothing
    assert sum(c.accepted for c in first) == 3_000
    assert (sum(c.accepted for c in replay), sum(c.duplicate for c in replay)) == (0, 3_000)
    assert queue_depth(redis_client, KeySchema(key_prefix).endpoint(endpoint)) == 3_000


def test_a_streaming_query_restarted_after_losing_a_commit_enqueues_nothing_twice(
    spark: SparkSession, redis_url: str, key_prefix: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    # Given a streaming query from a deterministic source, writing through foreach_batch
    endpoint = "poll://spark-replay"
    cfg = config(redis_url, key_prefix, endpoint)
    write = foreach_batch(cfg)
    seen: list[tuple[int, list[PartitionCounts]]] = []

    def sink(df: DataFrame, batch_id: int) -> None:
        seen.append((batch_id, write(df, batch_id)))

    # When two micro-batches ran, the last one's commit is lost, and the query restarts
    replay_the_second_batch(spark, tmp_path, 500, sink, seen)

    # Then the last batch is replayed with the same rows, and enqueues nothing
    first, again = (counts for batch_id, counts in seen if batch_id == 1)
    assert (sum(c.accepted for c in first), sum(c.duplicate for c in first)) == (500, 0)
    assert (sum(c.accepted for c in again), sum(c.duplicate for c in again)) == (0, 500)
    # And Redis holds each row's request once
    keys = KeySchema(key_prefix).endpoint(endpoint)
    assert queue_depth(redis_client, keys) == 1_000
    assert len(set(queued_ids(redis_client, keys))) == 1_000


def test_a_streaming_call_and_collect_replayed_after_a_lost_commit_runs_nothing_twice(
    spark: SparkSession,
    redis_url: str,
    key_prefix: str,
    receiver: tuple[Prq, Path],
    tmp_path: Path,
) -> None:
    _, ledger = receiver
    # Given a streaming query that calls each micro-batch (call_batches) and keeps the answers
    # by batch id
    cfg = config(redis_url, key_prefix, "poll://spark-call", poll_interval_s=0.02)
    written: list[tuple[int, list[Any]]] = []

    def keep(answers: DataFrame, batch_id: int) -> None:
        written.append((batch_id, sorted(answers.collect())))

    call = call_batches(cfg, keep, result_schema="n long, squared long")
    # When two micro-batches ran, the last one's commit is lost, and the query restarts
    replay_the_second_batch(spark, tmp_path, 100, call, written)

    # Then the replayed batch got the same answers, read back: every row ran once
    first, again = (rows for batch_id, rows in written if batch_id == 1)
    assert first == again and len(first) == 100
    assert all(r.result.squared == r.key * r.key for r in first if r.error_type is None)
    runs = Counter(ledger_lines(ledger))
    assert len(runs) == 200 and set(runs.values()) == {1}


def test_a_task_never_has_more_than_max_in_flight_requests_unanswered(
    spark: SparkSession, redis_url: str, key_prefix: str, redis_client: redis.Redis
) -> None:
    # Given 500 rows in one partition for an endpoint nobody serves, a window of 100, and a
    # task bound of 1 s (each call's own timeout is far longer)
    endpoint = "poll://spark-window"
    cfg = config(
        redis_url, key_prefix, endpoint, max_in_flight=100, batch_size=50, call_timeout_s=60,
        task_timeout_s=1.0,
    )  # fmt: skip
    df = spark.range(0, 500, numPartitions=1).selectExpr("id AS key", "id AS n")

    # When they are called
    rows = call_dataframe(df, cfg).collect()

    # Then only the first 100 were sent; the task waited for outcomes before sending more, and
    # past its bound answered the 100 in flight with CallTimeout (they may still run) and the
    # 400 it never sent with NotSent (they never ran)
    assert queue_depth(redis_client, KeySchema(key_prefix).endpoint(endpoint)) == 100
    kinds = Counter(r.error_type for r in rows)
    assert len(rows) == 500 and kinds == {"CallTimeout": 100, "NotSent": 400}
    assert all("may still run" in r.error_message for r in rows if r.error_type == "CallTimeout")
    assert all("never ran" in r.error_message for r in rows if r.error_type == "NotSent")


# -- without the scheduler: concurrent attempts, a full Redis -----------------------------------


def arrow_batches(n: int, size: int) -> list[Any]:
    import pyarrow as pa

    return [
        pa.RecordBatch.from_pydict({"key": list(range(i, min(i + size, n))), "n": [0] * size})
        for i in range(0, n, size)
    ]


def test_two_concurrent_attempts_of_a_task_enqueue_each_row_once(
    redis_url: str, key_prefix: str, redis_client: redis.Redis
) -> None:
    pytest.importorskip("pyarrow")
    # Given one partition's enqueue function, run twice at once (as a speculative copy would)
    endpoint = "poll://spark-speculative"
    enqueue = arrow_enqueuer(config(redis_url, key_prefix, endpoint, batch_size=100))
    batches = arrow_batches(5_000, 500)
    with ThreadPoolExecutor(2) as pool:
        outputs = list(pool.map(lambda _: list(enqueue(iter(batches))), range(2)))

    # Then every row is queued once, and each attempt counts all its rows as accepted
    assert queue_depth(redis_client, KeySchema(key_prefix).endpoint(endpoint)) == 5_000
    for output in outputs:
        stats = output[0].to_pylist()[0]
        assert (stats["accepted"], stats["duplicate"], stats["rejected"]) == (5_000, 0, 0)


def test_a_task_keeps_no_memory_per_row_it_sent(
    redis_url: str, key_prefix: str, redis_client: redis.Redis
) -> None:
    pytest.importorskip("pyarrow")
    # Given one partition's enqueue function, and partitions of 20,000 and 120,000 rows
    endpoint = "poll://spark-memory"
    cfg = config(redis_url, key_prefix, endpoint, max_queued=None)

    def peak(n: int) -> int:
        """The most memory Python held while the task enqueued n rows (beyond the rows)."""
        batches = arrow_batches(n, 2_000)
        enqueue = arrow_enqueuer(replace(cfg, namespace=f"memory-{n}"))
        tracemalloc.start()
        try:
            output = list(enqueue(iter(batches)))
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
            assert output[0].to_pylist()[0]["accepted"] == n

    # When each is enqueued (after a first small one: the process's client, its scripts and
    # the encoders are made once)
    peak(2_000)
    small, large = peak(20_000), peak(120_000)

    # Then six times the rows take about the same memory: nothing is kept per row sent (a set
    # of the ids would hold 100,000 more, over 10 MB)
    print(f"peak traced memory: {small / 1e6:.1f} MB (20k rows), {large / 1e6:.1f} MB (120k)")
    assert large - small < 3_000_000
    assert queue_depth(redis_client, KeySchema(key_prefix).endpoint(endpoint)) == 142_000


def test_a_key_that_comes_again_later_in_the_task_is_a_duplicate(
    redis_url: str, key_prefix: str, redis_client: redis.Redis
) -> None:
    pytest.importorskip("pyarrow")
    import pyarrow as pa

    # Given a partition whose keys 500-999 come twice, a batch apart, and 1,000-1,009 twice in
    # one batch
    endpoint = "poll://spark-repeated"
    enqueue = arrow_enqueuer(config(redis_url, key_prefix, endpoint, batch_size=1_000))
    keys = [list(range(0, 1_000)), list(range(500, 1_000)) + list(range(1_000, 1_010)) * 2]
    batches = [pa.RecordBatch.from_pydict({"key": k, "n": [0] * len(k)}) for k in keys]

    # When it is enqueued
    stats = next(iter(enqueue(iter(batches)))).to_pylist()[0]

    # Then each key is queued once and every repeat is counted as a duplicate, not accepted
    assert (stats["accepted"], stats["duplicate"], stats["rejected"]) == (1_010, 510, 0)
    assert queue_depth(redis_client, KeySchema(key_prefix).endpoint(endpoint)) == 1_010


def test_a_full_redis_is_waited_out_not_dropped(
    own_redis: EmbeddedRedis, own_redis_client: redis.Redis, key_prefix: str
) -> None:
    pytest.importorskip("pyarrow")
    # Given a Redis that refuses writes (maxmemory reached)
    endpoint = "poll://spark-full"
    cfg = config(own_redis.url, key_prefix, endpoint, queue_settings={"retry_budget_s": 0.2})
    own_redis_client.config_set("maxmemory", 1)
    enqueue = arrow_enqueuer(cfg)
    with ThreadPoolExecutor(1) as pool:
        # When a task enqueues into it
        future = pool.submit(lambda: list(enqueue(iter(arrow_batches(2_000, 500)))))
        wait_until(
            lambda: own_redis_client.info("errorstats").get("errorstat_OOM"),
            15,
            0.02,
            "Redis refused a write for lack of memory",
        )
        assert not future.done()
        # Then it backs off and retries until Redis has room again, and loses nothing
        own_redis_client.config_set("maxmemory", 0)
        output = future.result(timeout=30)
    assert output[0].to_pylist()[0]["accepted"] == 2_000
    assert queue_depth(own_redis_client, KeySchema(key_prefix).endpoint(endpoint)) == 2_000


def test_an_endpoint_at_max_pending_is_waited_out_with_exact_counts(
    redis_url: str, key_prefix: str, redis_client: redis.Redis
) -> None:
    pytest.importorskip("pyarrow")
    # Given an endpoint that may hold 700 queued requests
    endpoint = "poll://spark-limited"
    cfg = config(redis_url, key_prefix, endpoint)
    keys = KeySchema(key_prefix).endpoint(endpoint)
    redis_client.hset(keys.limits, "mp", 700)
    enqueue = arrow_enqueuer(cfg)
    with ThreadPoolExecutor(1) as pool:
        # When a task enqueues 2,000 rows (batches of 1,000: the first one only partly fits)
        future = pool.submit(lambda: list(enqueue(iter(arrow_batches(2_000, 500)))))
        wait_until(lambda: queue_depth(redis_client, keys) == 700, 15, 0.02, "the limit reached")
        assert not future.done()
        # Then it backs off until there is room, and its counts are exact (a partly written
        # batch sent again counts its own requests once)
        redis_client.hdel(keys.limits, "mp")
        output = future.result(timeout=30)
    assert output[0].to_pylist()[0] == {"partition": 0, "accepted": 2_000, "duplicate": 0,
                                        "rejected": 0, "data_loss": False}  # fmt: skip
    assert queue_depth(redis_client, keys) == 2_000
