"""Spark benchmark: rows/s of bulk enqueue and call-and-collect against a plain RPUSH baseline.

In one run, on one Redis and one local Spark (`local[2]`), for the same DataFrame of ROWS rows:

  (a) raw-rpush        foreachPartition, one variadic RPUSH of 1,000 JSON rows per round trip,
                       no dedup (what a hand-written sink does)
  (k) keyed-set        foreachPartition, one key per row: SET <key> <row> PX <ttl> NX, 1,000
                       per pipelined round trip (the floor of a sink that keeps each row under
                       its own key with a TTL, written once per id, as prq does)
  (s) scripted-set     the same SETs from one Lua script per 1,000 rows (the floor of such a
                       sink that checks and writes a batch atomically, as prq does)
  (b) prq-enqueue-arrow  prq.spark.enqueue_dataframe (mapInArrow, exact counts), idempotent
                       by id: the recommended bulk enqueue, judged against the 0.8x target
  (b') prq-enqueue-rows   prq.spark.enqueue_partitions (foreachPartition, fire and forget)
  (c) prq-call         prq.spark.call_dataframe against an echo receiver (`prq worker`)

Each variant runs once to warm the JVM and the Python workers. Then (a), (k), (s), (b) and (b')
are measured in --repeats rounds (default 3; each round on an emptied Redis), and the table
shows the round whose (b) ratio is the median, with every round's ratio below it, and (b)
against the two floors (k) and (s) in that round; (c) is measured once. Ratios
are to (a) of the same round. Redis's own CPU time (INFO cpu) is reported per variant, and
Spark's: the CPU time of this process and its descendants (the JVM, its Python workers, the echo
worker; an embedded redis-server left out). On a small machine the job is bound by the CPU they
all share, so the two columns together say where a variant's time goes. Uses PRQ_REDIS_URL when
set, else an embedded redis-server.

    python bench/spark.py [--rows 200000] [--call-rows 20000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import redis

from prq.embedded import redis_url_or_embedded

ROOT = Path(__file__).resolve().parent.parent
#: Rows per RPUSH of the baseline (the batch prq uses too).
BATCH = 1000
#: Receiver slots of the echo worker.
WORKER_CONCURRENCY = 32

_clients: dict[tuple[str, int], redis.Redis] = {}
#: (variant, rows, wall seconds, Redis CPU seconds, Spark's CPU seconds) of one measured run.
Result = tuple[str, int, float, float, float]


def tree_cpu_s() -> float:
    """CPU seconds of this process and its descendants alive now: the driver, Spark's JVM and
    its Python workers (kept between tasks, so their time accumulates), and the echo worker;
    not an embedded redis-server (Redis's CPU is its own column)."""
    me = psutil.Process()
    total = 0.0
    for process in [me, *me.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):  # a process that ended meanwhile
            if process.name().startswith("redis-server"):
                continue
            times = process.cpu_times()
            total += times.user + times.system
    return total


def echo(request: Any) -> Any:
    """The receiver's handler for the call variant."""
    return request.params


def _raw_push(url: str, key: str) -> Callable[[Iterator[Any]], None]:
    def push(rows: Iterator[Any]) -> None:
        client = _clients.get((url, os.getpid()))
        if client is None:
            client = _clients.setdefault((url, os.getpid()), redis.Redis.from_url(url))
        batch: list[str] = []
        for row in rows:
            batch.append(json.dumps(row.asDict()))
            if len(batch) == BATCH:
                client.rpush(key, *batch)
                batch.clear()
        if batch:
            client.rpush(key, *batch)

    return push


#: The floor sinks' script: SET PX NX for each (key, row) pair of its arguments.
FLOOR_SCRIPT = """
local ttl = ARGV[1]
for i = 2, #ARGV, 2 do redis.call('SET', ARGV[i], ARGV[i + 1], 'PX', ttl, 'NX') end
return 0
"""
#: The floor sinks' key TTL (prq's default list TTL: a day).
FLOOR_TTL_MS = 86_400_000


def _keyed_set(url: str, prefix: str, scripted: bool) -> Callable[[Iterator[Any]], None]:
    """A sink that writes each row under its own key (`prefix` and the row's order_id) with a
    TTL, once per key: 1,000 pipelined SETs per round trip, or one script per 1,000."""

    def write(rows: Iterator[Any]) -> None:
        client = _clients.get((url, os.getpid()))
        if client is None:
            client = _clients.setdefault((url, os.getpid()), redis.Redis.from_url(url))
        script = client.register_script(FLOOR_SCRIPT)
        pairs: list[str] = []

        def flush() -> None:
            if scripted:
                script(args=[FLOOR_TTL_MS, *pairs])
            else:
                pipe = client.pipeline(transaction=False)
                for i in range(0, len(pairs), 2):
                    pipe.set(pairs[i], pairs[i + 1], px=FLOOR_TTL_MS, nx=True)
                pipe.execute()
            pairs.clear()

        for row in rows:
            pairs += [f"{prefix}:{row.order_id}", json.dumps(row.asDict())]
            if len(pairs) == 2 * BATCH:
                flush()
        if pairs:
            flush()

    return write


def _start_worker(url: str, prefix: str, endpoint: str) -> subprocess.Popen[str]:
    env = os.environ | {"PRQ_REDIS_URL": url, "PRQ_PREFIX": prefix}
    worker = subprocess.Popen(
        [sys.executable, "-m", "prq.cli", "worker", "bench.spark:echo", "-e", endpoint,
         "-c", str(WORKER_CONCURRENCY)],
        cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert worker.stderr is not None
    deadline = time.monotonic() + 60
    for line in worker.stderr:  # bounded by the worker's own start-up, checked below
        if "prq worker: serving" in line:
            return worker
        if time.monotonic() > deadline:
            break
    worker.kill()
    raise RuntimeError("the echo worker did not start")


def run(url: str, rows: int, call_rows: int, repeats: int) -> tuple[list[list[Result]], Result]:
    """The enqueue rounds ((a), (b), (b') each), and the call variant's result."""
    from pyspark.sql import SparkSession

    from prq.spark import SparkQueueConfig, call_dataframe, enqueue_dataframe, enqueue_partitions

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    sys.path.insert(0, str(ROOT))
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("prq-bench-spark")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    prefix = f"prq-bench-{uuid.uuid4().hex[:6]}"
    df = (
        spark.range(0, rows, numPartitions=4)
        .selectExpr("id AS order_id", "id % 100 AS customer", "round(rand(7) * 100, 2) AS amount")
        .cache()
    )
    df.count()

    def config(tag: str, endpoint: str) -> SparkQueueConfig:
        return SparkQueueConfig(
            url=url, prefix=prefix, endpoint=endpoint, method="echo",
            namespace=f"{tag}-{uuid.uuid4().hex[:6]}", key_column="order_id",
        )  # fmt: skip

    monitor = redis.Redis.from_url(url)

    def redis_cpu_s() -> float:
        info = monitor.info("cpu")
        return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])

    def measure(name: str, n: int, action: Callable[[str], object], tag: str) -> Result:
        cpu, spark_cpu, started = redis_cpu_s(), tree_cpu_s(), time.perf_counter()
        action(tag)
        wall = time.perf_counter() - started
        return (name, n, wall, redis_cpu_s() - cpu, tree_cpu_s() - spark_cpu)

    enqueues: list[tuple[str, Callable[[str], object]]] = [
        ("raw-rpush", lambda tag: df.foreachPartition(_raw_push(url, f"{prefix}:raw:{tag}"))),
        ("keyed-set",
         lambda tag: df.foreachPartition(_keyed_set(url, f"{prefix}:kv:{tag}", scripted=False))),
        ("scripted-set",
         lambda tag: df.foreachPartition(_keyed_set(url, f"{prefix}:ks:{tag}", scripted=True))),
        ("prq-enqueue-arrow",
         lambda tag: enqueue_dataframe(df, config(tag, "poll://bench-b")).collect()),
        ("prq-enqueue-rows",
         lambda tag: df.foreachPartition(enqueue_partitions(config(tag, "poll://bench-a")))),
    ]  # fmt: skip
    for _, action in enqueues:
        action("warm")
    _clean_up(url, prefix)
    rounds: list[list[Result]] = []
    for r in range(repeats):
        rounds.append([measure(name, rows, action, f"r{r}") for name, action in enqueues])
        _clean_up(url, prefix)  # each round starts on an empty Redis
    worker = _start_worker(url, prefix, "poll://bench-echo")
    try:
        small = df.limit(call_rows).repartition(4).cache()
        called_rows = small.count()  # the DataFrame has only `rows` rows

        def call(tag: str) -> object:
            return call_dataframe(small, config(tag, "poll://bench-echo")).count()

        call("warm")
        called = measure("prq-call", called_rows, call, "measured")
    finally:
        worker.terminate()
        worker.wait(30)
    monitor.close()
    _clean_up(url, prefix)
    spark.stop()
    return rounds, called


def _clean_up(url: str, prefix: str) -> None:
    """Remove the run's keys (a shared Redis; an embedded one is thrown away anyway)."""
    client = redis.Redis.from_url(url)
    batch: list[bytes] = []
    for key in client.scan_iter(f"{prefix}:*", count=10_000):
        batch.append(key)
        if len(batch) == 10_000:
            client.unlink(*batch)
            batch.clear()
    if batch:
        client.unlink(*batch)
    client.close()


def table(results: list[Result]) -> str:
    base = results[0][1] / results[0][2]
    lines = [
        "| variant | rows | seconds | rows/s | vs raw-rpush | Redis CPU s | Redis CPU µs/row "
        "| Spark CPU s | Spark CPU µs/row |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, n, seconds, cpu, spark_cpu in results:
        rate = n / seconds
        lines.append(
            f"| {name} | {n:,} | {seconds:.2f} | {rate:,.0f} | {rate / base:.2f}x "
            f"| {cpu:.2f} | {cpu / n * 1e6:.1f} | {spark_cpu:.2f} | {spark_cpu / n * 1e6:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--call-rows", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3, help="measured enqueue rounds")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    with redis_url_or_embedded() as url:
        rounds, called = run(url, args.rows, args.call_rows, args.repeats)
    ratios = [arrow_ratio(results) for results in rounds]
    middle = sorted(range(len(rounds)), key=lambda i: ratios[i])[len(rounds) // 2]
    print(table([*rounds[middle], called]))
    ratio = ratios[middle]
    verdict = "PASS" if ratio >= 0.8 else "MISS"
    each = ", ".join(f"{r:.2f}x" for r in ratios)
    print(
        f"prq-enqueue-arrow vs raw-rpush, median of {len(rounds)} rounds: {ratio:.2f}x "
        f"(target >= 0.8x) {verdict}; rounds: {each}"
    )
    floors = ", ".join(
        f"{name} {rate_ratio(rounds[middle], name):.2f}x raw-rpush, "
        f"prq-enqueue-arrow {rate_ratio(rounds[middle], 'prq-enqueue-arrow', name):.2f}x it"
        for name in ("keyed-set", "scripted-set")
    )
    print(f"the key-per-row floors in that round: {floors}")
    return 0


def rate_ratio(results: list[Result], name: str, base: str = "raw-rpush") -> float:
    """Variant `name`'s rows/s over variant `base`'s, in one round."""
    of = next(r for r in results if r[0] == name)
    to = next(r for r in results if r[0] == base)
    return (of[1] / of[2]) / (to[1] / to[2])


def arrow_ratio(results: list[Result]) -> float:
    """(b)'s rows/s over (a)'s, in one round."""
    return rate_ratio(results, "prq-enqueue-arrow")


if __name__ == "__main__":
    raise SystemExit(main())
